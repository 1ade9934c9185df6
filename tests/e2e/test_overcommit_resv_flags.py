"""-O/--overcommit and reservation Flags= through the Slurm-named commands on a real (local)
cluster. Expected values are Slurm 22.05's, from the same commands run on the Slurm peer
(../shared/peers/slurm): `sbatch -O -n 64 -N 1` holds one CPU (NumCPUs=1, SLURM_CPUS_ON_NODE=1,
SLURM_OVERCOMMIT=1) and its sruns run all 64 tasks; `Flags=MAINT,IGNORE_JOBS` on ALL nodes
prints `Flags=MAINT,IGNORE_JOBS,SPEC_NODES,ALL_NODES`."""
from __future__ import annotations

import re

import pytest

from .harness import TEST_USER, start_local_cluster, user_dir

NODE = "local1"  # as many CPUs as this machine: fewer than 12


@pytest.fixture(scope="module")
def cluster():
    c = start_local_cluster(node=NODE)
    yield c
    c.close()


def test_overcommit_runs_more_tasks_than_cpus_on_one_node(cluster):
    home = user_dir(cluster.workdir, TEST_USER)
    (home / "oc.sh").write_text(
        "#!/bin/bash\n#SBATCH -O\n#SBATCH -n 16 -N 1\n#SBATCH -o oc.out\n"
        "env | grep -E '^SLURM_(OVERCOMMIT|CPUS_ON_NODE|JOB_CPUS_PER_NODE|TASKS_PER_NODE|NTASKS)=' | sort\n"
        "srun bash -c 'echo task $SLURM_PROCID $SLURM_OVERCOMMIT' | sort -n -k2\n"
        "srun -n 20 true && echo twenty-ok\n")
    j = int(cluster.cli("sbatch", "--parsable", "oc.sh").stdout)
    shown = cluster.cli("scontrol", "show", "job", str(j)).stdout
    assert re.search(r"NumCPUs=1 NumTasks=16 CPUsPerTask=1 ", shown), shown
    assert cluster.cli("squeue", "-h", "-j", str(j), "-o", "%C %c").stdout == "1 1\n"
    assert cluster.wait_state(j, "COMPLETED", "FAILED", timeout=120)["state"] == "COMPLETED"
    assert cluster.cli("sacct", "-X", "-n", "-P", "-j", str(j), "-o", "JobID,AllocCPUS,NTasks").stdout.startswith(
        f"{j}|1|")  # the one CPU it held (NumCPUs=1; the peer has no accounting store to ask)
    out = (home / "oc.out").read_text().splitlines()
    assert out[:5] == ["SLURM_CPUS_ON_NODE=1", "SLURM_JOB_CPUS_PER_NODE=1", "SLURM_NTASKS=16", "SLURM_OVERCOMMIT=1",
                       "SLURM_TASKS_PER_NODE=16"]  # as the peer's sbatch -O -n 64 -N 1 prints them
    assert out[5:21] == [f"task {i} 1" for i in range(16)]
    assert out[21:] == ["twenty-ok"]  # SLURM_OVERCOMMIT is the job's sruns' -O: past 16 too
    # without -O the 16 tasks need 16 CPUs, which no node has
    refused = cluster.cli("sbatch", "-n", "16", "-N", "1", "--wrap", "true", check=False)
    assert refused.returncode == 1 and "Requested node configuration is not available" in refused.stderr, \
        refused.stderr


def test_overcommit_for_srun_and_salloc_outside_a_job(cluster):
    res = cluster.cli("srun", "-O", "-n", "12", "bash", "-c", "echo $SLURM_OVERCOMMIT $SLURM_CPUS_ON_NODE")
    assert res.stdout.splitlines() == ["1 1"] * 12, res
    res = cluster.cli("salloc", "-O", "-n", "12", "-Q", "bash", "-c",
                      "echo $SLURM_OVERCOMMIT $SLURM_JOB_CPUS_PER_NODE; srun hostname | wc -l")
    assert res.stdout.splitlines() == ["1 1", "12"], res
    env = cluster.cli("srun", "-n", "12", "true", env={"SLURM_OVERCOMMIT": "1"}, check=False)
    assert env.returncode == 0, env.stderr  # srun reads SLURM_OVERCOMMIT as its -O


def _create(cluster, *fields, check=True):
    return cluster.cli("scontrol", "create", "reservation", *fields, user="root", check=check)


