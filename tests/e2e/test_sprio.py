"""sprio on a real (local) cluster: Slurm 22.05's columns, options, messages and exit codes (checked
against the peer on this machine), with the factors our MLFQ orders by: PRIORITY follows the
policy's order (class, level, --nice, fair share, age), LEVEL is the job's MLFQ level, FAIRSHARE
is sshare's factor, QOS the class."""
from __future__ import annotations

import pytest

from .harness import OTHER_USER, TEST_USER, start_local_cluster, user_dir, wait_for

# A job that has run 1 GPU-second sinks to level 1 (the attained-service order, whose levels a
# test can set; PRIORITY follows the Gittins order as well: tests/unit/test_sprio_order.py).
SCHEDULER = """
[scheduler]
policy = "mlfq"
order = "las"
thresholds = [1.0, 100000.0]
quanta = [1.0, 3.0, 5.0]
"""
HEADER = "          JOBID PARTITION   PRIORITY       SITE        AGE  FAIRSHARE        QOS LEVEL"


@pytest.fixture(scope="module")
def cluster():
    c = start_local_cluster(gpus=2, controller_toml='cluster_name = "lab"\n' + SCHEDULER)
    yield c
    c.close()


def sleeper(cluster, name: str, *argv: str, user: str = TEST_USER) -> int:
    mark = user_dir(cluster.workdir, user) / f"{name}.started"
    j = int(cluster.cli("sbatch", "--parsable", "-J", name, "-o", "/dev/null", *argv,
                        "--wrap", f"touch {mark}; exec sleep 1000", user=user).stdout)
    wait_for(mark.exists, 30, what=f"{name} to run")
    return j


def pending(cluster, *argv: str, user: str = TEST_USER) -> int:
    j = int(cluster.cli("sbatch", "--parsable", "-o", "/dev/null", "--gres=gpu:2", *argv, "--wrap", "true",
                        user=user).stdout)
    cluster.wait_state(j, "PENDING")
    return j


@pytest.fixture(scope="module")
def queue(cluster):
    """One GPU held by another user's job; pending 2-GPU jobs of each class, one niced, one held,
    one not yet begun; and a job that ran (level 1), requeued: it waits behind level 0."""
    ran = sleeper(cluster, "ran", "--gres=gpu:1")
    sleeper(cluster, "other", "--gres=gpu:1", user=OTHER_USER)
    wait_for(lambda: cluster.job(ran)["attained_now"] > 1.5, 30, what="the first job to sink a level")
    jobs = {"high": pending(cluster, "--priority=high"), "normal": pending(cluster),
            "theirs": pending(cluster, user=OTHER_USER), "niced": pending(cluster, "--nice=10"),
            "low": pending(cluster, "--priority=low"), "held": pending(cluster, "-H"),
            "later": pending(cluster, "--begin=now+1hour")}
    cluster.cli("scontrol", "requeue", str(ran))
    cluster.wait_state(ran, "PENDING")
    jobs["ran"] = ran
    return jobs


def test_default_columns_and_the_policys_order(cluster, queue):
    out = cluster.cli("sprio").stdout.splitlines()
    assert out[0] == HEADER
    rows = {int(line.split()[0]): line.split() for line in out[1:]}
    listed = ["high", "normal", "theirs", "niced", "low", "ran"]
    assert sorted(rows) == sorted(queue[k] for k in listed)  # not the held one, nor the one not begun
    prio = {k: int(rows[queue[k]][2]) for k in listed}
    # the class first, then --nice within it, and the job that ran (level 1) after every level-0 job
    assert prio["high"] == 6 and {prio["normal"], prio["theirs"]} == {4, 5}
    assert (prio["niced"], prio["low"], prio["ran"]) == (3, 2, 1)
    assert [rows[queue[k]][-1] for k in listed] == ["0", "0", "0", "0", "0", "1"]  # LEVEL
    assert {k: rows[queue[k]][6] for k in ("high", "normal", "low")} == {"high": "66667", "normal": "33333",
                                                                          "low": "0"}  # QOS: the class
    assert all(rows[queue[k]][1] == "gpu" and rows[queue[k]][3] == "0" for k in listed)  # PARTITION, SITE
    by_priority = cluster.cli("sprio", "-h", "-S", "-y", "-o", "%i").stdout.split()
    assert by_priority[0] == str(queue["high"]) and by_priority[-3:] == [str(queue[k]) for k in ("niced", "low", "ran")]


def test_squeue_priority_is_sprios(cluster, queue):
    """squeue's %Q is sprio's PRIORITY and %p the same over 2^32-1, as squeue prints them
    ("%16.14f"); a held job's is 0, as Slurm's; the running ones (no place in the order) 0."""
    sprio = {int(line.split()[0]): int(line.split()[2]) for line in cluster.cli("sprio", "-h").stdout.splitlines()}
    lines = cluster.cli("squeue", "-h", "-o", "%i|%Q|%p|%T").stdout.splitlines()
    seen = {int(i): (q, p, state) for i, q, p, state in (line.split("|") for line in lines)}
    for job, prio in sprio.items():
        assert seen[job][:2] == (str(prio), f"{prio / 4294967295:16.14f}")
    assert seen[queue["held"]][:2] == ("0", "0.00000000000000")
    assert all(q == "0" for q, _p, state in seen.values() if state == "RUNNING")
    header = cluster.cli("squeue", "-O", "prioritylong:10,priority:.17", "-j", str(queue["high"])).stdout.splitlines()
    assert header == ["PRIORITY  " + "PRIORITY".rjust(17), f"{sprio[queue['high']]:<10}" +
                      f"{sprio[queue['high']] / 4294967295:16.14f}".rjust(17)]


