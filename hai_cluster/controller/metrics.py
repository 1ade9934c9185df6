"""Prometheus text exposition (format 0.0.4) of the telemetry, on an opt-in TCP port
(controller.toml `[metrics] listen = "127.0.0.1:9464"`). Metrics only: GET /metrics, nothing
else; a tiny asyncio HTTP/1.0 responder, so no web framework is needed.

Every GPU series has node and gpu labels, plus job_id (empty when free: `job` would collide with
the scrape target's own label, which Prometheus renames to exported_job); run series have job_id
and node labels. Shares are 0-1 `_ratio`s, CPU use in cores. Values come from the latest sample
per node; the queue, node and scheduler series from the controller's latest pass (QueueStats)."""
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
    ("hai_gpu_utilization_ratio", "gauge", "GPU utilization over the last sample period (0-1)", "util", 0.01),
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
    ("hai_job_cpu_cores", "gauge", "CPU use of the job's processes on the node, in CPUs busy", "cpu_pct", 0.01),
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


def render(hub: TelemetryHub, nodes: list[str], queue: QueueStats | None = None) -> str:
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
                    lines.append(f"{name}{_labels(node=node, gpu=g['index'], job_id=job)} {_value(g[key] * scale)}")
    for name, typ, help_, key, scale in RUN_METRICS:
        family(name, typ, help_)
        for node, s in latest.items():
            for r in (s or {}).get("runs", ()):
                if r[key] is not None:
                    lines.append(f"{name}{_labels(node=node, job_id=r['job_id'], attempt=r['attempt'])} "
                                 f"{_value(r[key] * scale)}")
    family("hai_job_energy_joules_total", "counter", "energy drawn by the job's GPUs in its current run")
    for (job_id, attempt), rollup in sorted(hub.rollups.items()):
        lines.append(f"hai_job_energy_joules_total{_labels(job_id=job_id, attempt=attempt)} "
                     f"{_value(round(rollup.energy_j, 1))}")
    family("hai_job_gpu_idle", "gauge", "1 when the job's GPUs stayed under the idle threshold long enough")
    for job_id, attempt in sorted(hub.rollups):
        lines.append(f"hai_job_gpu_idle{_labels(job_id=job_id, attempt=attempt)} {int(hub.is_idle((job_id, attempt)))}")
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
    if queue is not None:
        queue.render(family, lines.append)
    _process(family, lines.append)
    return "\n".join(lines) + "\n"


# Scheduler pass durations (seconds): the histogram's upper bounds
PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class QueueStats:
    """What the controller's latest pass saw, for the queue and node series, and the counters
    that only grow (passes, preemptions). Updated by the scheduler loop, read by a scrape."""

    def __init__(self) -> None:
        self.jobs: dict[tuple[str, str], int] = {}  # (state, reason) -> jobs
        self.pending_gpus = 0
        self.nodes: dict[str, str] = {}  # node -> up | drain | down | not_responding
        self.preemptions = 0
        self.bucket_counts = [0] * len(PASS_BUCKETS)
        self.pass_count, self.pass_sum = 0, 0.0

    def saw(self, snapshot, reasons: dict[int, str]) -> None:
        """A pass's snapshot and the pending reasons it decided (job id -> reason)."""
        counts: dict[tuple[str, str], int] = {}
        pending_gpus = 0
        for j in snapshot.jobs:
            state = j.state.value
            reason = reasons.get(j.id, j.hold_reason if j.hold else "") if state == "PENDING" else ""
            counts[(state, reason)] = counts.get((state, reason), 0) + 1
            if state == "PENDING":
                pending_gpus += j.gpus
        self.jobs, self.pending_gpus = counts, pending_gpus
        self.nodes = {n.name: n.state if n.responding else "not_responding" for n in snapshot.nodes}

    def timed(self, seconds: float) -> None:
        self.pass_count += 1
        self.pass_sum += seconds
        for i, bound in enumerate(PASS_BUCKETS):
            if seconds <= bound:
                self.bucket_counts[i] += 1

    def render(self, family, add) -> None:
        family("hai_jobs", "gauge", "jobs pending or holding resources, by state and pending reason")
        for (state, reason), n in sorted(self.jobs.items()):
            add(f"hai_jobs{_labels(state=state, reason=reason)} {n}")
        family("hai_pending_gpus", "gauge", "GPUs the pending jobs ask for")
        add(f"hai_pending_gpus {self.pending_gpus}")
        family("hai_node_state", "gauge", "1 for each node's state (up, drain, down, not_responding)")
        for node, state in sorted(self.nodes.items()):
            add(f"hai_node_state{_labels(node=node, state=state)} 1")
        family("hai_preemptions_total", "counter", "runs the controller told to checkpoint and leave their GPUs")
        add(f"hai_preemptions_total {self.preemptions}")
        family("hai_scheduler_pass_seconds", "histogram", "time of one scheduling pass (snapshot, policy, writes)")
        for bound, n in zip(PASS_BUCKETS, self.bucket_counts):
            add(f'hai_scheduler_pass_seconds_bucket{{le="{bound}"}} {n}')
        add(f'hai_scheduler_pass_seconds_bucket{{le="+Inf"}} {self.pass_count}')
        add(f"hai_scheduler_pass_seconds_sum {_value(round(self.pass_sum, 6))}")
        add(f"hai_scheduler_pass_seconds_count {self.pass_count}")


def _process(family, add) -> None:
    """The controller process's own series, as the Prometheus client libraries name them."""
    try:
        import psutil
        p = psutil.Process()
        with p.oneshot():
            cpu, rss, fds, started = sum(p.cpu_times()[:2]), p.memory_info().rss, p.num_fds(), p.create_time()
    except Exception:  # a scrape never fails for these
        return
    family("process_cpu_seconds_total", "counter", "user and system CPU time of the controller")
    add(f"process_cpu_seconds_total {_value(round(cpu, 3))}")
    family("process_resident_memory_bytes", "gauge", "resident memory of the controller")
    add(f"process_resident_memory_bytes {rss}")
    family("process_open_fds", "gauge", "open file descriptors of the controller")
    add(f"process_open_fds {fds}")
    family("process_start_time_seconds", "gauge", "start time of the controller, seconds since the epoch")
    add(f"process_start_time_seconds {_value(round(started, 3))}")


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
