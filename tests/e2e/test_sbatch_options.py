"""hsubmit's everyday sbatch options through the CLI on a real (local) cluster: what it prints,
output file names and patterns, --hold, the job's environment, and bad values refused."""
from __future__ import annotations

import os
import pwd
import re

import pytest

from .harness import OTHER_USER, TEST_USER, start_local_cluster, user_dir, wait_for

NODE = "local1"


@pytest.fixture(scope="module")
def cluster():
    c = start_local_cluster(node=NODE, controller_toml='partitions = ["gpu", "debug"]')
    yield c
    c.close()


def done(cluster, job_id: int) -> dict:
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
    assert job["state"] == "COMPLETED", job
    return job


def test_parsable_prints_only_the_id_and_plain_submit_says_submitted_batch_job(cluster):
    plain = cluster.cli("hsubmit", "-o", "/dev/null", "--wrap", "true").stdout
    m = re.fullmatch(r"Submitted batch job (\d+)\n", plain)
    assert m, plain
    parsable = cluster.cli("hsubmit", "--parsable", "-o", "/dev/null", "--wrap", "true").stdout
    assert re.fullmatch(r"\d+\n", parsable), parsable
    assert int(parsable) > int(m[1])
    home = user_dir(cluster.workdir, TEST_USER)
    (home / "parsable.sh").write_text("#!/bin/sh\n#SBATCH --parsable\n#SBATCH -o /dev/null\ntrue\n")
    from_directive = cluster.cli("hsubmit", "parsable.sh").stdout
    assert re.fullmatch(r"\d+\n", from_directive), from_directive
    for j in (int(m[1]), int(parsable), int(from_directive)):
        done(cluster, j)


def test_default_output_file_is_slurm_jobid_out_in_the_submit_directory(cluster):
    home = user_dir(cluster.workdir, TEST_USER)
    j = cluster.submit("--wrap", "echo to-out; echo to-err >&2")
    done(cluster, j)
    assert (home / f"slurm-{j}.out").read_text() == "to-out\nto-err\n"  # without -e, both streams


def test_output_patterns_expand_every_letter_and_zero_padding(cluster):
    home = user_dir(cluster.workdir, TEST_USER)
    j = cluster.submit("-J", "pat", "-o", "p-%j-%x-%u-%N-%A-%a-%r-%%-%4j-%10j.out", "--wrap", "echo patterned")
    done(cluster, j)
    name = f"p-{j}-pat-{TEST_USER}-{NODE}-{j}-4294967294-0-%-{j:04d}-{j:010d}.out"
    assert (home / name).read_text() == "patterned\n"
    # an array task: %A is the array's id, %a the task's index
    a = cluster.submit("--array=3", "-o", "arr-%A-%a-%3a.out", "--wrap", "echo task")
    done(cluster, a)
    assert (home / f"arr-{a}-3-003.out").read_text() == "task\n"


def test_output_none_and_dev_null_write_no_file(cluster):
    home = user_dir(cluster.workdir, TEST_USER) / "quiet"
    home.mkdir()
    os.chown(home, pwd.getpwnam(TEST_USER).pw_uid, pwd.getpwnam(TEST_USER).pw_gid)
    for target in ("none", "NONE", "/dev/null"):
        j = cluster.submit("-o", target, "--wrap", "echo discarded; echo also >&2", cwd=home)
        done(cluster, j)
    assert [p.name for p in home.iterdir() if p.name != ".hai"] == []  # .hai: the checkpoint dirs
    assert os.stat("/dev/null").st_uid == 0 and oct(os.stat("/dev/null").st_mode & 0o777) == "0o666"


def test_error_file_is_separate_from_output_with_e(cluster):
    home = user_dir(cluster.workdir, TEST_USER)
    j = cluster.submit("-o", "split-%j.out", "-e", "split-%j.err", "--wrap", "echo to-out; echo to-err >&2; exit 0")
    done(cluster, j)
    assert (home / f"split-{j}.out").read_text() == "to-out\n"
    assert (home / f"split-{j}.err").read_text() == "to-err\n"
    j = cluster.submit("-o", "/dev/null", "-e", "only-%j.err", "--wrap", "echo to-out; echo to-err >&2")
    done(cluster, j)
    assert (home / f"only-{j}.err").read_text() == "to-err\n"


