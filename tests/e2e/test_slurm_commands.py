"""The Slurm-named commands (sbatch squeue sacct sinfo scancel scontrol) on a real (local) cluster,
as a lab's scripts and tools use them: Slurm's formats line for line (checked against Slurm 22.05's
on this machine), its defaults, variables and exit codes."""
from __future__ import annotations

import os
import pwd
import re
import time
from pathlib import Path

import pytest

from .harness import OTHER_USER, TEST_USER, start_local_cluster, user_dir, wait_for

NODE = "local1"
# A lab's QOS: a short debug one, one job at a time, at the top class; a long one few may use.
QOS_TABLES = f"""
[[qos]]
name = "debug"
priority = "urgent"
max_time = "10:00"
max_jobs_per_user = 1
[[qos]]
name = "long"
priority = "low"
allowed_users = ["{OTHER_USER}"]
"""


@pytest.fixture(scope="module")
def mails(tmp_path_factory) -> Path:
    """The file a recording mail program (the controller's mail_program) appends each mail to."""
    d = tmp_path_factory.mktemp("mail")
    prog = d / "record-mail"
    prog.write_text(f'#!/bin/sh\nprintf "%s|%s|%s|%s|%s\\n" "$1" "$2" "$3" "$SLURM_JOB_ID" "$SLURM_JOB_MAIL_TYPE" '
                    f'>> {d}/mails\n')
    prog.chmod(0o755)
    return d / "mails"


@pytest.fixture(scope="module")
def cluster(mails):
    c = start_local_cluster(node=NODE, gpus=4, agent_toml='cpus = 8\nfeatures = ["a100", "ib", "rack1"]',
                            controller_toml=f'cluster_name = "lab"\nmail_program = "{mails.parent / "record-mail"}"\n'
                                            + QOS_TABLES)
    yield c
    c.close()


def sleeper(cluster, name: str, *argv: str, user: str = TEST_USER) -> int:
    mark = user_dir(cluster.workdir, user) / f"{name}.started"
    out = cluster.cli("sbatch", "--parsable", "-J", name, "-o", "/dev/null", *argv,
                      "--wrap", f"touch {mark}; exec sleep 1000", user=user).stdout
    j = int(out)
    wait_for(mark.exists, 30, what=f"{name} to run")
    return j


def test_sbatch_says_submitted_and_writes_slurm_jobid_out(cluster):
    home = user_dir(cluster.workdir, TEST_USER)
    (home / "hello.sh").write_text("#!/bin/bash\n#SBATCH -J hello -N 1  # two options and a comment\necho hi\n")
    out = cluster.cli("sbatch", "hello.sh").stdout
    m = re.fullmatch(r"Submitted batch job (\d+)\n", out)
    assert m, out
    j = int(m[1])
    cluster.wait_state(j, "COMPLETED")
    assert (home / f"slurm-{j}.out").read_text() == "hi\n"
    show = cluster.cli("scontrol", "show", "job", str(j)).stdout
    assert f"StdOut={home}/slurm-{j}.out" in show and "JobName=hello" in show  # expanded, absolute


def test_sbatch_reports_every_refusal_at_once_and_tells_unsupported_from_typos(cluster):
    home = user_dir(cluster.workdir, TEST_USER)
    (home / "lab.sh").write_text("#!/bin/bash\n#SBATCH --deadline=now --mincpus=4\n#SBATCH -N 0\nrun\n")
    res = cluster.cli("sbatch", "--partiton=gpu", "-L", "lic", "lab.sh", check=False)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.splitlines() == [
        "sbatch: error: --partiton: unrecognized option (did you mean --partition?)",
        "sbatch: error: -L/--licenses: sbatch's option is not supported by this cluster (docs/SLURM.md)",
        "sbatch: error: line 2: --deadline: sbatch's option is not supported by this cluster (docs/SLURM.md)",
        "sbatch: error: line 2: --mincpus: sbatch's option is not supported by this cluster (docs/SLURM.md)",
        "sbatch: error: line 3: -N 0: expected a positive integer",
    ]
    assert cluster.call("jobs", {"names": ["lab.sh"], "all": True})["jobs"] == []  # nothing submitted


