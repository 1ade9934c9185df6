"""The controller's side of telemetry: strict batch checks, rollups per run, idle flags."""
from __future__ import annotations

import copy

import msgpack
import pytest

from hai_cluster.agent.simgpu import SimulatedTelemetryNvml
from hai_cluster.agent.telemetry import RunRef, Sampler
from hai_cluster.config import TelemetryConfig
from hai_cluster.controller.telemetry import BatchError, TelemetryHub, validate_batch
from hai_cluster.core.model import JobView, Snapshot
from hai_cluster.core.states import JobState


def gpu(index, util, power=100.0, mem=1000):
    return {"index": index, "util": util, "mem_used_mb": mem, "mem_total_mb": 81920, "power_w": power,
            "temp_c": 50, "sm_mhz": 1500, "ecc_corrected": 0, "ecc_uncorrected": 0}


def sample(t, gpus, runs=(), events=()):
    return {"t": t, "gpus": list(gpus), "runs": list(runs), "events": list(events), "cost_ms": 1.5}


def run(job_id, gpus, mem=2000, cpu=50.0, attempt=0):
    return {"job_id": job_id, "attempt": attempt, "gpus": list(gpus), "gpu_mem_mb": mem, "cpu_pct": cpu,
            "rss_mb": 100, "pids": 2}


def batch(*samples, node="n1", interval=1.0):
    return {"v": 1, "node": node, "interval": interval, "samples": list(samples)}


def hub(**kw) -> TelemetryHub:
    return TelemetryHub(TelemetryConfig(**kw))


def test_what_the_agent_sends_passes_the_check(tmp_path):
    nvml = SimulatedTelemetryNvml("n1", 8, "Sim", 81920, occupancy=lambda: {3: [1]})
    sampler = Sampler(nvml, "n1", 1.0, 10)
    sampler.open()
    s = sampler.sample([RunRef(5, 0, (3,), 1, tmp_path)])
    sampler.close()
    wire = msgpack.unpackb(msgpack.packb(sampler.batch([s, {**s, "t": s["t"] + 1}])))  # as the link carries it
    interval, samples = validate_batch(wire, "n1")
    assert interval == 1.0 and len(samples) == 2 and len(samples[0]["gpus"]) == 8
    h = hub()
    assert h.ingest("n1", wire) == 2
    assert h.run_fields((5, 0))["gpu_util"] == 90.0


GOOD = batch(sample(10.0, [gpu(0, 50)], [run(1, [0])], [{"t": 10.0, "gpu": 0, "kind": "xid", "value": 79}]))


def mutate(path, value):
    b = copy.deepcopy(GOOD)
    target = b
    for p in path[:-1]:
        target = target[p]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return b


@pytest.mark.parametrize("body, words", [
    (None, "must be a map"),
    ([1, 2], "must be a map"),
    (mutate(["v"], 2), "version"),
    (mutate(["node"], "n2"), "arrived on the link of node"),
    (mutate(["interval"], 0), "out of range"),
    (mutate(["interval"], "5"), "must be a number"),
    (mutate(["samples"], {}), "must be a list"),
    (mutate(["extra"], 1), "unknown"),
    (mutate(["samples", 0, "t"], float("nan")), "out of range"),
    (mutate(["samples", 0, "cost_ms"], KeyError), "missing"),
    (mutate(["samples", 0, "gpus", 0, "util"], 101), "out of range"),
    (mutate(["samples", 0, "gpus", 0, "util"], True), "must be a number"),
    (mutate(["samples", 0, "gpus", 0, "mem_used_mb"], 1.5), "must be an integer"),
    (mutate(["samples", 0, "gpus", 0, "index"], 64), "out of range"),
    (mutate(["samples", 0, "gpus"], [gpu(0, 1), gpu(0, 2)]), "twice"),
    (mutate(["samples", 0, "runs", 0, "job_id"], -1), "out of range"),
    (mutate(["samples", 0, "runs", 0, "gpus"], ["0"]), "must be an integer"),
    (mutate(["samples", 0, "runs", 0, "cpu_pct"], "x"), "must be a number"),
    (mutate(["samples", 0, "events", 0, "kind"], ""), "short string"),
    (mutate(["samples", 0, "events", 0, "value"], -3), "out of range"),
    (mutate(["samples"], [sample(1.0, [])] * 1001), "more than"),
])
def test_garbage_is_refused_with_a_reason(body, words):
    with pytest.raises(BatchError, match=words):
        validate_batch(body, "n1")


def test_a_bad_batch_is_dropped_whole_and_changes_nothing(caplog):
    h = hub()
    bad = batch(sample(1.0, [gpu(0, 50)], [run(1, [0])]), sample(2.0, [gpu(0, 500)], [run(1, [0])]))
    assert h.ingest("n1", bad) == 0
    assert h.dropped == 1 and h.latest("n1") is None and h.rollups == {}
    assert "telemetry batch dropped" in caplog.text
    assert h.ingest("n1", GOOD) == 1  # and the next good one is taken


def test_rollup_math_mean_max_energy_memory_cpu():
    h = hub()
    # job 1 holds GPUs 0 and 1; GPU 2 is someone else's
    h.ingest("n1", batch(
        sample(100.0, [gpu(0, 20, 100.0), gpu(1, 40, 200.0), gpu(2, 99, 500.0)], [run(1, [0, 1], mem=3000, cpu=100.0)]),
        sample(101.0, [gpu(0, 60, 300.0), gpu(1, 80, 300.0), gpu(2, 99, 500.0)], [run(1, [0, 1], mem=5000, cpu=50.0)]),
        interval=1.0))
    h.ingest("n1", batch(sample(103.0, [gpu(0, 0, 100.0), gpu(1, 0, 100.0)], [run(1, [0, 1], mem=1000, cpu=None)]),
                         interval=1.0))
    (row,) = h.dirty_rows()
    assert row["gpu_util_mean"] == round((20 + 40 + 60 + 80 + 0 + 0) / 6, 2)  # stored to 0.01 %
    assert row["gpu_util_max"] == 80
    assert row["gpu_mem_max_mb"] == 5000
    # the first sample counts one interval; then 1 s; then 2 s (under 3 intervals: not a gap)
    assert row["energy_j"] == pytest.approx(300 * 1 + 600 * 1 + 200 * 2)
    assert row["cpu_mean"] == 75.0 and row["telemetry_samples"] == 3
    assert h.dirty_rows() == []  # nothing new since


