"""The cyclic collector is paused for a scheduling pass, and only for it; a pass leaves no
reference cycles behind (its garbage goes by reference counting alone)."""
import gc

import pytest

from hai_cluster.core.model import Snapshot
from hai_cluster.scheduling.collector import collector_paused
from hai_cluster.scheduling.limits import with_limits
from hai_cluster.scheduling.mlfq import MlfqPolicy
from hai_cluster.scheduling.plan import Plan
from tests.unit.test_victim_index import CONFIGS, random_snapshot


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_paused_inside_and_on_again_after(collector_on):
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_on_again_after_an_error(collector_on):
    with pytest.raises(RuntimeError):
        with collector_paused():
            raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_collector_the_caller_turned_off_stays_off(collector_on):
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_every_policy_decides_with_the_collector_paused(collector_on):
    seen = []

    class Probe:
        name = "probe"

        def decide(self, snapshot):
            seen.append(gc.isenabled())
            return Plan()

    assert with_limits(Probe()).decide(Snapshot(now=0.0, jobs=(), nodes=())) == Plan()
    assert seen == [False] and gc.isenabled()


def test_an_mlfq_pass_leaves_no_cycles_to_collect(collector_on):
    snaps = [random_snapshot(seed) for seed in range(20)]
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        plans = [MlfqPolicy(cfg).decide(s) for cfg in CONFIGS for s in snaps]
        gc.collect()
        garbage = list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert any(p.preempts for p in plans)  # the victim index was used
    assert garbage == []
