"""Prometheus text exposition (format 0.0.4) of the telemetry, on an opt-in TCP port
(controller.toml `[metrics] listen = "127.0.0.1:9464"`). Metrics only: GET /metrics, nothing
else; a tiny asyncio HTTP/1.0 responder, so no web framework is needed.

Every GPU series has node and gpu labels, plus job (empty when free); run series have job and
node labels. Values come from the latest sample per node."""
from __future__ import annotations

import asyncio
import logging
import math
from typing import Callable

from .. import timeouts
from .telemetry import TelemetryHub

log = logging.getLogger(__name__)

READ_LIMIT = 8192  # bytes of request head we read
READ_TIMEOUT = 5.0
SERVE_TIMEOUT = 10.0  # a whole request, the reply's drain included (a client that never reads)
# Connections served at once; beyond, a new one is closed unread. Without a cap, idle connections
# took every descriptor the controller had (fourth audit) and its own socket refused clients.
MAX_CONNECTIONS = 32
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (name, type, help, sample key, scale)
GPU_METRICS = (
    ("hai_gpu_utilization_percent", "gauge", "GPU utilization over the last sample period", "util", 1),
    ("hai_gpu_memory_used_bytes", "gauge", "GPU memory in use", "mem_used_mb", 1024 * 1024),
    ("hai_gpu_memory_total_bytes", "gauge", "GPU memory in all", "mem_total_mb", 1024 * 1024),
    ("hai_gpu_power_watts", "gauge", "GPU board power draw", "power_w", 1),
    ("hai_gpu_temperature_celsius", "gauge", "GPU core temperature", "temp_c", 1),
    ("hai_gpu_sm_clock_hertz", "gauge", "GPU SM clock", "sm_mhz", 1_000_000),
    ("hai_gpu_ecc_corrected_errors_total", "counter", "corrected (single-bit) ECC errors, volatile", "ecc_corrected", 1),
    ("hai_gpu_ecc_uncorrected_errors_total", "counter", "uncorrected (double-bit) ECC errors, volatile",
     "ecc_uncorrected", 1),
)
RUN_METRICS = (
    ("hai_job_gpu_memory_bytes", "gauge", "GPU memory of the job's processes on the node", "gpu_mem_mb", 1024 * 1024),
    ("hai_job_cpu_percent", "gauge", "CPU use of the job's processes on the node (100 = one CPU)", "cpu_pct", 1),
    ("hai_job_resident_memory_bytes", "gauge", "resident memory of the job's processes on the node", "rss_mb",
     1024 * 1024),
)


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: object) -> str:
    return "{" + ",".join(f'{k}="{escape(str(v))}"' for k, v in labels.items()) + "}"


def _value(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


def render(hub: TelemetryHub, nodes: list[str]) -> str:
    """The whole page, for the nodes given (the configured ones)."""
    lines: list[str] = []
    latest = {n: hub.latest(n) for n in nodes}
    holders: dict[tuple[str, int], int] = {}
    for node, s in latest.items():
        for r in (s or {}).get("runs", ()):
            for g in r["gpus"]:
                holders[(node, g)] = r["job_id"]

    def family(name: str, typ: str, help_: str) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {typ}")

    for name, typ, help_, key, scale in GPU_METRICS:
        family(name, typ, help_)
        for node, s in latest.items():
            for g in (s or {}).get("gpus", ()):
                if g[key] is not None:
                    job = holders.get((node, g["index"]), "")
                    lines.append(f"{name}{_labels(node=node, gpu=g['index'], job=job)} {_value(g[key] * scale)}")
    for name, typ, help_, key, scale in RUN_METRICS:
        family(name, typ, help_)
        for node, s in latest.items():
            for r in (s or {}).get("runs", ()):
                if r[key] is not None:
                    lines.append(f"{name}{_labels(node=node, job=r['job_id'], attempt=r['attempt'])} "
                                 f"{_value(r[key] * scale)}")
    family("hai_job_energy_joules_total", "counter", "energy drawn by the job's GPUs in its current run")
    for (job_id, attempt), rollup in sorted(hub.rollups.items()):
        lines.append(f"hai_job_energy_joules_total{_labels(job=job_id, attempt=attempt)} {_value(round(rollup.energy_j, 1))}")
    family("hai_job_gpu_idle", "gauge", "1 when the job's GPUs stayed under the idle threshold long enough")
    for job_id, attempt in sorted(hub.rollups):
        lines.append(f"hai_job_gpu_idle{_labels(job=job_id, attempt=attempt)} {int(hub.is_idle((job_id, attempt)))}")
    family("hai_node_last_sample_timestamp_seconds", "gauge", "time of the node's latest telemetry sample")
    for node, s in latest.items():
        if s is not None:
            lines.append(f"hai_node_last_sample_timestamp_seconds{_labels(node=node)} {_value(s['t'])}")
    family("hai_node_sample_cost_seconds", "gauge", "what the node's agent spent on its latest sample")
    for node, s in latest.items():
        if s is not None:
            lines.append(f"hai_node_sample_cost_seconds{_labels(node=node)} {_value(s['cost_ms'] / 1000)}")
    family("hai_telemetry_batches_dropped_total", "counter", "telemetry batches refused as malformed")
    lines.append(f"hai_telemetry_batches_dropped_total {hub.dropped}")
    return "\n".join(lines) + "\n"


def _response(status: str, body: str, content_type: str = "text/plain; charset=utf-8") -> bytes:
    data = body.encode()
    return (f"HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(data)}\r\n"
            f"Connection: close\r\n\r\n").encode() + data


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, page: Callable[[], str]) -> None:
    try:
        try:
            head = await timeouts.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
            writer.write(_response("400 Bad Request", "bad request\n"))
            return
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            writer.write(_response("400 Bad Request", "bad request\n"))
        elif parts[0] not in ("GET", "HEAD"):
            writer.write(_response("405 Method Not Allowed", "only GET\n"))
        elif parts[1].split("?", 1)[0] != "/metrics":
            writer.write(_response("404 Not Found", "metrics are at /metrics\n"))
        else:
            reply = _response("200 OK", page(), CONTENT_TYPE)
            writer.write(reply if parts[0] == "GET" else reply[:reply.index(b"\r\n\r\n") + 4])
        await writer.drain()
    except (ConnectionError, OSError):
        pass
    except Exception:  # never let a scrape take the controller down
        log.exception("metrics request failed")
    finally:
        writer.close()


async def start_metrics_server(listen: str, page: Callable[[], str],
                               max_connections: int = MAX_CONNECTIONS) -> asyncio.base_events.Server:
    host, _, port = listen.rpartition(":")
    open_now = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_now
        if open_now >= max_connections:
            writer.close()
            return
        open_now += 1
        try:
            await timeouts.wait_for(_serve(reader, writer, page), SERVE_TIMEOUT)
        except asyncio.TimeoutError:
            writer.close()
        finally:
            open_now -= 1

    server = await asyncio.start_server(serve, host.strip("[]"), int(port), limit=READ_LIMIT)
    log.info("Prometheus metrics on http://%s/metrics", listen)
    return server
