"""The agent's sampler on the simulated GPUs: the same NVML calls it makes on real ones."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hai_cluster.agent.gpus import MIB
from hai_cluster.agent.simgpu import SimulatedTelemetryNvml
from hai_cluster.agent.telemetry import EVENT_XID, RunRef, Sampler, process_groups


def fake(occupancy, **kw) -> SimulatedTelemetryNvml:
    return SimulatedTelemetryNvml("n1", 4, "Sim", 81920, occupancy=occupancy, **kw)


@pytest.fixture
def busy_job():
    """A real process group leader that burns CPU, as a job's main process would."""
    proc = subprocess.Popen([sys.executable, "-c", "import os\nwhile True: os.getpid()"],
                            start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def test_sample_reads_every_gpu_and_maps_processes_to_runs(busy_job, tmp_path):
    run = RunRef(7, 0, (1, 2), busy_job.pid, tmp_path)
    sampler = Sampler(fake(lambda: {1: [busy_job.pid], 2: [busy_job.pid]}, busy_util=80, process_memory_mb=2048),
                      "n1", 1.0, 10)
    sampler.open()
    try:
        first = sampler.sample([run])
        time.sleep(0.3)
        second = sampler.sample([run])
    finally:
        sampler.close()
    gpus = {g["index"]: g for g in second["gpus"]}
    assert sorted(gpus) == [0, 1, 2, 3]
    assert gpus[1]["util"] == gpus[2]["util"] == 80 and gpus[0]["util"] == gpus[3]["util"] == 0
    assert gpus[1]["mem_used_mb"] == 2048 and gpus[0]["mem_used_mb"] == 0 and gpus[0]["mem_total_mb"] == 81920
    assert gpus[1]["power_w"] > gpus[0]["power_w"] > 0
    assert gpus[1]["temp_c"] > gpus[0]["temp_c"] and gpus[1]["sm_mhz"] > gpus[0]["sm_mhz"]
    assert gpus[0]["ecc_corrected"] == 0 and gpus[0]["ecc_uncorrected"] == 0
    (reading,) = second["runs"]
    assert (reading["job_id"], reading["attempt"], reading["gpus"]) == (7, 0, [1, 2])
    assert reading["gpu_mem_mb"] == 2 * 2048  # its process on both GPUs
    assert reading["pids"] >= 1 and reading["rss_mb"] > 0
    assert first["runs"][0]["cpu_pct"] is None  # no interval yet
    assert reading["cpu_pct"] > 0  # the busy loop burnt CPU between the two samples
    assert second["cost_ms"] > 0 and second["events"] == []


def test_processes_of_other_runs_are_not_counted(busy_job, tmp_path):
    stranger = 999_999_999
    sampler = Sampler(fake(lambda: {0: [busy_job.pid, stranger]}), "n1", 1.0, 10)
    sampler.open()
    try:
        s = sampler.sample([RunRef(1, 0, (0,), busy_job.pid, tmp_path)])
    finally:
        sampler.close()
    assert s["runs"][0]["gpu_mem_mb"] == 4096 // 2  # two processes share the simulated 4 GiB


def test_run_pids_follow_the_process_group(tmp_path):
    leader = subprocess.Popen(["bash", "-c", "sleep 30 & sleep 30 & wait"], start_new_session=True)
    try:
        time.sleep(0.3)
        assert len(process_groups()[leader.pid]) == 3
        sampler = Sampler(fake(lambda: {}), "n1", 1.0, 10)
        sampler.open()
        (reading,) = sampler.sample([RunRef(1, 0, (), leader.pid, tmp_path)])["runs"]
        sampler.close()
        assert reading["pids"] == 3
    finally:
        subprocess.run(["pkill", "-KILL", "-g", str(leader.pid)])
        leader.wait()


def test_unsupported_readings_are_none_not_errors(tmp_path):
    class NoPower(SimulatedTelemetryNvml):
        def nvmlDeviceGetPowerUsage(self, handle):
            raise self.NVMLError_NotSupported("not supported")
    sampler = Sampler(NoPower("n1", 2, "Sim", 1000, occupancy=dict), "n1", 1.0, 10)
    sampler.open()
    s = sampler.sample([])
    sampler.close()
    assert [g["power_w"] for g in s["gpus"]] == [None, None]
    assert [g["util"] for g in s["gpus"]] == [0, 0]


class Data:
    def __init__(self, kind, device, value):
        self.eventType, self.device, self.eventData = kind, device, value


class WithEvents(SimulatedTelemetryNvml):
    """NVML with an event set that delivers one XID 79 on GPU 1, then only timeouts."""
    class NVMLError_Timeout(SimulatedTelemetryNvml.NVMLError):
        pass

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.queue = [Data(EVENT_XID, 1, 79)]
        self.registered, self.freed = [], 0

    def nvmlEventSetCreate(self):
        return "set"

    def nvmlDeviceGetSupportedEventTypes(self, handle):
        return EVENT_XID | 0x4 if handle == 1 else 0x4  # GPU 0: no XID or ECC events at all

    def nvmlDeviceRegisterEvents(self, handle, types, event_set):
        self.registered.append((handle, types))

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        if self.queue:
            return self.queue.pop()
        time.sleep(timeout_ms / 10000)
        raise self.NVMLError_Timeout("timeout")

    def nvmlDeviceGetIndex(self, handle):
        return handle

    def nvmlEventSetFree(self, event_set):
        self.freed += 1


def test_xid_events_come_with_the_next_sample(tmp_path):
    nvml = WithEvents("n1", 2, "Sim", 1000, occupancy=dict)
    sampler = Sampler(nvml, "n1", 1.0, 10)
    sampler.open()
    try:
        deadline = time.monotonic() + 30
        while not sampler.events and time.monotonic() < deadline:
            time.sleep(0.01)
        s = sampler.sample([])
        assert [(e["gpu"], e["kind"], e["value"]) for e in s["events"]] == [(1, "xid", 79)]
        assert sampler.sample([])["events"] == []
    finally:
        sampler.close()
    assert nvml.registered == [(1, EVENT_XID)] and nvml.freed == 1  # only what each GPU supports


def test_undelivered_samples_wait_in_a_bounded_ring(tmp_path):
    sampler = Sampler(fake(dict), "n1", 0.01, 5)
    delivered: list[list[dict]] = []
    online = False

    async def send(batch):
        if online:
            delivered.append(batch["samples"])
        return online

    async def main():
        nonlocal online
        task = asyncio.create_task(sampler.run(list, send))
        while sampler.seq < 12:
            await asyncio.sleep(0.01)
        online = True  # the controller comes back: only what the ring still holds is sent
        while not delivered:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    asyncio.run(main())
    first = delivered[0]
    assert 1 <= len(first) <= 5  # the ring keeps 5; older samples are a gap
    times = [s["t"] for batch in delivered for s in batch]
    assert times == sorted(times) and len(times) == len(set(times))
    assert sampler.sent == sampler.seq or sampler.sent == sampler.seq - 1


def test_agent_config(tmp_path):
    from hai_cluster.config import ConfigError, load_agent_config
    path = tmp_path / "a.toml"
    path.write_text('[agent]\nname = "n1"\n[telemetry]\ninterval = 1\nsimulated_util = 40\n')
    t = load_agent_config(path).telemetry
    assert (t.enabled, t.interval, t.simulated_util, t.history) == (True, 1.0, 40, 720)
    for text, words in (("interval = 0", "positive"), ("simulated_util = 101", "percentage"),
                        ("enabled = 1", "true or false"), ("rate = 2", "unknown")):
        path.write_text(f'[agent]\nname = "n1"\n[telemetry]\n{text}\n')
        with pytest.raises(ConfigError, match=words):
            load_agent_config(path)
