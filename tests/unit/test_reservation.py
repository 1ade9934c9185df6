"""Advance reservations: scontrol's fields, and the windows every policy keeps (core.reservation)."""
import pytest

from hai_cluster.core.model import GpuInfo, JobView, NodeView, Snapshot
from hai_cluster.core.reservation import (Reservation, ReservationError, apply, busy_nodes, parse_reservation,
                                         updated_flags)
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
    ({"Duration": "10", "Nodes": "n1", "Users": "ann", "Flags": "MAINT,BOGUS"},
     "Error parsing flags MAINT,BOGUS.  No reservation created."),
    ({"Duration": "10", "Nodes": "n1", "Users": "ann", "Flags": "hourly"},
     "Flags=HOURLY: Slurm's reservation flag is not supported by this cluster"),
    ({"Duration": "25:00:00", "Nodes": "n1", "Users": "ann", "Flags": "DAILY"}, "a DAILY reservation lasts at most 24 hours"),
    ({"Duration": "10", "Nodes": "n1", "Users": "ann", "Flags": "WEEKLY,daily"}, "daily or weekly, not both"),
    ({"Duration": "10", "Nodes": "n1", "Users": "ann", "Flags": "FLEX"}, "Flags=FLEX: Slurm's"),
    ({"Duration": "10", "Nodes": "n1", "Flags": "MAINT"}, "Users= or Accounts= is required"),  # as slurmctld
    ({"Duration": "10", "Nodes": "n1", "Users": "a;b"}, "'a;b' is not a name"),
    ({"Duration": "10", "Nodes": "n1", "Users": "ann", "Watts": "5"}, "Invalid input: watts"),
    ({"ReservationName": "-x", "Duration": "10", "Nodes": "n1", "Users": "ann"}, "ReservationName= must be"),
])
def test_refusals(fields, says):
    with pytest.raises(ReservationError, match=says.replace("(", r"\(")):
        parse_reservation(fields, NOW, NODES)


def test_flags_are_read_in_any_case_and_kept_in_slurms_order():
    r = parse_reservation({"Duration": "10", "Nodes": "ALL", "Users": "ann", "Flags": "ignore_jobs,Overlap,MAINT"},
                          NOW, NODES)
    assert (r.flags, r.all_nodes) == (("MAINT", "OVERLAP", "IGNORE_JOBS"), True)
    assert parse_reservation({"Duration": "10", "Nodes": "n1", "Users": "ann"}, NOW, NODES).flags == ()


def test_maint_and_overlap_may_share_nodes_and_time_either_way_round():
    plain = Reservation("a", ("n1",), NOW, NOW + 60, ("ann",))
    other = Reservation("b", ("n1", "n2"), NOW + 30, NOW + 90, ("bob",))
    assert plain.conflicts(other)
    for flag in ("MAINT", "OVERLAP"):
        special = Reservation("m", ("n1",), NOW, NOW + 60, ("ann",), flags=(flag,))
        assert not special.conflicts(plain) and not plain.conflicts(special)
    assert not Reservation("a", ("n3",), NOW, NOW + 60, ("ann",)).conflicts(other)


def test_running_jobs_make_nodes_busy_unless_they_end_before_the_window():
    r = Reservation("w", ("n1", "n2"), NOW + 600, NOW + 1200, ("ann",))
    assert busy_nodes(r, [(("n1",), None), (("n3",), None)]) == ["n1"]  # no limit: it may run on
    assert busy_nodes(r, [(("n1", "n2"), NOW + 300)]) == []  # its limit ends before the window
    assert busy_nodes(r, [(("n2",), NOW + 900)]) == ["n2"]


def test_overlapping_windows_on_a_node_take_the_jobs_of_either_and_no_other():
    maint = Reservation("maint", ("n1", "n2"), NOW - 10, NOW + 3600, ("ann",), flags=("MAINT",))
    team = Reservation("team", ("n1",), NOW - 10, NOW + 3600, ("bob",))
    snap, held = apply(Snapshot(NOW, (job(1, "maint"), job(2, "team", user="bob"), job(3)),
                                tuple(node(n) for n in NODES)), [maint, team])
    n1, n2, n3 = snap.nodes
    assert held == {} and n1.reservation == "maint,team" and n2.reservation == "maint"
    assert fits(job(1, "maint"), n1) and fits(job(2, "team", user="bob"), n1)
    assert fits(job(3), n1).reason == "n1 is reserved (maint,team)"
    assert fits(job(2, "team", user="bob"), n2).reason == "n2 is reserved (maint)"


