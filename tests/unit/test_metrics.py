"""The Prometheus page: text format 0.0.4, node/gpu/job labels, and the tiny HTTP responder."""
from __future__ import annotations

import asyncio
import re

import pytest

from hai_cluster.config import ConfigError, TelemetryConfig, load_controller_config
from hai_cluster.controller.metrics import QueueStats, escape, render, start_metrics_server
from hai_cluster.core.model import GpuInfo, JobView, NodeView, Snapshot
from hai_cluster.core.states import JobState
from hai_cluster.controller.telemetry import TelemetryHub

LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\n"])*"'
                  r'(,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\n"])*")*)?\})? (-?[0-9.e+]+|[+-]Inf|NaN)$')


def gpu(i, util, power):
    return {"index": i, "util": util, "mem_used_mb": 1024, "mem_total_mb": 81920, "power_w": power, "temp_c": 60,
            "sm_mhz": 1980, "ecc_corrected": 3, "ecc_uncorrected": None}


def hub_with_samples() -> TelemetryHub:
    hub = TelemetryHub(TelemetryConfig(idle_util_below=50, idle_after=1))
    for t in (10.0, 12.0):
        hub.ingest('n"1', {"v": 1, "node": 'n"1', "interval": 2.0, "samples": [{
            "t": t, "gpus": [gpu(0, 30, 300.5), gpu(1, 0, 70.0)], "events": [], "cost_ms": 1.5,
            "runs": [{"job_id": 42, "attempt": 1, "gpus": [0], "gpu_mem_mb": 1024, "cpu_pct": 12.5, "rss_mb": 2,
                      "pids": 1}]}]})
    return hub


def parse(text: str) -> dict[str, float]:
    """name{labels} -> value; fails on any line that is not valid exposition format."""
    assert text.endswith("\n")
    values, typed = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, typ = line.split()[2:4]
            assert typ in ("gauge", "counter", "histogram") and name not in typed
            typed.add(name)
            if typ == "histogram":
                typed |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
            continue
        if line.startswith("# HELP "):
            continue
        m = LINE.match(line)
        assert m, f"not exposition format: {line!r}"
        assert m[1] in typed, f"{m[1]} has no TYPE line before it"
        values[line.rsplit(" ", 1)[0]] = float(m[5])
    return values


def test_page_format_and_labels():
    text = render(hub_with_samples(), ['n"1', "n2"])
    v = parse(text)
    node = 'node="n\\"1"'
    assert v[f'hai_gpu_utilization_ratio{{{node},gpu="0",job_id="42"}}'] == 0.3
    assert v[f'hai_gpu_utilization_ratio{{{node},gpu="1",job_id=""}}'] == 0
    assert v[f'hai_gpu_power_watts{{{node},gpu="0",job_id="42"}}'] == 300.5
    assert v[f'hai_gpu_memory_total_bytes{{{node},gpu="1",job_id=""}}'] == 81920 * 1024 * 1024
    assert v[f'hai_gpu_sm_clock_hertz{{{node},gpu="0",job_id="42"}}'] == 1.98e9
    assert v[f'hai_gpu_ecc_corrected_errors_total{{{node},gpu="0",job_id="42"}}'] == 3
    assert not any(k.startswith("hai_gpu_ecc_uncorrected_errors_total{") for k in v)  # unsupported: absent, not 0
    assert v[f'hai_job_cpu_cores{{{node},job_id="42",attempt="1"}}'] == 0.125
    assert v['hai_job_energy_joules_total{job_id="42",attempt="1"}'] == pytest.approx(300.5 * 2 * 2)
    assert v['hai_job_gpu_idle{job_id="42",attempt="1"}'] == 1
    assert v[f'hai_node_last_sample_timestamp_seconds{{{node}}}'] == 12.0
    assert not any('node="n2"' in k for k in v)  # no sample yet: no series
    assert escape('a\\b\n"c"') == 'a\\\\b\\n\\"c\\"'