def test_gaps_duplicates_and_late_samples():
    h = hub()
    h.ingest("n1", batch(sample(100.0, [gpu(0, 50, 100.0)], [run(1, [0])]), interval=1.0))
    h.ingest("n1", batch(sample(100.0, [gpu(0, 50, 100.0)], [run(1, [0])]), interval=1.0))  # sent again
    h.ingest("n1", batch(sample(200.0, [gpu(0, 50, 100.0)], [run(1, [0])]), interval=1.0))  # after a gap
    r = h.rollups[(1, 0)]
    assert r.samples == 2 and r.energy_j == pytest.approx(200.0)  # the gap counts one interval, not 100 s
    final = h.finish((1, 0))
    assert final["telemetry_samples"] == 2
    h.ingest("n1", batch(sample(201.0, [gpu(0, 50, 100.0)], [run(1, [0])]), interval=1.0))
    assert (1, 0) not in h.rollups and h.dirty_rows() == []  # the run ended: a late sample opens nothing
    assert h.finish((2, 0)) is None  # a run without samples has no rollup


def test_multi_node_runs_add_up():
    h = hub()
    for node, util in (("n1", 30), ("n2", 90)):
        h.ingest(node, batch(sample(10.0, [gpu(0, util, 200.0)], [run(1, [0], mem=100 if node == "n1" else 700)]),
                             node=node, interval=2.0))
    row = h.finish((1, 0))
    assert row["gpu_util_mean"] == 60.0 and row["gpu_util_max"] == 90
    assert row["energy_j"] == 800.0 and row["gpu_mem_max_mb"] == 700


def test_memory_falls_back_to_the_gpus_own_when_nvml_lists_no_process():
    h = hub()
    h.ingest("n1", batch(sample(1.0, [gpu(0, 10, mem=1234), gpu(1, 10, mem=1000)], [run(1, [0, 1], mem=0)])))
    assert h.finish((1, 0))["gpu_mem_max_mb"] == 2234


def test_idle_flag_after_the_configured_time_under_the_threshold():
    h = hub(idle_util_below=10.0, idle_after=30.0)
    t = 1000.0
    for i in range(4):  # busy, then 35 s under 10 %
        h.ingest("n1", batch(sample(t + i * 5, [gpu(0, 50), gpu(1, 50)], [run(1, [0, 1])]), interval=5.0))
    for i in range(8):
        h.ingest("n1", batch(sample(t + 20 + i * 5, [gpu(0, 3), gpu(1, 9)], [run(1, [0, 1])]), interval=5.0))
        assert h.is_idle((1, 0)) == (i * 5 >= 30)
    assert h.idle_jobs() == {1}
    snap = Snapshot(now=t, nodes=(), jobs=(
        JobView(id=1, user="u", state=JobState.RUNNING, submit_time=0, nodes=1, gpus_per_node=2),
        JobView(id=2, user="u", state=JobState.RUNNING, submit_time=0, nodes=1, gpus_per_node=2)))
    assert [j.idle for j in h.mark_idle(snap).jobs] == [True, False]
    # one GPU busy again: no longer idle
    h.ingest("n1", batch(sample(t + 100, [gpu(0, 3), gpu(1, 60)], [run(1, [0, 1])]), interval=5.0))
    assert not h.is_idle((1, 0)) and h.run_fields((1, 0))["idle"] is False


def test_idle_detection_is_off_by_default():
    h = hub()
    for i in range(100):
        h.ingest("n1", batch(sample(i * 60.0, [gpu(0, 0)], [run(1, [0])]), interval=60.0))
    assert h.idle_jobs() == set()


def test_history_of_a_run_and_events():
    h = hub(history=3)
    for i in range(5):
        h.ingest("n1", batch(sample(float(i), [gpu(0, i * 10, 50.0)], [run(1, [0])],
                                    [{"t": float(i), "gpu": 0, "kind": "xid", "value": 13}] if i == 4 else [])))
    points = h.history((1, 0))
    assert [p["t"] for p in points] == [2.0, 3.0, 4.0]  # bounded per node
    assert [p["gpu_util"] for p in points] == [20.0, 30.0, 40.0]
    assert [(e["node"], e["kind"], e["value"]) for e in h.events] == [("n1", "xid", 13)]


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                     st.text(max_size=5), st.binary(max_size=5))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                                max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(body=_values)
def test_random_bodies_never_raise(body):
    h = hub()
    assert h.ingest("n1", body) == 0


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


_ALL_PATHS = [p for p in _paths(GOOD) if p]


@settings(max_examples=300, deadline=None)
@given(path=st.sampled_from(_ALL_PATHS), value=_values)
def test_one_field_changed_is_taken_whole_or_dropped_whole(path, value):
    body = mutate(list(path), value)
    try:
        validate_batch(copy.deepcopy(body), "n1")
        valid = True
    except BatchError:
        valid = False
    h = hub()
    taken = h.ingest("n1", body)
    assert h.dropped == (0 if valid else 1)
    if not valid:
        assert taken == 0 and h.latest("n1") is None and h.rollups == {}