@pytest.mark.parametrize("name", sorted(set(CONTROLLER_POLICIES) | set(POLICIES)))
def test_every_policy_keeps_a_maint_window_shared_with_another(name):
    maint = Reservation("maint", ("n1", "n2"), NOW - 10, NOW + 3600, ("ann",), flags=("MAINT", "IGNORE_JOBS"))
    team = Reservation("team", ("n2",), NOW - 10, NOW + 3600, ("bob",), flags=("OVERLAP",))
    jobs = (job(1, time_limit=60), job(2, "team", user="bob", time_limit=60), job(3, time_limit=60))
    plan = make_policy(name).decide(Snapshot(NOW, jobs, tuple(node(n) for n in NODES), reservations=(maint, team)))
    starts = {a.job_id: a.placement.nodes for a in plan.actions if isinstance(a, Start)}
    assert starts.get(2) == ("n2",)  # team's job on the node both windows hold
    assert [n for j, n in starts.items() if j != 2] == [("n3",)]  # one other job, on the one free node


def test_a_daily_window_comes_back_every_day_and_the_core_reads_the_next_one():
    r = parse_reservation({"StartTime": "now+1hour", "Duration": "2:00:00", "Nodes": "n1", "Users": "ann",
                           "Flags": "daily,maint"}, NOW, NODES)
    assert (r.flags, r.period, r.ended(NOW + 10 * 86400)) == (("MAINT", "DAILY"), 86400, False)
    day = NOW + 86400
    assert r.window(NOW) == (NOW + 3600, NOW + 3 * 3600) and not r.active(NOW)
    assert r.window(day + 4 * 3600) == (day + 86400 + 3600, day + 86400 + 3 * 3600)  # after today's: tomorrow's
    assert r.active(day + 2 * 3600) and r.window(day + 2 * 3600) == (day + 3600, day + 3 * 3600)
    # a node of it takes, a day later, only jobs that end before the next window opens
    snap, _ = apply(Snapshot(day + 4 * 3600, (job(1),), tuple(node(n) for n in NODES)), [r])
    assert snap.nodes[0].free_for == 86400 - 3 * 3600
    assert fits(job(2, time_limit=3600), snap.nodes[0]) and not fits(job(3), snap.nodes[0])
    snap, _ = apply(Snapshot(day + 2 * 3600, (), tuple(node(n) for n in NODES)), [r])
    assert snap.nodes[0].reservation == r.name


def test_repeating_windows_overlap_any_occurrence_of_another():
    daily = Reservation("d", ("n1",), NOW, NOW + 3600, ("ann",), flags=("DAILY",))
    assert daily.overlaps(Reservation("o", ("n1",), NOW + 5 * 86400 + 600, NOW + 5 * 86400 + 700))
    assert not daily.overlaps(Reservation("o", ("n1",), NOW + 5 * 86400 + 3600, NOW + 6 * 86400))
    assert not daily.overlaps(Reservation("o", ("n2",), NOW, NOW + 86400 * 9))
    weekly = Reservation("w", ("n1",), NOW + 3 * 86400 + 1800, NOW + 3 * 86400 + 5400, ("bob",), flags=("WEEKLY",))
    assert weekly.overlaps(daily) and daily.overlaps(weekly)  # a day of the week, half an hour in
    later = Reservation("w", ("n1",), NOW + 3 * 86400 + 7200, NOW + 3 * 86400 + 9000, ("bob",), flags=("WEEKLY",))
    assert not later.overlaps(daily) and not daily.overlaps(later)
    assert not Reservation("x", ("n1",), NOW - 7200, NOW - 3600).overlaps(daily)  # before its first


def test_update_adds_flags_and_minus_takes_them_off_as_scontrol_update():
    r = Reservation("u", ("n1",), NOW, NOW + 3600, ("ann",), flags=("MAINT",))
    assert updated_flags(r, "", "overlap").flags == ("MAINT", "OVERLAP")  # Flags= adds, as Slurm 22.05's
    assert updated_flags(r, "+", "IGNORE_JOBS,daily").flags == ("MAINT", "IGNORE_JOBS", "DAILY")
    assert updated_flags(r, "-", "MAINT").flags == ()
    with pytest.raises(ReservationError, match=r"Error parsing flags BOGUS\.  No reservation update\."):
        updated_flags(r, "", "BOGUS")
    with pytest.raises(ReservationError, match="Flags=FLEX: Slurm's reservation flag .* No reservation update"):
        updated_flags(r, "", "FLEX")
    with pytest.raises(ReservationError, match="daily or weekly, not both"):
        updated_flags(updated_flags(r, "", "DAILY"), "", "WEEKLY")


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
