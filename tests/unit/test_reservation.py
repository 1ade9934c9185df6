"""Advance reservations: scontrol's fields, and the windows every policy keeps (core.reservation)."""
import pytest

from hai_cluster.core.model import GpuInfo, JobView, NodeView, Snapshot
from hai_cluster.core.reservation import Reservation, ReservationError, apply, parse_reservation
from hai_cluster.core.resources import could_ever_fit, fits
from hai_cluster.core.states import JobState
from hai_cluster.scheduling.plan import Start, Wait
from hai_cluster.scheduling.registry import CONTROLLER_POLICIES, POLICIES, make_policy

NOW = 1_800_000_000.0
NODES = ("n1", "n2", "n3")


def test_scontrol_fields():
    r = parse_reservation({"ReservationName": "maint", "StartTime": "now", "Duration": "2:00:00",
                           "Nodes": "n[1-2]", "Users": "ann,bob"}, NOW, NODES)
    assert r == Reservation("maint", ("n1", "n2"), NOW, NOW + 7200, ("ann", "bob"))
    later = parse_reservation({"reservationname": "x", "starttime": "now+1hour", "endtime": "now+3hours",
                               "nodes": "ALL", "accounts": "vision"}, NOW, NODES)
    assert (later.start, later.end, later.nodes, later.accounts) == (NOW + 3600, NOW + 3 * 3600, NODES, ("vision",))
    assert parse_reservation({"Duration": "60", "Nodes": "n3", "Users": "ann"}, NOW, NODES).name == ""  # the store names it


@pytest.mark.parametrize("fields, says", [
    ({"Nodes": "n1", "Users": "ann"}, "Duration= or EndTime= is required"),
    ({"Duration": "10", "Users": "ann"}, "Nodes= is required"),
    ({"Duration": "10", "Nodes": "n9", "Users": "ann"}, "Invalid node name specified: n9"),
    ({"Duration": "10", "Nodes": "n1"}, "Users= or Accounts= is required"),
    ({"Duration": "10", "EndTime": "now+1hour", "Nodes": "n1", "Users": "ann"}, "not both"),
    ({"Duration": "UNLIMITED", "Nodes": "n1", "Users": "ann"}, "an unlimited reservation is not supported"),
    ({"StartTime": "yesterday-ish", "Duration": "10", "Nodes": "n1", "Users": "ann"}, "StartTime=yesterday-ish"),
    ({"Duration": "10", "Nodes": "n1", "Users": "ann", "Flags": "MAINT"}, "flags are not supported"),
    ({"Duration": "10", "Nodes": "n1", "Users": "a;b"}, "'a;b' is not a name"),
    ({"Duration": "10", "Nodes": "n1", "Users": "ann", "Watts": "5"}, "Invalid input: watts"),
    ({"ReservationName": "-x", "Duration": "10", "Nodes": "n1", "Users": "ann"}, "ReservationName= must be"),
])
def test_refusals(fields, says):
    with pytest.raises(ReservationError, match=says.replace("(", r"\(")):
        parse_reservation(fields, NOW, NODES)


def node(name):
    return NodeView(name=name, gpus=tuple(GpuInfo(i, f"{name}{i}", "sim", 1) for i in range(4)), cpus=16,
                    mem_mb=64000, partitions=("gpu",))


def job(id, reservation=None, time_limit=None, gpus=4, user="ann"):
    return JobView(id=id, user=user, state=JobState.PENDING, submit_time=float(id), nodes=1, gpus_per_node=gpus,
                   partition="gpu", reservation=reservation, time_limit=time_limit)


def test_a_window_takes_its_nodes_from_everyone_else_and_gives_them_to_its_jobs():
    now_open = Reservation("maint", ("n1",), NOW - 10, NOW + 3600, ("ann",))
    soon = Reservation("later", ("n2",), NOW + 600, NOW + 1200, ("ann",))
    snap, held = apply(Snapshot(NOW, (job(1), job(2, "maint"), job(3, "later"), job(4, "gone")),
                                tuple(node(n) for n in NODES)), [now_open, soon])
    assert held == {3: "Reservation", 4: "ReservationDeleted"}
    n1, n2, n3 = snap.nodes
    assert (n1.reservation, n2.free_for, n3.reservation, n3.free_for) == ("maint", 600.0, None, None)
    assert fits(job(1), n1).reason == "n1 is reserved (maint)"
    assert fits(job(2, "maint"), n1) and fits(job(2, "maint"), n3).reason == "n3 is not in reservation maint now"
    # before a window: only a job whose time limit ends before it opens
    assert fits(job(5, time_limit=300), n2) and not fits(job(6, time_limit=900), n2)
    assert fits(job(7), n2).reason == "n2 is reserved later and the job has no time limit"
    # the submission's check looks at the cluster, not at the window
    assert could_ever_fit(job(8, "maint"), (node("n1"),))


@pytest.mark.parametrize("name", sorted(set(CONTROLLER_POLICIES) | set(POLICIES)))
def test_every_policy_keeps_the_windows(name):
    r = Reservation("maint", ("n1", "n2"), NOW - 10, NOW + 3600, ("ann",))
    jobs = (job(1, time_limit=60), job(2, time_limit=60), job(3, "maint", time_limit=60))
    plan = make_policy(name).decide(Snapshot(NOW, jobs, (node("n1"), node("n2"), node("n3")), reservations=(r,)))
    starts = {a.job_id: a.placement.nodes for a in plan.actions if isinstance(a, Start)}
    assert starts[3][0] in ("n1", "n2")  # the reservation's job on its nodes
    assert [n for j, n in starts.items() if j != 3] == [("n3",)]  # one other job, on the one free node
    assert not any(isinstance(a, Wait) and a.job_id == 3 for a in plan.actions)


def test_a_job_of_a_deleted_reservation_does_not_join_a_new_one_of_the_same_name():
    new = Reservation("maint", ("n1",), NOW - 10, NOW + 3600, ("bob",))
    _, held = apply(Snapshot(NOW, (job(1, "maint", user="ann"), job(2, "maint", user="bob")), (node("n1"),)), [new])
    assert held == {1: "ReservationDeleted"}
