"""The learned size model (core/sizemodel.py): bounded, pure, rebuilt identically from the same
finished jobs, and a plain-data wire form."""
import json
import math

import pytest

from hai_cluster.core.sizemodel import (EDGES, LOWER, NBINS, FinishedJob, SizeModel, bin_of, observe, rebuild)


def test_bins_cover_every_service_time_once():
    assert bin_of(0) == 0 and bin_of(9.99) == 0 and bin_of(10.0) == 1 and bin_of(1e12) == NBINS - 1
    for i, edge in enumerate(EDGES):
        assert bin_of(edge) == i + 1 and bin_of(edge * (1 - 1e-9)) == i
        assert LOWER[i + 1] == edge


def test_observe_is_pure_and_rebuild_is_a_function_of_the_ordered_facts():
    facts = [FinishedJob(g, d, user=u, name=n) for g, d, u, n in
             [(1, 100, "a", "x"), (8, 5000, "b", ""), (1, 120, "a", "x"), (2, 30, "", "y")] * 5]
    empty = SizeModel()
    m = observe(empty, facts)
    assert empty.empty and empty.seen == 0  # the input is not changed
    assert m.seen == 20 and rebuild(facts) == m
    assert observe(observe(empty, facts[:7]), facts[7:]) == m  # fed in pieces or at once
    assert set(m.hists) == {"*", "g1", "g1/u:a", "g1/n:x", "g8", "g8/u:b", "g2", "g2/n:y"}
    # jobs that never ran say nothing
    assert observe(m, [FinishedJob(1, 0.0), FinishedJob(0, 50.0), FinishedJob(1, math.inf)]) is m


def test_state_is_bounded_in_keys_and_weight():
    m = SizeModel(memory=50.0, max_keys=16)
    for i in range(2000):
        m = observe(m, [FinishedJob(1 + i % 3, 60.0 + i, user=f"u{i}", name=f"n{i % 7}")])
    assert len(m.hists) <= 16
    assert {"*", "g1", "g2", "g3"} <= set(m.hists)  # the root and GPU-count keys are never evicted
    assert all(h.total <= 50.0 + 1e-9 for h in m.hists.values())  # decay caps a key's weight at `memory`
    assert all(len(h.weights) == NBINS for h in m.hists.values())


def test_wire_round_trip_is_exact_and_plain_json():
    m = rebuild([FinishedJob(4, 3600.0 * k, user="u", name="bert") for k in (1, 2, 3)])
    wire = json.loads(json.dumps(m.to_wire()))
    assert SizeModel.from_wire(wire) == m
    with pytest.raises(ValueError):
        SizeModel.from_wire({**wire, "version": 99})
    bad = json.loads(json.dumps(wire))
    bad["hists"]["*"]["w"] = [1.0]
    with pytest.raises(ValueError):
        SizeModel.from_wire(bad)


def test_distribution_blends_specific_keys_with_their_parents():
    m = rebuild([FinishedJob(1, 100.0)] * 50 + [FinishedJob(1, 100000.0, name="long")] * 3)
    short = m.distribution(1)
    named = m.distribution(1, name="long")
    assert short.source == "g1" and named.source == "g1/n:long" and named.samples == pytest.approx(3, rel=0.01)
    b_short, b_long = bin_of(100.0), bin_of(100000.0)
    assert short.probs[b_short] > 0.8 and named.probs[b_long] > short.probs[b_long]
    # few samples under a name: the parent's shape still shows through (shrinkage)
    assert named.probs[b_short] > 0.1
    assert SizeModel().distribution(8).source == "prior"
    assert sum(SizeModel().distribution(8).probs) == pytest.approx(1.0)
