"""Containers end to end: hsubmit --container-image/--runtime as an ordinary user, through the
controller and SSH to the agents, a busybox image (built here) run by bubblewrap and by runc;
the output file, hacct's state, and --mem enforced as OUT_OF_MEMORY."""
from __future__ import annotations

import os

import pytest

from tests.integration.test_agent_containers import busybox_rootfs

from .harness import TEST_USER, start_ssh_cluster, user_dir

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster(ssh_nodes):
    c = start_ssh_cluster(ssh_nodes, gpus_per_node=2)
    yield c
    c.close()


@pytest.fixture(scope="module")
def image(cluster):
    """The image in the user's directory (relative --container-image paths start from there)."""
    d = user_dir(cluster.workdir, TEST_USER)
    busybox_rootfs(d / "busybox-root")
    os.chmod(d, 0o755)
    return "busybox-root"


def acct_fields(cluster, job_id: int) -> list[str]:
    lines = cluster.cli("hacct", "-j", str(job_id), "-P", "-n").stdout.strip().splitlines()
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


def test_exceeding_mem_ends_the_job_as_out_of_memory(cluster, image):
    d = user_dir(cluster.workdir, TEST_USER)
    job_id = cluster.submit(f"--container-image={image}", "--runtime=runc", "--mem=48M", "-o", "oom-%j.out",
                            "--wrap", "head -c 300m /dev/zero | tail > /dev/null; sleep 300", cwd=d)
    job = cluster.wait_state(job_id, "OUT_OF_MEMORY", "COMPLETED", "FAILED", "CANCELLED", timeout=90)
    assert job["state"] == "OUT_OF_MEMORY", job
    assert "OUT_OF_MEMORY" in acct_fields(cluster, job_id)
    shown = cluster.cli("hcontrol", "show", "job", str(job_id)).stdout
    assert "Reason=job exceeded its memory limit of 48 MiB" in shown, shown
