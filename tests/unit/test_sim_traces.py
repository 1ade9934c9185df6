"""Trace formats are recognised by their header; anything else is one clear error."""
import pytest

from hai_cluster.sim.cluster import Cluster, parse_cluster
from hai_cluster.sim.traces import TraceError, load_trace, prepare


def write(tmp_path, text, name="t.csv"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_elasticflow(tmp_path):
    tr = load_trace(write(tmp_path, "job_id,submission_time,duration,num_gpu\na,10,100,1\nb,5,60,8\n"))
    assert tr.format == "elasticflow"
    assert [(j.id, j.submit, j.duration, j.gpus) for j in tr.jobs] == [("b", 5, 60, 8), ("a", 10, 100, 1)]


def test_tiresias(tmp_path):
    tr = load_trace(write(tmp_path, "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
                                    "0,2,0,606,vgg19,164,30\n1,8,30,133,vgg11,147,23\n"))
    assert tr.format == "tiresias"
    assert [(j.id, j.submit, j.duration, j.gpus) for j in tr.jobs] == [("0", 0, 164, 2), ("1", 30, 147, 8)]


PHILLY = ("timestamp,duration,num_gpus,gpu_time,cluster\n"
          "2017-10-03 10:00:30,100,4,400,vc1\n"
          "2017-10-03 10:00:00,50,1,50,vc2\n"
          "2017-10-03 10:01:00,10,2,20,vc1\n")


def test_philly_datetimes_unsorted_and_virtual_clusters(tmp_path):
    path = write(tmp_path, PHILLY)
    tr = load_trace(path)
    assert tr.format == "philly"
    assert [(j.submit, j.duration, j.gpus) for j in tr.jobs] == [(0, 50, 1), (30, 100, 4), (60, 10, 2)]
    vc1 = load_trace(path, vc="vc1")
    assert [(j.submit, j.gpus) for j in vc1.jobs] == [(0, 4), (30, 2)]  # relative to the VC's first job
    with pytest.raises(TraceError, match=r"no jobs in virtual cluster 'nope' \(it has: vc1, vc2\)"):
        load_trace(path, vc="nope")


def test_canonical_with_user_and_priority(tmp_path):
    tr = load_trace(write(tmp_path, "submit_time,duration,gpus,user,priority\n0,10,1,alice,high\n1,5,2,,\n"))
    assert tr.format == "canonical"
    assert [(j.user, j.priority) for j in tr.jobs] == [("alice", "high"), ("user", "normal")]
    assert [j.id for j in tr.jobs] == ["2", "3"]  # no id column: the line number
    assert load_trace(write(tmp_path, "submit_time,duration,gpus\n0,1,1\n", "min.csv")).format == "canonical"


@pytest.mark.parametrize("text, message", [
    ("a,b,c\n1,2,3\n", "unrecognised trace header 'a,b,c'; expected one of: tiresias"),
    ("", "empty trace"),
    ("submit_time,duration,gpus\n0,ten,1\n", "line 2: duration 'ten' is not a number"),
    ("submit_time,duration,gpus\n0,10,1.5\n", "line 2: gpus '1.5' is not a whole number"),
    ("submit_time,duration,gpus\n0,-1,1\n", "line 2: negative duration"),
    ("submit_time,duration,gpus\n0,10\n", "line 2: 2 fields, the header has 3"),
    ("submit_time,duration,gpus,priority\n0,10,1,vip\n", "priority 'vip' is not one of"),
    ("timestamp,duration,num_gpus,gpu_time,cluster\nyesterday,1,1,1,a\n", "neither a datetime nor epoch"),
])
def test_bad_traces_are_one_clear_error(tmp_path, text, message):
    with pytest.raises(TraceError) as exc:
        load_trace(write(tmp_path, text))
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_missing_file_and_vc_on_other_formats(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        load_trace(str(tmp_path / "nope.csv"))
    with pytest.raises(TraceError, match="is a canonical trace"):
        load_trace(write(tmp_path, "submit_time,duration,gpus\n0,1,1\n"), vc="x")


def test_jobs_without_gpus_are_set_aside_with_a_reason(tmp_path):
    tr = load_trace(write(tmp_path, "submit_time,duration,gpus\n0,1,0\n1,1,1\n"))
    assert len(tr.jobs) == 1 and [(j.id, why) for j, why in tr.skipped] == [("2", "asks for no GPUs")]


def test_prepare_limit_load_scale_and_seeded_ties(tmp_path):
    tr = load_trace(write(tmp_path, "submit_time,duration,gpus\n" + "".join(f"{100 + 10 * (i // 4)},1,1\n"
                                                                          for i in range(12))))
    assert [j.submit for j in prepare(tr.jobs, limit=5)] == [100, 100, 100, 100, 110]
    assert [j.submit for j in prepare(tr.jobs, load_scale=2)][::4] == [100, 105, 110]
    plain = [j.id for j in prepare(tr.jobs)]
    assert plain == sorted(plain, key=int)  # no seed: file order
    a, b = ([j.id for j in prepare(tr.jobs, seed=7)] for _ in range(2))
    assert a == b and a != plain and sorted(a) == sorted(plain)
    assert [j.submit for j in prepare(tr.jobs, seed=7)] == [j.submit for j in prepare(tr.jobs)]  # only ties move
    with pytest.raises(ValueError, match="positive"):
        prepare(tr.jobs, load_scale=0)


def test_cluster_strings():
    assert parse_cluster("16x8") == Cluster(16, 8) and parse_cluster(" 2X4 ").total_gpus == 8
    for bad in ("16", "0x8", "8x0", "axb", "16x8x2", ""):
        with pytest.raises(ValueError, match="expected NODESxGPUS"):
            parse_cluster(bad)
