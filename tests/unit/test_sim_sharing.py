"""hai-sim with fractional requests: traces with GPU fractions, and card shares in the replay."""
import pytest

from hai_cluster.scheduling.registry import make_policy
from hai_cluster.sim.cluster import Cluster
from hai_cluster.sim.engine import simulate
from hai_cluster.sim.metrics import by_bucket, summarize
from hai_cluster.sim.traces import TraceError, TraceJob, load_trace


def test_traces_keep_fractions_below_one(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("job_id,submission_time,duration,num_gpu\na,0,10,0.25\nb,1,10,2\nc,2,10,0\n")
    trace = load_trace(str(path))
    assert [(j.id, j.gpus) for j in trace.jobs] == [("a", 0.25), ("b", 2)]
    assert [j.id for j, _ in trace.skipped] == ["c"]
    path.write_text("job_id,submission_time,duration,num_gpu\na,0,10,1.5\n")
    with pytest.raises(TraceError, match="not a whole number .nor a fraction below 1."):
        load_trace(str(path))


def quarter_jobs(n):
    return [TraceJob(id=str(i), submit=0.0, duration=100.0, gpus=0.25) for i in range(n)]


@pytest.mark.parametrize("policy", ["mlfq", "fifo"])
def test_four_quarters_share_one_card(policy):
    shared = simulate(make_policy(policy), quarter_jobs(8), Cluster(1, 2, gpu_sharing=True))
    # Eight quarter-card jobs on two cards: all run at once, four per card.
    assert [r.first_start for r in shared.records] == [0.0] * 8
    assert summarize(shared).makespan == 100.0
    assert max(busy for _, busy in shared.timeline) == pytest.approx(2.0)  # eight quarters: two cards' worth
    assert list(by_bucket(shared, "size")) == ["<1 GPU"]
    whole = simulate(make_policy(policy), quarter_jobs(8), Cluster(1, 2))
    # Without sharing each takes a whole card: four rounds of two.
    assert sorted({r.first_start for r in whole.records}) == [0.0, 100.0, 200.0, 300.0]
    assert summarize(whole).makespan == 400.0


def test_memory_limits_the_share_count():
    # 0.75 + 0.25 fill a card; a second 0.75 waits for the first to finish.
    jobs = [TraceJob("big", 0.0, 100.0, 0.75), TraceJob("small", 0.0, 50.0, 0.25), TraceJob("big2", 0.0, 10.0, 0.75)]
    res = simulate(make_policy("fifo"), jobs, Cluster(1, 1, gpu_sharing=True))
    starts = {r.trace_id: r.first_start for r in res.records}
    assert starts == {"big": 0.0, "small": 0.0, "big2": 100.0}
