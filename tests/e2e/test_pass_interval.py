"""controller.min_pass_interval: passes that events trigger keep at least that far apart (a burst
shares passes). Only a lower bound is asserted: the machine's load can only make gaps longer."""
from __future__ import annotations

import pytest

from .harness import start_local_cluster

INTERVAL = 3.0


@pytest.fixture(scope="module")
def cluster():
    c = start_local_cluster(tick=60.0, controller_toml=f"min_pass_interval = {INTERVAL}")
    yield c
    c.close()


def test_a_pass_an_event_asks_for_waits_out_the_interval_since_the_last_one(cluster):
    first = cluster.submit("-o", "/dev/null", "--wrap", "sleep 1000")
    a = cluster.wait_state(first, "RUNNING", timeout=60)
    second = cluster.submit("-o", "/dev/null", "--wrap", "sleep 1000")  # right after the pass that started the first
    b = cluster.wait_state(second, "RUNNING", timeout=60)
    # The second pass began INTERVAL after the first began, which was before the first job's start.
    assert b["start_time"] - a["start_time"] >= INTERVAL - 0.5
    for j in (first, second):
        cluster.cli("hcancel", str(j))
        cluster.wait_state(j, "CANCELLED")
