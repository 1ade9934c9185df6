from hai_cluster.core.outcome import combine, job_state_after, rank_state
from hai_cluster.core.states import JobState, can_transition, parse_state

import pytest


def r(code=0, sig=None, reason=None, message=None):
    return {"exit_code": code, "signal": sig, "reason": reason, "message": message}


def test_rank_states():
    assert rank_state(r(0)) == JobState.COMPLETED
    assert rank_state(r(3)) == JobState.FAILED
    assert rank_state(r(None, 9)) == JobState.FAILED
    assert rank_state(r(None, 15, "cancel")) == JobState.CANCELLED
    assert rank_state(r(None, 9, "timeout")) == JobState.TIMEOUT
    assert rank_state(r(None, None, "lost")) == JobState.NODE_FAIL


def test_combine_ranks():
    assert combine([r(0), r(0)], None).state == JobState.COMPLETED
    out = combine([r(0), r(7, message="boom")], None)
    assert (out.state, out.exit_code) == (JobState.FAILED, 7)
    # A peer stopped by the controller after rank 1 failed: the run shows the failure.
    out = combine([r(None, 15, "cancel"), r(2)], None)
    assert (out.state, out.exit_code) == (JobState.FAILED, 2)
    assert combine([r(None, 15, "cancel"), r(0)], "cancel").state == JobState.CANCELLED
    assert combine([r(0), r(None, None, "lost")], None).state == JobState.NODE_FAIL


def test_requeue_rules():
    assert job_state_after(JobState.PREEMPTED, False) == JobState.PENDING
    assert job_state_after(JobState.NODE_FAIL, True) == JobState.PENDING
    assert job_state_after(JobState.NODE_FAIL, False) == JobState.NODE_FAIL
    assert job_state_after(JobState.FAILED, True) == JobState.FAILED


def test_states():
    assert parse_state("pd") == JobState.PENDING and parse_state("running") == JobState.RUNNING
    with pytest.raises(ValueError, match="invalid job state"):
        parse_state("sleeping")
    assert can_transition(JobState.PENDING, JobState.RUNNING)
    assert not can_transition(JobState.COMPLETED, JobState.RUNNING)