def test_reservation_flags_as_slurm_prints_and_checks_them(cluster):
    busy = int(cluster.cli("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 300").stdout)
    cluster.wait_state(busy, "RUNNING", timeout=60)
    base = ("StartTime=now", "Duration=10:00", f"Users={TEST_USER}")
    outside = None
    try:
        res = _create(cluster, "ReservationName=plain", *base, f"Nodes={NODE}", check=False)
        assert res.returncode == 1 and res.stderr.startswith(
            "scontrol: error: Error creating the reservation: Requested nodes are busy"), res.stderr
        assert _create(cluster, "ReservationName=mnt", *base, "Nodes=ALL",
                       "Flags=maint,ignore_jobs").stdout == "Reservation created: mnt\n"
        lines = cluster.cli("scontrol", "show", "reservation", "mnt").stdout.splitlines()
        assert re.fullmatch(rf"   Nodes={NODE} NodeCnt=1 CoreCnt=\d+ Features=\(null\) PartitionName=\(null\) "
                            r"Flags=MAINT,IGNORE_JOBS,SPEC_NODES,ALL_NODES", lines[1]), lines
        # sinfo marks a busy node in an open MAINT window with `$` (an idle one is `maint`), as Slurm's
        assert cluster.cli("sinfo", "-h", "-N", "-o", "%N %t %T").stdout == f"{NODE} mix$ mixed$\n"
        # a MAINT window shares its nodes: even a reservation without flags may overlap it (as slurmctld)
        assert _create(cluster, "ReservationName=ovl", *base, f"Nodes={NODE}", "Flags=OVERLAP,IGNORE_JOBS").stdout \
            == "Reservation created: ovl\n"
        assert "Flags=OVERLAP,IGNORE_JOBS,SPEC_NODES\n" in cluster.cli("scontrol", "show", "reservation").stdout
        for flags, says in (("BOGUS", "scontrol: error: Error parsing flags BOGUS.  No reservation created.\n"),
                            ("MAINT,HOURLY", "scontrol: error: Flags=HOURLY: Slurm's reservation flag is not supported "
                                            "by this cluster (docs/SLURM.md; supported: MAINT, OVERLAP, "
                                            "IGNORE_JOBS, DAILY, WEEKLY).  No reservation created.\n")):
            res = _create(cluster, "ReservationName=bad", *base, f"Nodes={NODE}", f"Flags={flags}", check=False)
            assert (res.returncode, res.stderr) == (1, says)
        # a daily window: its next occurrences are checked as the peer's slurmctld checks them
        assert _create(cluster, "ReservationName=day", "StartTime=now+1hour", "Duration=10", f"Users={TEST_USER}",
                       f"Nodes={NODE}", "Flags=daily,IGNORE_JOBS").stdout == "Reservation created: day\n"
        assert re.search(r"Flags=IGNORE_JOBS,DAILY,SPEC_NODES\n.*State=INACTIVE", cluster.cli(
            "scontrol", "show", "reservation", "day").stdout, re.S)
        for start, says in (("now+25hours", "overlaps with another reservation (day)"), ("now+3days", None)):
            res = _create(cluster, "ReservationName=once", f"StartTime={start}", "Duration=10", f"Users={TEST_USER}",
                          f"Nodes={NODE}", "Flags=IGNORE_JOBS", check=False)
            assert (says in res.stderr) if says else res.returncode == 0, res.stderr
        # scontrol update: Flags= adds, Flags-= takes off; taking OVERLAP off ovl would clash with day? no: with
        # nothing that is not MAINT itself, so it is allowed; a name not known is Slurm's refusal
        assert cluster.cli("scontrol", "update", "ReservationName=ovl", "Flags-=OVERLAP", user="root").stdout == \
            "Reservation updated.\n"
        assert "Flags=IGNORE_JOBS,SPEC_NODES\n" in cluster.cli("scontrol", "show", "reservation", "ovl").stdout
        assert cluster.cli("scontrol", "update", "reservation", "ReservationName=ovl", "Flags=overlap",
                           user="root").stdout == "Reservation updated.\n"
        assert "Flags=OVERLAP,IGNORE_JOBS,SPEC_NODES\n" in cluster.cli("scontrol", "show", "reservation", "ovl").stdout
        for argv, says in ((("ReservationName=nosuch", "Flags=MAINT"), "Error updating the reservation: Requested "
                                                                       "reservation is invalid\n"),
                           (("ReservationName=ovl", "Flags=BOGUS"), "Error parsing flags BOGUS.  No reservation update.\n")):
            res = cluster.cli("scontrol", "update", *argv, user="root", check=False)
            assert (res.returncode, res.stderr) == (1, f"scontrol: error: {says}")
        denied = cluster.cli("scontrol", "update", "ReservationName=ovl", "Flags=MAINT", check=False)
        assert denied.returncode == 1 and "only administrators may update reservations" in denied.stderr
        # the node is the windows' now: a job of either starts, one of neither waits
        inside = int(cluster.cli("sbatch", "--parsable", "-o", "/dev/null", "--reservation=ovl", "--wrap",
                                 "true").stdout)
        outside = int(cluster.cli("sbatch", "--parsable", "-o", "/dev/null", "-t", "1", "--wrap", "true").stdout)
        assert cluster.wait_state(inside, "COMPLETED", "FAILED", timeout=120)["state"] == "COMPLETED"
        assert cluster.job(outside)["state"] == "PENDING"
    finally:
        cluster.cli("scancel", str(busy))
        for name in ("mnt", "ovl", "day", "once"):
            cluster.cli("scontrol", "delete", "reservation", name, user="root", check=False)
    assert cluster.wait_state(outside, "COMPLETED", "FAILED", timeout=120)["state"] == "COMPLETED"
    assert cluster.cli("scontrol", "show", "reservation").stdout == "No reservations in the system\n"
    assert cluster.cli("sinfo", "-h", "-N", "-o", "%N %t").stdout == f"{NODE} idle\n"