def test_constraint_over_the_features_agent_toml_declares(cluster):
    home = user_dir(cluster.workdir, TEST_USER)
    (home / "feat.sh").write_text("#!/bin/bash\n#SBATCH -C a100,ib  # Slurm's AND\n"
                                  "scontrol show job $SLURM_JOB_ID | grep -o 'Features=[^ ]*'\n")
    j = int(cluster.cli("sbatch", "--parsable", "-o", "feat.out", "feat.sh").stdout)
    assert cluster.wait_state(j, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert (home / "feat.out").read_text() == "Features=a100&ib\n"
    held = int(cluster.cli("sbatch", "--parsable", "-H", "-C", "[rack1|rack2]", "--wrap", "true").stdout)
    assert cluster.cli("squeue", "-h", "-j", str(held), "-o", "%i|%f").stdout == f"{held}|[rack1|rack2]\n"
    cluster.cli("scancel", str(held))
    refused = cluster.cli("sbatch", "-C", "a100&(tpu|ipu)", "--wrap", "true", check=False)
    assert refused.returncode == 1 and refused.stderr == (
        "sbatch: error: Batch job submission failed: Invalid feature specification: no node has the feature(s) "
        "ipu, tpu\n")
    two = cluster.cli("sbatch", "-C", "a100*2", "--wrap", "true", check=False)  # -N 2 from the count; one node here
    assert two.returncode == 1 and "Requested node configuration is not available" in two.stderr, two.stderr
    bad = cluster.cli("sbatch", "-C", "a100 | h100", "--wrap", "true", check=False)
    assert bad.stderr == ("sbatch: error: -C a100 | h100: Invalid feature specification: a space at position 5 "
                          "(features are letters, digits and _.:+-; operators & | , * ( ) [ ])\n")
    node = cluster.cli("scontrol", "show", "node", NODE).stdout
    assert "   AvailableFeatures=a100,ib,rack1 ActiveFeatures=a100,ib,rack1" in node.splitlines()
    assert cluster.cli("sinfo", "-h", "-N", "-o", "%N %f").stdout == f"{NODE} a100,ib,rack1\n"


def test_qos_sets_class_and_limits_and_refuses_in_slurms_words(cluster):
    home = user_dir(cluster.workdir, TEST_USER)
    (home / "dbg.sh").write_text("#!/bin/bash\n#SBATCH --qos=debug\necho qos=$SLURM_JOB_QOS\n")
    j = int(cluster.cli("sbatch", "--parsable", "-o", "dbg.out", "dbg.sh").stdout)
    assert cluster.wait_state(j, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert (home / "dbg.out").read_text() == "qos=debug\n"
    show = cluster.cli("scontrol", "show", "job", str(j)).stdout
    assert "Priority=urgent Partition=gpu QOS=debug" in show and "TimeLimit=10:00" in show, show
    first = sleeper(cluster, "dbg1", "-q", "debug")
    second = int(cluster.cli("sbatch", "--parsable", "-q", "debug", "-o", "/dev/null", "--wrap", "true").stdout)
    wait_for(lambda: cluster.job(second)["reason"] == "QOSMaxJobsPerUserLimit", 30, what="the QOS job limit")
    listed = cluster.cli("squeue", "-h", "-j", f"{first},{second}", "-o", "%i|%q|%r").stdout
    cluster.cli("scancel", str(first))
    assert listed == f"{second}|debug|QOSMaxJobsPerUserLimit\n{first}|debug|None\n"  # pending first, as Slurm
    assert cluster.wait_state(second, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    rows = cluster.cli("sacct", "-X", "-n", "-P", "-j", f"{j},{second}", "-o", "JobID,QOS").stdout
    assert rows == f"{j}|debug\n{second}|debug\n"
    for argv, says in [(["--qos=gold"], "Invalid qos specification: no QOS named gold"),
                       (["--qos=long"], f"Invalid qos specification: QOS long is not open to user {TEST_USER}"),
                       (["-q", "debug", "-t", "20"], "Job violates accounting/QOS policy (job submit limit, user's "
                                                     "size and/or time limits): 20:00 is more than MaxWall=10:00")]:
        res = cluster.cli("sbatch", *argv, "--wrap", "true", check=False)
        assert res.returncode == 1 and res.stderr.startswith(f"sbatch: error: Batch job submission failed: {says}"), \
            res.stderr
    assert cluster.cli("sbatch", "--test-only", "-q", "long", "--wrap", "true", user=OTHER_USER).returncode == 0
    listing = cluster.cli("scontrol", "show", "qos").stdout.splitlines()
    assert listing[0] == ("QOS=normal (default) Priority=normal MaxWall=UNLIMITED MaxTRESPerUser=gres/gpu=0 "
                          "MaxJobsPerUser=0 Allowed=all Description=the default")
    assert listing[2] == (f"QOS=long Priority=low MaxWall=UNLIMITED MaxTRESPerUser=gres/gpu=0 MaxJobsPerUser=0 "
                          f"Users={OTHER_USER}")


def test_a_reservation_holds_the_node_for_its_users_and_their_jobs(cluster):
    create = ("scontrol", "create", "reservation", "ReservationName=maint", "StartTime=now", "Duration=10:00",
              f"Nodes={NODE}", f"Users={TEST_USER}")
    res = cluster.cli(*create, check=False)
    assert res.returncode == 1 and "only administrators may create reservations" in res.stderr
    assert cluster.cli(*create, user="root").stdout == "Reservation created: maint\n"
    try:
        lines = cluster.cli("scontrol", "show", "reservation", "maint").stdout.splitlines()
        assert re.fullmatch(r"ReservationName=maint StartTime=\S+ EndTime=\S+ Duration=00:10:00", lines[0]), lines
        assert lines[1:5] == [f"   Nodes={NODE} NodeCnt=1 CoreCnt=8 Features=(null) PartitionName=(null) "
                              f"Flags=SPEC_NODES", "   TRES=cpu=8",
                              f"   Users={TEST_USER} Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE "
                              f"BurstBuffer=(null) Watts=n/a", "   MaxStartDelay=(null)"]
        again = cluster.cli(*create[:3], "ReservationName=other", "Duration=5", f"Nodes={NODE}", "Users=root",
                            user="root", check=False)
        assert again.stderr == ("scontrol: error: Error creating the reservation: Requested reservation overlaps "
                                "with another reservation (maint)\n")
        outside = int(cluster.cli("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true").stdout)  # no --reservation
        inside = int(cluster.cli("sbatch", "--parsable", "-o", "/dev/null", "--reservation=maint", "--wrap",
                                 "true").stdout)
        assert cluster.wait_state(inside, "COMPLETED", "FAILED")["state"] == "COMPLETED"
        assert cluster.job(outside)["state"] == "PENDING"  # the node is the reservation's
        assert cluster.cli("sacct", "-X", "-n", "-P", "-j", str(inside), "-o", "JobID,State").stdout == \
            f"{inside}|COMPLETED\n"
        denied = cluster.cli("sbatch", "--reservation=maint", "--wrap", "true", user=OTHER_USER, check=False)
        assert denied.returncode == 1 and "Access denied to requested reservation maint" in denied.stderr
        invalid = cluster.cli("sbatch", "--reservation=nosuch", "--wrap", "true", check=False)
        assert invalid.stderr.startswith("sbatch: error: Batch job submission failed: Requested reservation is "
                                         "invalid"), invalid.stderr
    finally:
        cluster.cli("scontrol", "delete", "reservation", "maint", user="root")
    assert cluster.wait_state(outside, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert cluster.cli("scontrol", "show", "reservation").stdout == "No reservations in the system\n"
    gone = cluster.cli("scontrol", "delete", "reservation", "maint", user="root", check=False)
    assert gone.returncode == 1 and "delete_reservation maint: Requested reservation is invalid" in gone.stderr


def test_sbatch_variables_sit_between_directives_and_command_line(cluster):
    home = user_dir(cluster.workdir, TEST_USER)
    (home / "timed.sh").write_text("#!/bin/bash\n#SBATCH -t 5 -J fromscript\ntrue\n")
    env = {"SBATCH_TIMELIMIT": "7", "SBATCH_JOB_NAME": "fromenv"}
    j = int(cluster.cli("sbatch", "--parsable", "-o", "/dev/null", "--hold", "timed.sh", env=env).stdout)
    k = int(cluster.cli("sbatch", "--parsable", "-o", "/dev/null", "--hold", "-t", "9", "timed.sh", env=env).stdout)
    assert cluster.cli("squeue", "-h", "-j", f"{j},{k}", "-o", "%i %j %l").stdout.splitlines() == [
        f"{j} fromenv 7:00", f"{k} fromenv 9:00"]
    res = cluster.cli("sbatch", "--wrap", "true", env={"SBATCH_GPU_FREQ": "high"}, check=False)
    assert res.returncode == 1 and "SBATCH_GPU_FREQ: sets --gpu-freq, which is not supported" in res.stderr
    cluster.cli("scancel", str(j), str(k))


def test_sbatch_clusters_and_memory_per_cpu(cluster):
    res = cluster.cli("sbatch", "-M", "other", "--wrap", "true", check=False)
    assert res.returncode == 1 and "other is not this cluster (this is 'lab'" in res.stderr
    j = int(cluster.cli("sbatch", "--parsable", "-M", "lab", "--hold", "--mem-per-cpu=1G", "-c", "2",
                        "--comment", "sweep 3 of 8", "--wrap", "true").stdout)
    show = cluster.cli("scontrol", "show", "job", str(j)).stdout
    assert "MinMemoryNode=2048M" in show and "Comment=sweep 3 of 8 " in show
    res = cluster.cli("sbatch", "-c", "64", "--wrap", "true", check=False)
    assert res.returncode == 1 and "no node has 64 CPUs (the largest has 8)" in res.stderr  # not "GPUs"
    cluster.cli("scancel", str(j))


def test_squeue_default_columns_and_formats_are_slurm_s(cluster):
    j = sleeper(cluster, "averyveryverylongname", "--gres=gpu:2")
    p = int(cluster.cli("sbatch", "--parsable", "-J", "big", "-o", "/dev/null", "--gres=gpu:4", "-t", "1-2",
                        "--wrap", "true").stdout)
    cluster.wait_state(p, "PENDING")
    lines = cluster.cli("squeue").stdout.splitlines()
    assert lines[0] == "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)"
    user = TEST_USER[:8]
    assert lines[1] == f"{p:>18}       gpu      big {user:>8} PD       0:00      1 (Resources)"
    assert re.fullmatch(rf"{j:>18}       gpu averyver {user:>8}  R +\d+:\d\d      1 {NODE}", lines[2]), lines[2]
    assert cluster.cli("squeue", "-o", "%.18i|%T|%j", "-j", str(j)).stdout.splitlines() == [
        "             JOBID|STATE|NAME", f"{j:>18}|RUNNING|averyveryverylongname"]
    assert cluster.cli("squeue", "-j", str(p), "-O", "jobid:8,state,name:5,reason").stdout.splitlines() == [
        "JOBID   STATE               NAME REASON              ", f"{p:<8}PENDING             big  Resources           "]
    assert cluster.cli("squeue", "-h", "-t", "PD", env={"SQUEUE_FORMAT": "%i %l"}).stdout == f"{p} 1-02:00:00\n"
    long_ = cluster.cli("squeue", "-l", "-j", str(p)).stdout.splitlines()
    time.strptime(long_[0], "%a %b %d %H:%M:%S %Y")  # squeue -l starts with the time
    assert long_[1].split() == ["JOBID", "PARTITION", "NAME", "USER", "STATE", "TIME", "TIME_LIMI", "NODES",
                                "NODELIST(REASON)"]
    res = cluster.cli("squeue", "-o", "%i", "-l", check=False)
    assert res.returncode == 1 and "mutually exclusive" in res.stderr
    cluster.cli("scancel", str(j), str(p))


def test_polled_listings_follow_every_change(cluster):
    """A tool polls the same squeue and sacct command line; the controller keeps a listing until
    the store's next write (controller/listing_cache.py): each change shows at the next poll."""
    poll_q = ("squeue", "-h", "-o", "%i|%T|%r", "-u", TEST_USER)
    poll_a = ("sacct", "-X", "-n", "-P", "-o", "JobID,State,JobName", "-u", TEST_USER)
    # the jobs an earlier test cancelled end first (a COMPLETING one would change between polls)
    (before,) = wait_for(lambda: (out,) if "|COMPLETING|" not in (out := cluster.cli(*poll_q).stdout) else None,
                         60, what="earlier tests' jobs to end")
    assert cluster.cli(*poll_q).stdout == before  # polled again, nothing changed
    j = int(cluster.cli("sbatch", "--parsable", "--hold", "-J", "polled", "-o", "/dev/null",
                        "--wrap", "exec sleep 1000", user=TEST_USER).stdout)
    assert f"{j}|PENDING|JobHeldUser\n" in cluster.cli(*poll_q).stdout
    assert f"{j}|PENDING|polled\n" in cluster.cli(*poll_a).stdout
    cluster.cli("scontrol", "release", str(j), user=TEST_USER)
    wait_for(lambda: f"{j}|RUNNING|None\n" in cluster.cli(*poll_q).stdout, 30, what="the release to show")
    assert f"{j}|RUNNING|polled\n" in cluster.cli(*poll_a).stdout
    cluster.cli("scancel", str(j), user=TEST_USER)
    wait_for(lambda: str(j) not in cluster.cli(*poll_q).stdout, 30, what="the cancel to show")
    wait_for(lambda: f"{j}|CANCELLED by {pwd.getpwnam(TEST_USER).pw_uid}|polled\n" in cluster.cli(*poll_a).stdout, 30,
             what="sacct to show the cancel")


def test_sacct_columns_parsable_and_state_filter(cluster):
    j = int(cluster.cli("sbatch", "--parsable", "-J", "averyveryverylongname", "-o", "/dev/null",
                        "--wrap", "exit 3").stdout)
    cluster.wait_state(j, "FAILED")
    lines = cluster.cli("sacct", "-j", str(j)).stdout.splitlines()
    assert lines[:2] == ["JobID           JobName  Partition    Account  AllocCPUS      State ExitCode ",
                         "------------ ---------- ---------- ---------- ---------- ---------- -------- "]
    assert lines[2] == f"{j:<12} averyvery+        gpu    default          1     FAILED      3:0 "
    assert lines[3].split() == [f"{j}.batch", "batch", "default", "1", "FAILED", "3:0"]
    out = cluster.cli("sacct", "-X", "-P", "-n", "-j", str(j), "-o", "JobID,JobName,State,ExitCode,NNodes,NodeList").stdout
    assert out == f"{j}|averyveryverylongname|FAILED|3:0|1|{NODE}\n"
    assert cluster.cli("sacct", "-X", "-p", "-n", "-j", str(j), "-o", "jobid,state").stdout == f"{j}|FAILED|\n"
    assert cluster.cli("sacct", "-X", "-P", "-n", "-j", str(j), "-s", "CD", "-o", "jobid").stdout == ""
    assert cluster.cli("sacct", "-X", "-n", "-P", "-j", str(j), env={"SACCT_FORMAT": "jobid,exitcode"}).stdout == f"{j}|3:0\n"
    res = cluster.cli("sacct", "-o", "JobID,Bogus", check=False)
    assert res.returncode == 1 and res.stderr == 'sacct: error: Invalid field requested: "Bogus"\n'
    # a user who is not root sees their own jobs by default, as sacct shows them
    assert cluster.cli("sacct", "-X", "-n", "-P", "-o", "jobid", user=OTHER_USER).stdout == ""


def test_sacct_reports_what_the_jobs_cgroup_was_charged(cluster):
    """MaxRSS, AveRSS, AveCPU and TotalCPU from the run's cgroup (issue 22), in Slurm's formats,
    for work done by children that exited long before the job did."""
    script = ("python3 -c 'import time; t = time.process_time(); [0 for _ in iter(lambda: time.process_time() - t "
              "< 1.2, False)]'; python3 -c 'b = bytearray(96 << 20); b[::4096] = b\"x\" * len(b[::4096])'")
    j = int(cluster.cli("sbatch", "--parsable", "--mem=256M", "-o", "/dev/null", "--wrap", script).stdout)
    cluster.wait_state(j, "COMPLETED")
    out = cluster.cli("sacct", "-X", "-n", "-P", "-j", str(j), "-o", "JobID,MaxRSS,AveRSS,AveCPU,TotalCPU").stdout
    job_id, max_rss, ave_rss, ave_cpu, total_cpu = out.strip().split("|")
    assert job_id == str(j) and max_rss == ave_rss  # one rank
    # Slurm's convert_num_unit: a whole number, or two decimals where a half was divided ("99.50M")
    assert re.fullmatch(r"\d+(\.\d\d)?[KM]", max_rss), out
    kib = float(max_rss[:-1]) * {"K": 1, "M": 1024}[max_rss[-1]]
    assert 96 << 10 <= kib < 256 << 10, out
    m = re.fullmatch(r"(\d\d):(\d\d)\.(\d{3})", total_cpu)  # sacct's MM:SS.mmm under an hour
    assert m and 60 * int(m[1]) + int(m[2]) >= 1, out
    assert re.fullmatch(r"00:00:0[1-9]", ave_cpu), out  # whole seconds per rank
    # hacct: the same figures, in its own units
    row = cluster.cli("hacct", "-X", "-n", "-j", str(j), "-o", "MaxRSS,AveCPU").stdout.split()
    assert re.fullmatch(r"\d+M", row[0]) and row[1].endswith("%"), row


def test_a_job_parses_squeue_and_sacct_with_cut(cluster):
    home = user_dir(cluster.workdir, TEST_USER)
    (home / "watch.sh").write_text(
        "#!/bin/bash\n#SBATCH -o watch.out\n"
        "state=$(squeue -h -j $SLURM_JOB_ID -o '%i|%T' | cut -d'|' -f2)\n"
        "acct=$(sacct -X -n -P -j $SLURM_JOB_ID -o JobID,JobName,State | cut -d'|' -f2,3)\n"
        "echo \"$state $acct $SLURM_CLUSTER_NAME\"\n")
    j = int(cluster.cli("sbatch", "--parsable", "-J", "watcher", "watch.sh").stdout)
    cluster.wait_state(j, "COMPLETED")
    assert (home / "watch.out").read_text() == "RUNNING watcher|RUNNING lab\n"


def test_sinfo_default_and_node_views(cluster):
    wait_for(lambda: "idle" in cluster.cli("sinfo", "-h", "-o", "%t").stdout, 30, what="the node to be idle")
    lines = cluster.cli("sinfo").stdout.splitlines()
    assert lines[0] == "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST"
    assert lines[1] == f"gpu*         up   infinite      1   idle {NODE}"
    assert cluster.cli("sinfo", "-N", "-h").stdout == f"{NODE:<9}      1 gpu*      idle  \n"
    assert cluster.cli("sinfo", "-h", "-o", "%P|%D|%t|%G|%c").stdout == "gpu*|1|idle|gpu:4|8\n"
    assert cluster.cli("sinfo", "-s", "-h").stdout == f"gpu*         up   infinite          0/1/0/1 {NODE}\n"


def test_scancel_is_quiet_about_ended_jobs_and_refuses_others(cluster):
    res = cluster.cli("scancel", "99999", check=False)
    assert (res.returncode, res.stderr) == (0, "")  # Slurm 22.05: no error for an unknown or ended job
    res = cluster.cli("scancel", "-v", "99999", check=False)
    assert "Invalid job id specified: 99999" in res.stderr
    theirs = sleeper(cluster, "theirs", user=OTHER_USER)
    res = cluster.cli("scancel", str(theirs), check=False)
    assert res.returncode == 1 and "Access/permission denied" in res.stderr
    cluster.cli("scancel", str(theirs), user=OTHER_USER)
    cluster.wait_state(theirs, "CANCELLED")


def test_open_mode_append_keeps_what_the_file_held(cluster):
    home = user_dir(cluster.workdir, TEST_USER)
    pw = pwd.getpwnam(TEST_USER)
    for name, mode in (("kept.out", ["--open-mode=append"]), ("wiped.out", [])):
        (home / name).write_text("old\n")
        os.chown(home / name, pw.pw_uid, pw.pw_gid)
        j = int(cluster.cli("sbatch", "--parsable", "-o", name, *mode, "--wrap", "echo new").stdout)
        cluster.wait_state(j, "COMPLETED")
    assert (home / "kept.out").read_text() == "old\nnew\n"
    assert (home / "wiped.out").read_text() == "new\n"  # a first run truncates, as sbatch's default
    res = cluster.cli("sbatch", "--open-mode=sometimes", "--wrap", "true", check=False)
    assert res.returncode == 1 and "--open-mode=sometimes: expected append or truncate" in res.stderr


def test_exclusive_gets_the_whole_node_and_node_lists_are_checked(cluster):
    home = user_dir(cluster.workdir, TEST_USER)
    mark = home / "whole.started"
    j = int(cluster.cli("sbatch", "--parsable", "--exclusive", "--gres=gpu:1", "-w", NODE, "-o", "whole.out",
                        "--wrap", f'echo "$CUDA_VISIBLE_DEVICES $SLURM_GPUS_ON_NODE"; touch {mark}; exec sleep 1000'
                        ).stdout)
    wait_for(mark.exists, 30, what="the exclusive job to run")
    assert (home / "whole.out").read_text() == "0,1,2,3 4\n"  # every GPU, as Slurm gives an exclusive job
    show = cluster.cli("scontrol", "show", "job", str(j)).stdout
    assert f"ReqNodeList={NODE} ExcNodeList=(null) OverSubscribe=NO" in show
    other = int(cluster.cli("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true").stdout)  # no GPU, 1 CPU
    time.sleep(1.5)  # a few passes: it must not join the exclusive job's node
    assert cluster.job(other)["state"] == "PENDING"
    cluster.cli("scancel", str(j))
    assert cluster.wait_state(other, "COMPLETED", timeout=30)["state"] == "COMPLETED"
    res = cluster.cli("sbatch", "-w", "nothere", "--wrap", "true", check=False)
    assert res.returncode == 1 and "Invalid node name specified: -w names nothere" in res.stderr
    res = cluster.cli("sbatch", "-x", NODE, "--wrap", "true", check=False)
    assert res.returncode == 1 and "Requested node configuration is not available" in res.stderr


def test_time_limit_mails_at_half_and_at_the_limit(cluster, mails):
    j = int(cluster.cli("sbatch", "--parsable", "-J", "slow", "-o", "/dev/null", "-t", "0:06",
                        "--mail-type=TIME_LIMIT_50,TIME_LIMIT", "--wrap", "exec sleep 100").stdout)
    assert cluster.wait_state(j, "TIMEOUT", timeout=60)["state"] == "TIMEOUT"
    mine = lambda: [line for line in (mails.read_text().splitlines() if mails.exists() else ())  # noqa: E731
                    if line.split("|")[3] == str(j)]
    wait_for(lambda: len(mine()) >= 2, 30, what="two time limit mails")
    half, full = mine()
    assert re.fullmatch(rf"-s\|Slurm Job_id={j} Name=slow Reached 50% of time limit, Run time 00:00:0[3-5]\|"
                        rf"{TEST_USER}\|{j}\|Reached 50% of time limit", half), half
    assert re.fullmatch(rf"-s\|Slurm Job_id={j} Name=slow Reached time limit, Run time 00:00:0[6-9]\|{TEST_USER}\|{j}\|"
                        rf"Reached time limit", full), full


def test_mail_type_runs_the_mail_program_with_slurm_s_subjects(cluster, mails):
    ok = int(cluster.cli("sbatch", "--parsable", "-J", "mailed", "-o", "/dev/null", "--mail-type=BEGIN,END",
                         "--mail-user=ann@lab.example", "--wrap", "true").stdout)
    bad = int(cluster.cli("sbatch", "--parsable", "-J", "broken", "-o", "/dev/null", "--mail-type=END,FAIL",
                          "--wrap", "exit 3").stdout)
    cluster.wait_state(ok, "COMPLETED")
    cluster.wait_state(bad, "FAILED")
    wait_for(lambda: mails.exists() and len(mails.read_text().splitlines()) >= 3, 30, what="three mails")
    # the mail program runs for each at once (up to four): by job and kind, not in order
    got = {(int(line.split("|")[3]), line.split("|")[4]): line for line in mails.read_text().splitlines()}
    t = r"\d\d:\d\d:\d\d"
    assert re.fullmatch(rf"-s\|Slurm Job_id={ok} Name=mailed Began, Queued time {t}\|ann@lab.example\|{ok}\|Began",
                        got[ok, "Began"]), got
    assert re.fullmatch(rf"-s\|Slurm Job_id={ok} Name=mailed Ended, Run time {t}, COMPLETED, ExitCode 0\|"
                        rf"ann@lab.example\|{ok}\|Ended", got[ok, "Ended"]), got
    # a failure, to the job's own user by default: one mail, Slurm's "Failed"
    assert re.fullmatch(rf"-s\|Slurm Job_id={bad} Name=broken Failed, Run time {t}, FAILED, ExitCode 3\|"
                        rf"{TEST_USER}\|{bad}\|Failed", got[bad, "Failed"]), got
    assert len([k for k in got if k[0] in (ok, bad)]) == 3
    res = cluster.cli("sbatch", "--mail-type=INVALID_DEPEND", "--mail-user=-oProxyCommand=x", "--wrap", "true",
                      check=False)
    assert res.returncode == 1 and "INVALID_DEPEND mails are not supported yet" in res.stderr
    assert "--mail-user=-oProxyCommand=x: expected a user name or an e-mail address" in res.stderr
