"""Rows of the telemetry views, shared by `hinfo -N --gpus` and `hstat` (fetching stays in the
commands; this only turns the controller's reply into table rows)."""
from __future__ import annotations

import time

from .jobfields import nodelist
from .telemetry_fmt import energy, mib, num, pct, used_of_share

GPU_HEADERS = ["NODELIST", "GPU", "NAME", "JOBID", "UTIL", "MEM_USED", "MEM_TOTAL", "POWER", "TEMP", "SM_MHZ",
               "ECC(C/U)"]
GPU_RIGHT = [1, 3, 4, 5, 6, 7, 8, 9]
JOB_HEADERS = ["JOBID", "USER", "NAME", "ST", "NODELIST", "GPUS", "GPU_UTIL", "GPU_MEM", "CPU", "ENERGY", "IDLE"]
JOB_RIGHT = [0, 5, 6, 7, 8, 9]
NODE_HEADERS = ["NODE", "STATE", "GPUS(A/T)", "GPU_UTIL", "POWER", "SAMPLE_AGE", "SAMPLE_COST"]
NODE_RIGHT = [2, 3, 4, 5, 6]
# What a narrow terminal (80 columns) leaves out first, per table: `hinfo -N --gpus` and
# `hstat JOB` show the rest
GPU_DROPPABLE = ["SM_MHZ", "ECC(C/U)", "NAME", "MEM_TOTAL", "TEMP"]
JOB_DROPPABLE = ["ENERGY", "CPU", "IDLE", "NAME", "GPU_MEM"]
NODE_DROPPABLE = ["SAMPLE_COST", "SAMPLE_AGE"]


def _ecc(g: dict) -> str:
    if g["ecc_corrected"] is None and g["ecc_uncorrected"] is None:
        return "-"
    return f"{g['ecc_corrected'] if g['ecc_corrected'] is not None else '-'}/" \
           f"{g['ecc_uncorrected'] if g['ecc_uncorrected'] is not None else '-'}"


def gpu_rows(reply: dict) -> list[list[str]]:
    rows = []
    for n in reply["nodes"]:
        for g in n["gpus"]:
            rows.append([n["name"], str(g["index"]), g["name"], str(g["job_id"] or "-"), pct(g["util"]),
                         mib(g["mem_used_mb"]), mib(g["mem_total_mb"] if g["mem_total_mb"] is not None else g["memory_mb"]),
                         num(g["power_w"], "W"), num(g["temp_c"], "C"), num(g["sm_mhz"]), _ecc(g)])
    return rows


def node_rows(reply: dict) -> list[list[str]]:
    now = reply["now"]
    rows = []
    for n in reply["nodes"]:
        utils = [g["util"] for g in n["gpus"] if g["util"] is not None]
        power = [g["power_w"] for g in n["gpus"] if g["power_w"] is not None]
        alloc = sum(1 for g in n["gpus"] if g["job_id"] is not None)
        state = n["state"] + ("" if n["responding"] else "*")
        rows.append([n["name"], state, f"{alloc}/{len(n['gpus'])}",
                     pct(sum(utils) / len(utils)) if utils else "-", num(sum(power), "W") if power else "-",
                     f"{max(0.0, now - n['sample_t']):.0f}s" if n["sample_t"] else "-",
                     num(n["sample_cost_ms"], "ms", 1)])
    return rows


def job_rows(reply: dict) -> list[list[str]]:
    rows = []
    for j in reply["jobs"]:
        gpus = f"{j['gpu_charge']:g}" if j.get("gpu_charge") else str(j["nodes"] * j["gpus_per_node"])  # a share: 0.25
        rows.append([str(j["id"]), j["user"], j["name"], j["code"], nodelist(j), gpus,
                     pct(j.get("gpu_util")), used_of_share(j.get("gpu_mem_used_mb"), j.get("gpu_share_mb")),
                     pct(j.get("cpu_pct")),
                     energy(j.get("run_energy_j")) or "-", "idle" if j.get("idle") else "-"])
    return rows


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))