def test_hold_submits_held_with_job_held_user_until_hcontrol_release(cluster):
    home = user_dir(cluster.workdir, TEST_USER)
    j = cluster.submit("--hold", "-o", "held-%j.out", "--wrap", "echo ran")
    rows = cluster.cli("hqueue", "-h", "-o", "%i %t %r", "-j", str(j)).stdout.split()
    assert rows == [str(j), "PD", "JobHeldUser"]
    assert f"JobState=PENDING Reason=JobHeldUser" in cluster.cli("hcontrol", "show", "job", str(j)).stdout
    # Several scheduling passes later it still waits, with no run.
    other = cluster.submit("-o", "/dev/null", "--wrap", "true")
    done(cluster, other)
    job = cluster.job(j)
    assert (job["state"], job["reason"], job["runs"]) == ("PENDING", "JobHeldUser", [])
    res = cluster.cli("hcontrol", "release", str(j), user=OTHER_USER, check=False)
    assert res.returncode != 0 and "Access/permission denied" in res.stderr
    cluster.cli("hcontrol", "release", str(j))
    done(cluster, j)
    assert (home / f"held-{j}.out").read_text() == "ran\n"
    j = cluster.submit("-H", "--wrap", "true")
    cluster.cli("hcontrol", "hold", str(j))  # holding a held job again changes nothing
    assert cluster.job(j)["reason"] == "JobHeldUser"
    cluster.cli("hcancel", str(j))


ENV_NAMES = ("HAI_JOB_ID", "HAI_JOB_NAME", "HAI_NODELIST", "HAI_NNODES", "HAI_NODE_RANK", "HAI_GPUS_ON_NODE",
             "HAI_RESTART_COUNT", "HAI_CHECKPOINT_DIR", "HAI_SUBMIT_DIR", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE",
             "NNODES", "NODE_RANK", "CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_JOB_NODELIST",
             "SLURM_NNODES", "SLURM_NODEID", "SLURM_PROCID", "SLURM_RESTART_COUNT", "SLURM_SUBMIT_DIR",
             "SLURM_JOB_PARTITION", "SLURM_CPUS_PER_TASK", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURMD_NODENAME",
             "SLURM_JOB_USER")


def test_environment_has_hai_and_slurm_aliases_including_restart_count(cluster):
    home = user_dir(cluster.workdir, TEST_USER)
    script = home / "env.sh"
    # the first run records its environment and waits to be requeued; the second records and ends
    script.write_text("#!/bin/bash\n#SBATCH -J envjob\n#SBATCH -p debug\n#SBATCH --gpus-per-node=2\n#SBATCH -c 1\n"
                      "env > env-$SLURM_JOB_ID-$SLURM_RESTART_COUNT.txt\n"
                      '[ "$SLURM_RESTART_COUNT" = 0 ] && exec sleep 1000\ntrue\n')
    j = cluster.submit("-o", "/dev/null", str(script))
    first = home / f"env-{j}-0.txt"
    wait_for(lambda: first.exists() and "SLURMD_NODENAME" in first.read_text(), 30, what="the first run's env")
    cluster.cli("hcontrol", "requeue", str(j))
    done(cluster, j)
    for restarts in (0, 1):
        env = dict(line.split("=", 1) for line in (home / f"env-{j}-{restarts}.txt").read_text().splitlines()
                   if "=" in line)
        assert [n for n in ENV_NAMES if n not in env] == []
        expected = {
            "HAI_JOB_ID": str(j), "SLURM_JOB_ID": str(j), "HAI_JOB_NAME": "envjob", "SLURM_JOB_NAME": "envjob",
            "HAI_NODELIST": NODE, "SLURM_JOB_NODELIST": NODE, "HAI_NNODES": "1", "SLURM_NNODES": "1", "NNODES": "1",
            "HAI_NODE_RANK": "0", "SLURM_NODEID": "0", "SLURM_PROCID": "0", "NODE_RANK": "0",
            "HAI_GPUS_ON_NODE": "2", "SLURM_GPUS_ON_NODE": "2", "WORLD_SIZE": "2",
            "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "0,1",
            "HAI_RESTART_COUNT": str(restarts), "SLURM_RESTART_COUNT": str(restarts),
            "HAI_SUBMIT_DIR": str(home), "SLURM_SUBMIT_DIR": str(home),
            "SLURM_JOB_PARTITION": "debug", "SLURM_CPUS_PER_TASK": "1", "SLURMD_NODENAME": NODE,
            "SLURM_JOB_USER": TEST_USER,
        }
        assert {k: env[k] for k in expected} == expected
        assert int(env["MASTER_PORT"]) > 0 and env["MASTER_ADDR"] and env["HAI_CHECKPOINT_DIR"].endswith(f"/{j}")


@pytest.mark.parametrize("argv, message", [
    (["--time=abc"], "--time=abc"),
    (["-t", "1:2:3:4"], "-t 1:2:3:4"),
    (["-c", "0"], "-c 0"),
    (["--mem=lots"], "--mem=lots"),
    (["--signal=NOPE@10"], "--signal=NOPE@10"),
    (["-o", "/root/x"], "-o /root/x: cannot write in /root: Permission denied"),
    (["-e", "/root/sub/x-%j.err"], "-e /root/sub/x-%j.err"),
])
def test_bad_values_are_refused_with_sbatch_messages_and_submit_nothing(cluster, argv, message):
    before = cluster.job_ids()
    res = cluster.cli("hsubmit", *argv, "--wrap", "true", check=False)
    assert res.returncode != 0 and res.stdout == ""
    assert res.stderr.startswith("hsubmit: error: ") and message in res.stderr, res.stderr
    assert cluster.job_ids() == before