def test_fairshare_is_sshares_factor(cluster, queue):
    def mine():  # the user's row, once the controller's decayed usage has been refreshed (10 s)
        rows = [r for r in cluster.cli("sshare", "-P", "-n").stdout.splitlines() if f"|{TEST_USER}|" in r]
        return rows[0] if rows else None
    row = wait_for(mine, 30, 0.5, what="sshare to list the user")
    line = cluster.cli("sprio", "-n", "-h", "-j", str(queue["normal"]), "-o", "%f").stdout.strip()
    assert float(row.split("|")[-1]) == pytest.approx(float(line), abs=1e-3), (row, line)
    assert float(line) < 1  # the job that ran used some of the user's share


def test_long_normalized_weights_and_users(cluster, queue):
    j = queue["high"]
    long_ = cluster.cli("sprio", "-l", "-j", str(j)).stdout.splitlines()
    assert long_[0] == ("          JOBID PARTITION     USER   PRIORITY       SITE        AGE      ASSOC  FAIRSHARE    "
                        "JOBSIZE  PARTITION        QOS        NICE                 TRES LEVEL")
    assert long_[1].split()[:5] == [str(j), "gpu", TEST_USER[:8], "6", "0"] and long_[1].split()[-2:] == ["0", "0"]
    assert cluster.cli("sprio", "-w").stdout.splitlines() == [
        HEADER, "        Weights                               1       1000      10000     100000      "]
    norm = cluster.cli("sprio", "-n", "-j", str(j)).stdout.splitlines()
    assert norm[0] == "          JOBID PARTITION PRIORITY   AGE        FAIRSHARE  QOS        LEVEL"
    assert norm[1].startswith(f"{j:>15} gpu       0.00000000 0.00") and norm[1].endswith(" 0.6666667      0")
    theirs = cluster.cli("sprio", "-u", OTHER_USER, "-h", "-o", "%i|%u|%N|%.3L").stdout
    assert theirs == f"{queue['theirs']}|{OTHER_USER}|0|  0\n"
    assert cluster.cli("sprio", "-h", "-j", str(queue["niced"]), "-o", "%N %Y").stdout == "10 3\n"
    assert cluster.cli("sprio", "-p", "nosuch").stdout == HEADER + "\n"
    assert cluster.cli("sprio", "-M", "lab", "-h", "-j", str(j), "-o", "%i").stdout == f"{j}\n"


def test_messages_and_exit_codes_are_sprios(cluster, queue):
    def run(*argv):
        res = cluster.cli("sprio", *argv, check=False)
        return res.returncode, res.stdout, res.stderr
    running = cluster.call("jobs", {"states": ["RUNNING"]})["jobs"][0]["id"]
    assert run("-j", str(running)) == (0, "Unable to find jobs matching user/id(s) specified\n", "")
    assert run("-j", "abc") == (1, "", "sprio: error: Invalid job id: abc\n")
    assert run("-u", "nosuchuser", "-o", "%i") == (0, "JOBID\n", "sprio: error: Invalid user: nosuchuser\n\n")
    assert run("-S", "x") == (1, HEADER + "\n", "sprio: error: Invalid sort specification: x\n")
    assert run("-h", "-j", str(queue["low"]), "-o", "%i %z") == (0, f"{queue['low']} \n",
                                                                  "sprio: error: Invalid job format specification: z\n")
    assert run("-l", "-o", "%i") == (1, "", "sprio: fatal: Options -o(--format) and -l(--long) are mutually "
                                            "exclusive. Please remove one and retry.\n")
    assert run("-x") == (1, "", "sprio: invalid option -- 'x'\nTry \"sprio --help\" for more information\n")
    code, out, err = run("-j", "1", "2")
    assert (code, err, out.splitlines()[0]) == (1, "sprio: error: Unrecognized option: 2\n",
                                                "Usage: sprio [-j jid[s]] [-u user_name[s]] [-o format] [-p partitions]")
    assert run("-M", "elsewhere")[0] == 1
    array = int(cluster.cli("sbatch", "--parsable", "-o", "/dev/null", "--gres=gpu:2", "--array=0-1", "--wrap",
                            "true").stdout)
    task = wait_for(lambda: [j for j in cluster.call("jobs", {"states": ["PENDING"]})["jobs"]
                             if j.get("array_job_id") == array and j.get("array_task_id") == 1], 30)[0]["id"]
    assert run("-h", "-o", "%i", "-j", f"{array}_1") == (0, f"{task}\n", "")  # each task is a job of its own
    assert run("-j", f"{array}_7") == (1, "", f"sprio: error: Invalid job id: {array}_7\n")
