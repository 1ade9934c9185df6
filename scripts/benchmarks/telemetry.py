"""Telemetry ingestion on the controller: how many nodes x 8 GPUs at 1 sample/s one controller
absorbs, and at what CPU cost.

Batches are what agents send (one sample of 8 GPUs and 2 runs per node per push, made by the real
sampler on simulated GPUs, then varied per node and time). Two measures, CPU time of this process:
  - ingest: frame decode (msgpack) + strict check + rollups + ring, per node-sample;
  - link: the whole event path over an in-memory RpcConnection pair (the agent side's framing
    included, which makes it an upper bound), per node-sample.
The SSH transport's own cost (asyncssh decryption per frame) is not included."""
from __future__ import annotations

import asyncio
import copy
import tempfile
import time
from pathlib import Path

from hai_cluster.agent.simgpu import SimulatedTelemetryNvml
from hai_cluster.agent.telemetry import RunRef, Sampler
from hai_cluster.config import TelemetryConfig
from hai_cluster.controller.telemetry import TelemetryHub
from hai_cluster.protocol import messages
from hai_cluster.protocol.codec import FrameDecoder, encode_frame
from hai_cluster.transport.memory import memory_pair
from hai_cluster.transport.rpc import RpcConnection


def template() -> dict:
    """One real sample of 8 simulated GPUs with two 4-GPU runs (taken with the agent's sampler)."""
    nvml = SimulatedTelemetryNvml("bench", 8, "Simulated H100 80GB", 81920,
                                  occupancy=lambda: {g: [1000 + g // 4] for g in range(8)})
    sampler = Sampler(nvml, "bench", 1.0, 10)
    sampler.open()
    d = Path(tempfile.mkdtemp())
    s = sampler.sample([RunRef(1, 0, (0, 1, 2, 3), None, d), RunRef(2, 0, (4, 5, 6, 7), None, d)])
    sampler.close()
    for r in s["runs"]:
        r["cpu_pct"], r["pids"], r["gpu_mem_mb"] = 350.0, 12, 16384
    return s


def batches(nodes: int, seconds: int) -> list[tuple[str, bytes]]:
    """Frames as the agents would send them: per second, one batch per node."""
    base = template()
    out = []
    for t in range(seconds):
        for n in range(nodes):
            s = copy.deepcopy(base)
            s["t"] = 1_000_000.0 + t
            for g in s["gpus"]:
                g["util"] = (n * 7 + t * 13 + g["index"]) % 101
            for r in s["runs"]:
                r["job_id"] = n * 2 + r["job_id"]
            name = f"n{n:05d}"
            body = {"v": 1, "node": name, "interval": 1.0, "samples": [s]}
            out.append((name, encode_frame(messages.event("telemetry", body))))
    return out


def measure_ingest(nodes: int, seconds: int) -> dict:
    frames = batches(nodes, seconds)
    hub = TelemetryHub(TelemetryConfig(idle_util_below=5.0, idle_after=60.0))
    decoder = FrameDecoder()
    c0 = time.process_time()
    for node, frame in frames:
        for raw in decoder.feed(frame):
            msg = messages.parse_message(raw)
            hub.ingest(node, msg.body)
    cpu = time.process_time() - c0
    assert hub.received == len(frames) and hub.dropped == 0
    rows = time.process_time()
    hub.dirty_rows()  # what the persist task collects every persist_interval
    rows = time.process_time() - rows
    return {"nodes": nodes, "samples": len(frames), "cpu_s": cpu, "per_sample_us": cpu / len(frames) * 1e6,
            "rollup_rows_ms": rows * 1000, "bytes_per_sample": sum(len(f) for _, f in frames) / len(frames)}


def measure_memory(nodes: int = 50, seconds: int = 40) -> float:
    """Bytes of Python heap per kept sample (the rings hold `history` samples per node)."""
    import tracemalloc
    frames = [(n, messages.parse_message(next(iter(FrameDecoder().feed(f)))).body) for n, f in batches(nodes, seconds)]
    hub = TelemetryHub(TelemetryConfig(history=seconds))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for node, body in frames:
        hub.ingest(node, copy.deepcopy(body))  # what the decoder hands over: fresh objects
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return used / len(frames)


def measure_link(nodes: int, seconds: int) -> dict:
    frames = [(n, messages.parse_message(next(iter(FrameDecoder().feed(f)))).body) for n, f in batches(nodes, seconds)]
    hub = TelemetryHub(TelemetryConfig())

    async def main() -> float:
        (ra, wa), (rb, wb) = memory_pair()
        got = asyncio.Event()

        async def on_event(name, body):
            hub.ingest(body["node"], body)
            if hub.received == len(frames):
                got.set()
        agent = RpcConnection(ra, wa, name="agent")
        controller = RpcConnection(rb, wb, on_event=on_event, name="controller")
        reader = asyncio.create_task(controller.run())
        c0 = time.process_time()
        for i, (_node, body) in enumerate(frames):
            await agent.push("telemetry", body)
            if i % 200 == 0:
                await asyncio.sleep(0)
        await got.wait()
        cpu = time.process_time() - c0
        reader.cancel()
        await controller.close()
        await agent.close()
        return cpu
    cpu = asyncio.run(main())
    return {"nodes": nodes, "samples": len(frames), "cpu_s": cpu, "per_sample_us": cpu / len(frames) * 1e6}


def section(args=None) -> str:
    seconds = 5
    rows = []
    for nodes in (100, 1000):
        ing = measure_ingest(nodes, seconds)
        link = measure_link(nodes, seconds)
        rows.append((nodes, ing, link))
    worst = max(link["per_sample_us"] for _, _, link in rows)
    lines = ["| nodes x 8 GPUs | node-samples | ingest CPU per sample | whole event path per sample | "
             "CPU at 1 sample/s (event path) | frame size |", "|---|---|---|---|---|---|"]
    for nodes, ing, link in rows:
        lines.append(f"| {nodes} | {ing['samples']} | {ing['per_sample_us']:.0f} µs | {link['per_sample_us']:.0f} µs | "
                     f"{nodes * link['per_sample_us'] / 1e4:.1f} % of a core | {ing['bytes_per_sample']:.0f} B |")
    capacity = int(1e6 / worst)
    per_sample = measure_memory()
    history = TelemetryConfig().history
    return ("### Telemetry ingestion on the controller\n\n"
            "Agents' batches (one sample of 8 GPUs and 2 runs per node per second, from the real sampler on "
            "simulated GPUs) fed to the controller's telemetry hub: msgpack decode, strict check, rollups "
            "and rings (`scripts/benchmarks/telemetry.py`). The event path adds the RPC connection (both "
            "ends in this process, so an upper bound); SSH decryption is not included.\n\n"
            + "\n".join(lines)
            + f"\n\nCPU-wise one controller core absorbs about **{capacity} nodes x 8 GPUs at 1 sample/s** "
            f"(at the default 5 s interval, five times as many); the SSH links (one asyncssh connection per "
            f"node) come on top. Memory is the tighter bound: a kept sample costs about "
            f"{per_sample / 1024:.1f} KiB of Python heap, so the default history of {history} samples is "
            f"{per_sample * history / 2**20:.1f} MiB per node (1,000 nodes: {per_sample * history * 1000 / 2**30:.1f} GiB); "
            f"lower `[telemetry] history` for large clusters at short intervals. Collecting the live runs' "
            f"rollups for the store (every persist_interval) took {rows[-1][1]['rollup_rows_ms']:.0f} ms for "
            f"{rows[-1][0] * 2} runs, plus one executemany.")


if __name__ == "__main__":
    print(section())
