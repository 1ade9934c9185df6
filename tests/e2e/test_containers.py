"""Containers end to end: hsubmit --container-image/--runtime as an ordinary user, through the
controller and SSH to the agents, a busybox image (built here) run by bubblewrap, runc and podman
(where installed); the output file, the GPU device nodes the job sees (fake ones made here),
hacct's state, --mem enforced as OUT_OF_MEMORY, and hcancel leaving no process or container."""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tests.integration.test_agent_containers import busybox_rootfs, fake_gpu_nodes, podman_containers, podman_installed

from .harness import TEST_USER, start_ssh_cluster, user_dir, wait_for

pytestmark = pytest.mark.timeout(300)
need_podman = pytest.mark.skipif(not podman_installed(), reason="podman is not installed (scripts/test installs it)")


@pytest.fixture(scope="module")
def cluster(ssh_nodes):
    devices = Path(tempfile.mkdtemp(prefix="hai-fakedev-", dir="/tmp")) / "dev"
    os.chmod(devices.parent, 0o755)  # bwrap binds them as the user
    fake_gpu_nodes(devices, 2)  # the agents' device_dir: /dev/nvidia0, nvidia1, nvidiactl, nvidia-uvm
    c = start_ssh_cluster(ssh_nodes, gpus_per_node=2, agent_toml=f'[isolation]\ndevice_dir = "{devices}"\n')
    c.device_dir = devices
    yield c
    c.close()
    shutil.rmtree(devices.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def image(cluster):
    """The image in the user's directory (relative --container-image paths start from there)."""
    d = user_dir(cluster.workdir, TEST_USER)
    busybox_rootfs(d / "busybox-root")
    os.chmod(d, 0o755)
    return "busybox-root"


def acct_fields(cluster, job_id: int) -> list[str]:
    lines = cluster.cli("hacct", "-X", "-j", str(job_id), "-P", "-n").stdout.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0].split("|")


def test_a_bwrap_job_runs_in_its_image_as_the_user(cluster, image):
    d = user_dir(cluster.workdir, TEST_USER)
    (d / "in-image.sh").write_text(
        "#!/bin/sh\n"
        "#HAI --gpus-per-node=1\n"
        "#SBATCH -o image-%j.out\n"
        'echo "user=$(id -u) ls=$(readlink /bin/ls) gpus=$SLURM_JOB_GPUS nvd=$NVIDIA_VISIBLE_DEVICES"\n')
    job_id = cluster.submit(f"--container-image={image}", "--runtime=bwrap", "in-image.sh", cwd=d)
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", "CANCELLED")
    out = (d / f"image-{job_id}.out").read_text()
    assert job["state"] == "COMPLETED", (job, out)
    assert job["spec"]["container_image"] == str(d / image) and job["spec"]["runtime"] == "bwrap"
    # /bin/ls is busybox's link: the job saw the image, not the host (where it is coreutils)
    fields = dict(f.split("=", 1) for f in out.split())
    assert fields["user"] == str(os.stat(d).st_uid) and fields["ls"] == "/bin/busybox", out
    assert fields["nvd"] == fields["gpus"] and len(fields["nvd"]) == 1, out  # its one GPU
    fields = acct_fields(cluster, job_id)
    assert "COMPLETED" in fields and "0:0" in fields, fields


