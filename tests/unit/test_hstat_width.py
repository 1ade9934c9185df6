"""hstat at 80 columns: every table fits, by leaving out whole columns (a value is never cut)."""
from hai_cluster.cli.common import fit_columns
from hai_cluster.cli.hstat import tables


def reply():
    gpu = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "job_id": 123456, "util": 97.0, "mem_used_mb": 81000,
           "mem_total_mb": 81559, "memory_mb": 81559, "power_w": 690.0, "temp_c": 71.0, "sm_mhz": 1980,
           "ecc_corrected": 0, "ecc_uncorrected": 0}
    node = {"name": "gpu-node-017", "state": "up", "responding": True, "gpus": [gpu] * 8, "sample_t": 99.0,
            "sample_cost_ms": 3.2}
    job = {"id": 123456, "user": "researcher", "name": "llama-70b-sft-lr3e-5", "code": "R",
           "nodelist": "gpu-node-017,gpu-node-018", "nodes": 2, "gpus_per_node": 8, "gpu_util": 97.0,
           "gpu_mem_used_mb": 81000, "gpu_share_mb": None, "cpu_pct": 800.0, "run_energy_j": 3.6e9, "idle": False}
    return {"now": 100.0, "nodes": [node], "jobs": [job], "events": []}


def test_every_table_fits_80_columns_and_says_what_it_left_out():
    for title, headers, rows, right, dropped in tables(reply(), 80):
        widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
        assert sum(widths) + len(widths) - 1 <= 80, (title, headers)
        assert "NODELIST" in headers or "NODE" in headers
    gpus = tables(reply(), 80)[1]
    assert gpus[4][:2] == ["SM_MHZ", "ECC(C/U)"] and "UTIL" in gpus[1] and "JOBID" in gpus[1]
    assert tables(reply(), 1000)[1][4] == []  # wide enough: nothing left out


def test_fit_columns_keeps_alignment_of_what_stays():
    headers, rows, right, dropped = fit_columns(["A", "BBBBBBBB", "C"], [["1", "2", "3"]], [0, 2], ["BBBBBBBB"], 5)
    assert (headers, rows, right, dropped) == (["A", "C"], [["1", "3"]], [0, 1], ["BBBBBBBB"])
