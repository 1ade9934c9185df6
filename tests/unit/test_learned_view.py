"""What `hcontrol show scheduler` reads of the learned state (scheduling/learned.py): the keys with
the most ended jobs and their quantiles, and a job's standing in the order that runs."""
from hai_cluster.core.model import JobView
from hai_cluster.core.sizemodel import FinishedJob, SizeModel, rebuild
from hai_cluster.core.states import JobState
from hai_cluster.scheduling.learned import key_summaries, standing
from hai_cluster.scheduling.mlfq import MlfqConfig


def job(**kw) -> JobView:
    base = dict(id=7, user="alice", partition="gpu", state=JobState.PENDING, nodes=1, gpus_per_node=2,
                submit_time=0.0, attained_gpu_seconds=5000.0)
    return JobView(**{**base, **kw})


def test_keys_by_what_stands_behind_them_with_their_quantiles():
    model = rebuild([FinishedJob(2, 600.0, user="alice")] * 30 + [FinishedJob(8, 90000.0)] * 5)
    keys = key_summaries(model)
    assert [k.key for k in keys[:3]] == ["*", "g2", "g8"]  # the root, then GPU counts by samples
    g2 = next(k for k in keys if k.key == "g2")
    assert round(g2.samples) == 30 and 400 < g2.median_s < 900 and g2.p90_s >= g2.median_s
    assert any(k.key == "g2/u:alice" for k in keys)
    assert key_summaries(model, most=2) == keys[:2]
    assert key_summaries(SizeModel()) == []


def test_a_jobs_standing_in_each_order():
    model = rebuild([FinishedJob(2, 600.0)] * 30)
    las = standing(MlfqConfig(order="las"), model, job(), now=100.0)
    assert las["order"] == "las" and las["level"] == 1
    assert las["text"].startswith("level 1: 5000 GPU-seconds attained (below 36000; thresholds 3600, 36000)")
    assert "from 30 finished jobs of g2" in las["learned"]["text"]  # what the model says, whichever order
    gittins = standing(MlfqConfig(order="gittins"), model, job(), now=100.0)
    assert gittins["order"] == "gittins" and gittins["text"] == gittins["learned"]["text"]
    assert gittins["text"].startswith(f"level {gittins['level']}: Gittins rank")
