"""The telemetry views of the CLI, fed with what the controller's view functions build."""
from __future__ import annotations

from hai_cluster.cli import hstat
from hai_cluster.cli.gpuview import gpu_rows, job_rows, node_rows
from hai_cluster.cli.hacct import FIELDS as ACCT
from hai_cluster.cli.jobfields import FIELDS as QUEUE
from hai_cluster.cli.telemetry_fmt import energy, mib, sparkline
from hai_cluster.config import TelemetryConfig
from hai_cluster.controller.telemetry import TelemetryHub
from hai_cluster.controller.telemetry_view import job_telemetry, nodes_telemetry
from hai_cluster.core.model import GpuInfo, NodeView
from hai_cluster.store.repository import RankRef


def reading(i, util):
    return {"index": i, "util": util, "mem_used_mb": 4096 if util else 0, "mem_total_mb": 81920,
            "power_w": 600.0 if util else 70.0, "temp_c": 70 if util else 32, "sm_mhz": 1980, "ecc_corrected": 0,
            "ecc_uncorrected": None}


def test_sparkline_and_units():
    assert sparkline([0, 50, 100, None]) == "▁▅█·"
    assert sparkline(list(range(100)), width=5) == sparkline(list(range(95, 100)))
    assert [mib(512), mib(8192), mib(3 * 1024 * 1024)] == ["512M", "8.0G", "3.0T"]
    assert [energy(None), energy(950), energy(12_345), energy(4.5e6)] == ["", "950", "12.3K", "4.5M"]


def test_views_from_the_controller_reply(capsys):
    hub = TelemetryHub(TelemetryConfig())
    for t in (100.0, 101.0, 102.0):
        hub.ingest("n1", {"v": 1, "node": "n1", "interval": 1.0, "samples": [{
            "t": t, "gpus": [reading(0, 90), reading(1, 0)], "cost_ms": 2.5,
            "runs": [{"job_id": 7, "attempt": 0, "gpus": [0], "gpu_mem_mb": 4096, "cpu_pct": 99.5, "rss_mb": 300,
                      "pids": 3}],
            "events": [{"t": t, "gpu": 1, "kind": "xid", "value": 79}] if t == 102.0 else []}]})
    view = NodeView("n1", (GpuInfo(0, "u0", "Sim H100", 81920), GpuInfo(1, "u1", "Sim H100", 81920)), 16, 1000)
    job = {"id": 7, "user": "alice", "name": "train", "code": "R", "state": "RUNNING", "nodelist": "n1", "nodes": 1,
           "gpus_per_node": 1, **hub.run_fields((7, 0))}
    reply = {"now": 103.0, **nodes_telemetry(hub, [{"name": "n1", "state": "up", "responding": True, "gpu_backend": "simulated",
                                                    "cpus": 16}], [view], [RankRef(7, 0, 0, "n1", (0,), "running")], [job],
                                             {"n1": True})}
    assert gpu_rows(reply) == [["n1", "0", "Sim H100", "7", "90%", "4.0G", "80.0G", "600W", "70C", "1980", "0/-"],
                               ["n1", "1", "Sim H100", "-", "0%", "0M", "80.0G", "70W", "32C", "1980", "0/-"]]
    assert node_rows(reply) == [["n1", "up", "1/2", "45%", "670W", "1s", "2.5ms"]]
    assert job_rows(reply) == [["7", "alice", "train", "R", "n1", "1", "90%", "4.0G", "100%", "1.8K", "-"]]
    hstat.print_cluster(reply)
    out = capsys.readouterr().out
    assert "node n1 GPU 1: xid (79)" in out and "Sim H100" in out
    assert [QUEUE[c][1](job, 0) for c in "gGI"] == ["90%", "4.0G", "-"]

    runs = [{"attempt": 0, "state": "RUNNING", "nodelist": "n1", "gpus": 1, "gpu_util_mean": 90.0, "gpu_util_max": 90.0,
             "gpu_mem_max_mb": 4096, "energy_j": 1800.0, "cpu_mean": 99.5, "telemetry_samples": 3}]
    hstat.print_job({"now": 103.0, **job_telemetry(hub, job, runs)})
    out = capsys.readouterr().out
    assert "job 7 (train, alice): RUNNING on n1" in out
    assert "|███|" in out  # three samples at 90 %
    assert out.count("90%") >= 3
    row = {**runs[0]}
    assert [ACCT[k](row) for k in ("gpuutil", "maxgpuutil", "maxgpumem", "energy", "avecpu")] == \
        ["90.0%", "90%", "4.0G", "1.8K", "99.5%"]
    assert [ACCT[k]({}) for k in ("gpuutil", "maxgpumem", "energy")] == ["", "", ""]  # no samples: empty


def test_hacct_charges_a_sharing_run_its_share():
    run = {"gpus": 0, "gpu_charge": 0.25, "start_time": 100.0, "end_time": 7300.0, "now": 9000.0}
    assert ACCT["allocgpus"](run) == "0.25" and ACCT["gpuhours"](run) == "0.50"  # 2 h x 0.25
    whole = {"gpus": 2, "gpu_charge": None, "start_time": 100.0, "end_time": 3700.0, "now": 9000.0}
    assert ACCT["allocgpus"](whole) == "2" and ACCT["gpuhours"](whole) == "2.00"


def test_sharing_jobs_show_memory_in_use_against_their_share():
    from hai_cluster.cli.telemetry_fmt import used_of_share
    assert used_of_share(4198, 20480) == "4.1G/20.0G" and used_of_share(4198, None) == "4.1G"
    job = {"gpu_mem_used_mb": 4096, "gpu_share_mb": 8192}
    assert QUEUE["G"][1](job, 0.0) == "4.0G/8.0G"
    row = {"id": 3, "user": "u", "name": "n", "code": "R", "nodelist": "a", "nodes": 1, "gpus_per_node": 0,
           "gpu_charge": 0.25, "gpu_mem_used_mb": 4096, "gpu_share_mb": 20480}
    assert job_rows({"jobs": [row]})[0][5:8] == ["0.25", "-", "4.0G/20.0G"]