def test_a_plain_process_job_opens_only_its_own_gpus_device_node(cluster):
    """runtime "none": the device cgroup, not only CUDA_VISIBLE_DEVICES. The fake nodes have no
    driver behind them: the job's own opens to ENXIO, the other card's is refused with EPERM (the
    cgroup, before any driver), in the batch script and in an srun step alike."""
    d = user_dir(cluster.workdir, TEST_USER)
    devices = cluster.device_dir
    probe = ("import errno, os, sys\n"
             "for i in (0, 1):\n"
             "    try:\n"
             "        os.close(os.open(f'%s/nvidia{i}', os.O_RDWR)); print(i, 'open')\n"
             "    except OSError as e:\n"
             "        print(i, errno.errorcode[e.errno])\n" % devices)
    (d / "devprobe.py").write_text(probe)
    (d / "plain.sh").write_text(
        "#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH -o plain-%j.out\n"
        "echo GPU $SLURM_JOB_GPUS\npython3 devprobe.py\nsrun python3 devprobe.py\n")
    job_id = cluster.submit("--runtime=none", "plain.sh", cwd=d)
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", "CANCELLED")
    out = (d / f"plain-{job_id}.out").read_text()
    assert job["state"] == "COMPLETED", (job, out)
    lines = out.splitlines()
    gpu = int(lines[0].split()[1])
    want = {f"{gpu} ENXIO", f"{1 - gpu} EPERM"}
    assert set(lines[1:3]) == want and set(lines[3:5]) == want, out
    # a job without GPUs opens neither
    job_id = cluster.submit("--runtime=none", "-o", "nogpu-%j.out", "--wrap", "python3 devprobe.py", cwd=d)
    assert cluster.wait_state(job_id, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert (d / f"nogpu-{job_id}.out").read_text().split("\n")[:2] == ["0 EPERM", "1 EPERM"]


@pytest.mark.parametrize("runtime", ["bwrap", "runc", pytest.param("podman", marks=need_podman)])
def test_a_two_node_jobs_script_and_steps_run_in_its_image(cluster, image, runtime):
    """Slurm's model in a container: the script runs once in the image on the first node, and
    srun's tasks (there and on the other node, under its step server) run in the image too,
    although busybox has no Python: the node's own is bound in for srun and the step server."""
    d = user_dir(cluster.workdir, TEST_USER)
    (d / f"steps-{runtime}.sh").write_text(
        "#!/bin/sh\n"
        "#SBATCH -N 2 --ntasks-per-node=2\n"
        'echo "batch ls=$(readlink /bin/ls) head=$(scontrol show hostnames | head -n 1)"\n'
        "srun -l sh -c 'echo \"ls=$(readlink /bin/ls) node=$SLURM_NODEID rank=$RANK/$WORLD_SIZE\"' | sort\n"
        "srun -n 1 sh -c 'exit 3'; echo \"rc=$?\"\n")
    path = d / image if runtime == "podman" else image  # podman takes an absolute path (or a reference)
    job_id = cluster.submit(f"--container-image={path}", f"--runtime={runtime}", "-o", f"steps-{runtime}-%j.out",
                            f"steps-{runtime}.sh", cwd=d)
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", "CANCELLED", timeout=120)
    out = (d / f"steps-{runtime}-{job_id}.out").read_text()
    assert job["state"] == "COMPLETED", (job, out)
    first = sorted(n["name"] for n in cluster.call("nodes", {})["nodes"])[0]
    lines = out.splitlines()
    assert lines[0] == f"batch ls=/bin/busybox head={first}", out
    assert lines[1:5] == [f"{t}: ls=/bin/busybox node={t // 2} rank={t}/4" for t in range(4)], out
    assert "rc=3" in lines, out


def test_a_step_in_an_image_goes_on_through_its_step_servers_agent_restart(cluster, image):
    """The step server in its container reaches the restarted agent again (its socket's
    directory is bound, not the old socket) and no line of the other node's task is lost."""
    d = user_dir(cluster.workdir, TEST_USER)
    second = sorted(cluster.agents)[1]
    (d / "img-restart.sh").write_text(
        "#!/bin/sh\n#SBATCH -N 2\n"
        f"srun -w {second} -N 1 sh -c 'i=0; while [ $i -lt 60 ]; do echo tick $i; i=$((i+1)); sleep 0.05; done'\n"
        'echo "srun rc=$?"\n')
    out = d / "img-restart.out"
    job_id = cluster.submit(f"--container-image={image}", "--runtime=bwrap", "-o", str(out), "img-restart.sh", cwd=d)
    wait_for(lambda: out.exists() and "tick 5\n" in out.read_text(), 60, what="the step's first lines")
    agent = cluster.agents[second]
    agent.kill()
    time.sleep(0.5)
    agent.start()
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", "CANCELLED", timeout=90)
    text = out.read_text()
    assert job["state"] == "COMPLETED", text
    assert [line for line in text.splitlines() if line.startswith("tick")] == [f"tick {i}" for i in range(60)]
    assert text.endswith("srun rc=0\n"), text


def test_exceeding_mem_ends_the_job_as_out_of_memory(cluster, image):
    d = user_dir(cluster.workdir, TEST_USER)
    job_id = cluster.submit(f"--container-image={image}", "--runtime=runc", "--mem=48M", "-o", "oom-%j.out",
                            "--wrap", "head -c 300m /dev/zero | tail > /dev/null; sleep 300", cwd=d)
    job = cluster.wait_state(job_id, "OUT_OF_MEMORY", "COMPLETED", "FAILED", "CANCELLED", timeout=90)
    assert job["state"] == "OUT_OF_MEMORY", job
    assert "OUT_OF_MEMORY" in acct_fields(cluster, job_id)
    shown = cluster.cli("hcontrol", "show", "job", str(job_id)).stdout
    assert "Reason=job exceeded its memory limit of 48 MiB" in shown, shown


@need_podman
def test_a_podman_job_sees_its_gpu_only_and_runs_as_the_user(cluster, image):
    d = user_dir(cluster.workdir, TEST_USER)
    (d / "podman.sh").write_text(
        "#!/bin/sh\n"
        "#HAI --gpus-per-node=1\n"
        "#SBATCH -o podman-%j.out\n"
        'echo "user=$(id -u) ls=$(readlink /bin/ls) gpus=$SLURM_JOB_GPUS nvd=$NVIDIA_VISIBLE_DEVICES"\n'
        "echo DEV $(ls /dev | grep nvidia)\n")
    job_id = cluster.submit(f"--container-image={d / image}", "--runtime=podman", "podman.sh", cwd=d)
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", "CANCELLED")
    out = (d / f"podman-{job_id}.out").read_text()
    assert job["state"] == "COMPLETED", (job, out)
    lines = out.splitlines()
    fields = dict(f.split("=", 1) for f in lines[0].split())
    assert fields["user"] == str(os.stat(d).st_uid) and fields["ls"] == "/bin/busybox", out
    gpu = fields["gpus"]
    assert fields["nvd"] == gpu and gpu in ("0", "1"), out
    # its own GPU's node and the control nodes, not the other GPU's
    assert lines[1] == f"DEV nvidia-uvm nvidia{gpu} nvidiactl", out
    assert "COMPLETED" in acct_fields(cluster, job_id)


@need_podman
def test_a_podman_job_exceeding_mem_ends_as_out_of_memory(cluster, image):
    d = user_dir(cluster.workdir, TEST_USER)
    job_id = cluster.submit(f"--container-image={d / image}", "--runtime=podman", "--mem=48M",
                            "-o", "oom-%j.out", "--wrap", "head -c 300m /dev/zero | tail > /dev/null; sleep 300",
                            cwd=d)
    job = cluster.wait_state(job_id, "OUT_OF_MEMORY", "COMPLETED", "FAILED", "CANCELLED", timeout=90)
    assert job["state"] == "OUT_OF_MEMORY", (job, (d / f"oom-{job_id}.out").read_text())
    shown = cluster.cli("hcontrol", "show", "job", str(job_id)).stdout
    assert "Reason=job exceeded its memory limit of 48 MiB" in shown, shown


@need_podman
def test_hcancel_of_a_podman_job_leaves_no_process_and_no_container(cluster, image):
    d = user_dir(cluster.workdir, TEST_USER)
    marker = "31777"
    job_id = cluster.submit(f"--container-image={d / image}", "--runtime=podman", "--grace=1", "-o", "cancel-%j.out",
                            "--wrap", f"sleep {marker} & setsid sleep {marker}1 & trap '' TERM; "
                            "echo ready > ready-$HAI_JOB_ID; while :; do sleep 0.1; done", cwd=d)
    wait_for(lambda: (d / f"ready-{job_id}").exists(), 60, what="the job to start")
    cluster.cli("hcancel", str(job_id))
    job = cluster.wait_state(job_id, "CANCELLED", "COMPLETED", "FAILED", timeout=90)
    assert job["state"] == "CANCELLED", job
    wait_for(lambda: not _procs_with(f"sleep {marker}"), 30, what="the job's processes to go")
    wait_for(lambda: not [n for n in podman_containers("hai-") if re.search(rf"-{job_id}-[0-9]+$", n)], 30,
             what="the container to be removed")


def _procs_with(text: str) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if text in p.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    out.append(int(p.name))
            except OSError:
                pass
    return out