def test_http_endpoint():
    async def main():
        server = await start_metrics_server("127.0.0.1:0", lambda: render(hub_with_samples(), ['n"1']))
        port = server.sockets[0].getsockname()[1]

        async def ask(raw: bytes) -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(raw)
            await writer.drain()
            data = await reader.read()
            writer.close()
            return data
        try:
            ok = await ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            head, body = ok.split(b"\r\n\r\n", 1)
            assert head.startswith(b"HTTP/1.0 200 OK") and b"version=0.0.4" in head
            assert f"Content-Length: {len(body)}".encode() in head
            parse(body.decode())
            assert (await ask(b"GET / HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.0 404")
            assert (await ask(b"POST /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.0 405")
            assert (await ask(b"\x00\xff garbage\r\n\r\n")).startswith(b"HTTP/1.0 400")
            assert (await ask(b"A" * 20000)).startswith(b"HTTP/1.0 400")  # no end of head within the limit
            assert (await ask(b"GET /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.0 200")  # still serving
        finally:
            server.close()
            await server.wait_closed()
    asyncio.run(main())


def test_idle_connections_beyond_the_cap_are_closed_unread():
    """Fourth audit: idle connections took every descriptor the controller had."""
    async def main():
        server = await start_metrics_server("127.0.0.1:0", lambda: "up 1\n", max_connections=4)
        port = server.sockets[0].getsockname()[1]
        try:
            idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
            await asyncio.sleep(0.2)  # the four are being served: waiting for their request heads
            extra_reader, extra_writer = await asyncio.open_connection("127.0.0.1", port)
            assert await asyncio.wait_for(extra_reader.read(), 5) == b""  # closed at once, unread
            extra_writer.close()
            for reader, _ in idle:  # the ones in the cap are still open (their read times out later)
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(reader.read(1), 0.2)
            for _, writer in idle:
                writer.close()
            await asyncio.sleep(0.2)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /metrics HTTP/1.1\r\n\r\n")
            assert (await asyncio.wait_for(reader.read(), 5)).startswith(b"HTTP/1.0 200")  # room again
            writer.close()
        finally:
            server.close()
            await server.wait_closed()
    asyncio.run(main())


def test_config(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[metrics]\nlisten = "127.0.0.1:9464"\n[telemetry]\nidle_util_below = 5\nidle_after = 60\n')
    cfg = load_controller_config(path).telemetry
    assert (cfg.metrics_listen, cfg.idle_util_below, cfg.idle_after) == ("127.0.0.1:9464", 5.0, 60.0)
    assert load_controller_config(tmp_path / "c.toml").telemetry.history == 720
    for text, words in (('[metrics]\nlisten = "9464"\n', "host:port"), ('[metrics]\nlisten = "h:99999"\n', "host:port"),
                        ("[telemetry]\nidle_util_below = 150\n", "percentage"), ("[telemetry]\nbogus = 1\n", "unknown"),
                        ("[telemetry]\npersist_interval = 0\n", "positive")):
        path.write_text(text)
        with pytest.raises(ConfigError, match=words):
            load_controller_config(path)


def test_queue_node_scheduler_and_process_series():
    q = QueueStats()
    jobs = (JobView(id=1, user="u", state=JobState.PENDING, submit_time=0, nodes=2, gpus_per_node=4),
            JobView(id=2, user="u", state=JobState.PENDING, submit_time=0, nodes=1, gpus_per_node=1, hold=True),
            JobView(id=3, user="u", state=JobState.RUNNING, submit_time=0, nodes=1, gpus_per_node=2))
    nodes = (NodeView(name="a", gpus=(GpuInfo(0, "a0", "sim", 1),), cpus=1, mem_mb=1),
             NodeView(name="b", gpus=(), cpus=1, mem_mb=1, state="drain"),
             NodeView(name="c", gpus=(), cpus=1, mem_mb=1, responding=False))
    q.saw(Snapshot(now=0, jobs=jobs, nodes=nodes), {1: "Resources"})
    q.timed(0.003)
    q.timed(0.2)
    q.preemptions = 2
    v = parse(render(hub_with_samples(), ['n"1'], q))
    assert v['hai_jobs{state="PENDING",reason="Resources"}'] == 1
    assert v['hai_jobs{state="PENDING",reason="JobHeldUser"}'] == 1 and v['hai_jobs{state="RUNNING",reason=""}'] == 1
    assert v["hai_pending_gpus"] == 9 and v["hai_preemptions_total"] == 2
    assert v['hai_node_state{node="b",state="drain"}'] == 1 and v['hai_node_state{node="c",state="not_responding"}'] == 1
    assert v['hai_scheduler_pass_seconds_bucket{le="0.005"}'] == 1 and v['hai_scheduler_pass_seconds_bucket{le="0.25"}'] == 2
    assert v['hai_scheduler_pass_seconds_bucket{le="+Inf"}'] == 2 and v["hai_scheduler_pass_seconds_count"] == 2
    assert v["process_resident_memory_bytes"] > 0 and v["process_open_fds"] > 0


def test_the_grafana_dashboard_asks_only_for_series_the_page_serves():
    import json
    from pathlib import Path
    dash = json.loads((Path(__file__).parents[2] / "conf" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    q = QueueStats()
    q.timed(0.01)
    served = {line.split()[2] for line in render(hub_with_samples(), ['n"1'], q).splitlines()
              if line.startswith("# TYPE ")}
    served |= {f"{name}_bucket" for name in served}  # a histogram's series
    asked = {m for e in exprs for m in re.findall(r"\b(?:hai|process)_[a-z_]+", e)}
    assert asked and asked <= served, sorted(asked - served)
    assert {"hai_jobs", "hai_pending_gpus", "hai_node_state", "hai_scheduler_pass_seconds_bucket"} <= asked
    assert not any("job=" in e or "exported_job" in e for e in exprs)  # job_id, not the scrape target's job
