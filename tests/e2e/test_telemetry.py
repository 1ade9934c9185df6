"""GPU telemetry end to end: simulated GPUs on agents behind sshd -> the controller -> hstat,
hqueue, hinfo while the job runs, and its rollups in hacct after it ended."""
from __future__ import annotations

import re
import socket
import urllib.request

import pytest

from .harness import TEST_USER, start_ssh_cluster, user_dir, wait_for

# The simulated GPUs a run holds report 90 % and 4096 MiB each; 95 % counts as idle here, so the
# idle flag shows after a second as well.
AGENT = "[telemetry]\ninterval = 0.5\nsimulated_util = 90\nsimulated_process_memory_mb = 4096\n"
CONTROLLER = "[telemetry]\npersist_interval = 1\nidle_util_below = 95\nidle_after = 1\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def metrics_port():
    return free_port()


@pytest.fixture(scope="module")
def cluster(ssh_nodes, metrics_port):
    c = start_ssh_cluster(ssh_nodes, gpus_per_node=2, agent_toml=AGENT,
                          controller_toml=CONTROLLER + f'[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n')
    yield c
    c.close()


def test_running_job_telemetry_reaches_hstat_hqueue_hinfo_prometheus_and_hacct(cluster, metrics_port):
    d = user_dir(cluster.workdir, TEST_USER)
    stop = d / "stop-telemetry"
    script = d / "busy.sh"
    script.write_text(f"#!/bin/bash\n#HAI --gpus-per-node=2\nwhile [ ! -e {stop} ]; do sleep 0.2; done\n")
    job_id = cluster.submit(str(script))
    job = cluster.wait_state(job_id, "RUNNING")
    node = job["nodelist"]

    def queue_line():
        out = cluster.cli("hqueue", "-h", "-j", str(job_id), "-o", "%i %g %G %I").stdout.split()
        return out if out[1:] == ["90%", "8.0G", "idle"] else None
    assert wait_for(queue_line, 60, 0.5, "hqueue to show the job's GPU telemetry") == [str(job_id), "90%", "8.0G", "idle"]

    once = cluster.cli("hstat", "--once").stdout
    jobs_table = once[once.index("JOBID USER"):]
    assert re.search(rf"^\s*{job_id}\s+{TEST_USER}\s+busy.sh\s+R\s+{node}\s+2\s+90%\s+8.0G\s+\S+\s+\S+\s+idle$",
                     jobs_table, re.M), once
    gpus = cluster.cli("hinfo", "-N", "--gpus", "-h").stdout.splitlines()
    mine = [line.split() for line in gpus if line.split()[0] == node]
    assert len(mine) == 2  # one row per GPU of the node
    assert sum(1 for line in gpus if f" {job_id} " in line and " 90% " in line) == 2, gpus
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as page:
        metrics = page.read().decode()
    for g in (0, 1):
        assert f'hai_gpu_utilization_ratio{{node="{node}",gpu="{g}",job_id="{job_id}"}} 0.9\n' in metrics, metrics
    assert f'hai_job_gpu_idle{{job_id="{job_id}",attempt="0"}} 1\n' in metrics
    assert 'hai_jobs{state="RUNNING",reason=""} ' in metrics and "hai_scheduler_pass_seconds_count " in metrics
    history = cluster.cli("hstat", str(job_id)).stdout
    assert "GPU utilization, last" in history and "▇" in history, history

    stop.touch()
    cluster.wait_state(job_id, "COMPLETED")
    acct = cluster.cli("hacct", "-X", "-j", str(job_id), "-P", "-n", "-o",
                       "JobID,State,GPUUtil,MaxGPUUtil,MaxGPUMem,Energy").stdout.strip()
    jid, state, util, top, mem, joules = acct.split("|")
    assert (jid, state, util, top, mem) == (str(job_id), "COMPLETED", "90.0%", "90%", "8.0G"), acct
    assert joules and float(joules.rstrip("KMG")) > 0, acct
    # the ended job's run and history stay visible in hstat JOB
    after = cluster.cli("hstat", str(job_id)).stdout
    assert "COMPLETED" in after and "90.0%" in after, after
