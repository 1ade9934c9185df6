"""Shepherd start, fork (the zygote) against exec (a fresh interpreter): a real hai-agent per round,
rounds alternating between the two modes so that a noisy machine weighs on both alike.

    .venv/bin/python scripts/benchmarks/shepherd_start.py [--jobs 40] [--reps 3]

Per round: a fresh agent (`[agent] shepherd_start` = the mode), in a cgroup of its own with
everything it starts (cgroups for runs off, so the shepherds and jobs stay in it), three warm-up
jobs (the zygote's start is not counted), then --jobs trivial jobs one after the other:
`start_run` (it returns once the shepherd's launch report is in), the end, `forget_run`. Measured:
the `start_run` call's wall time (p50, p95) and the cgroup's CPU time per job (the agent, the
zygote, the shepherds and the jobs: the modes differ only in the launch); then CPU per launch
alone: up to 20 jobs that only sleep, started one after the other, measured to the last launch
report. Then --drain: a held array of trivial tasks released at once on a local cluster (jobs/s
from the first start to the last end, and how long a task held its slot). Needs root and the test
venv (the agent tests' sandbox and client, the e2e harness). Prints markdown tables.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.integration.agent_helpers import Client, Sandbox, wait_for  # noqa: E402

JOB = "#!/bin/sh\nexit 0\n"
SLEEPER = "#!/bin/sh\nexec sleep 600\n"


class CpuCgroup:
    """A cgroup that counts the CPU time of everything in it (v1 cpuacct, or v2)."""

    def __init__(self, name: str) -> None:
        v1 = Path("/sys/fs/cgroup/cpuacct")
        if v1.is_dir():
            self.path, self.v2 = v1 / name, False
        else:
            self.path, self.v2 = Path("/sys/fs/cgroup") / name, True
        self.path.mkdir()

    def usage_s(self) -> float:
        if not self.v2:
            return int((self.path / "cpuacct.usage").read_text()) / 1e9
        for line in (self.path / "cpu.stat").read_text().splitlines():
            key, value = line.split()
            if key == "usage_usec":
                return int(value) / 1e6
        raise RuntimeError("no usage_usec in cpu.stat")

    def remove(self) -> None:
        wait_for(lambda: not (self.path / "cgroup.procs").read_text().strip(), 30, "the cgroup to empty")
        self.path.rmdir()


def _agent(box: Sandbox, mode: str, cgroup: CpuCgroup) -> subprocess.Popen:
    config = box.base / "agent.toml"
    config.write_text(
        f'[agent]\nname = "bench"\nsocket = "{box.socket}"\nspool = "{box.spool}"\n'
        f'shepherd_start = "{mode}"\npoll_interval = 5.0\nlog_level = "INFO"\n'
        f'[gpus]\nbackend = "simulated"\nsimulated_count = 4\n'
        f'[telemetry]\nenabled = false\n[isolation]\ncgroups = false\n')
    log = open(box.base / "agent.log", "ab")
    # into the cgroup first, then exec: the zygote it starts at once is counted too
    proc = subprocess.Popen(["/bin/sh", "-c", f'echo $$ > {cgroup.path / "cgroup.procs"} && exec "$0" "$@"',
                             sys.executable, "-m", "hai_cluster.agent.daemon", "--config", str(config)],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    wait_for(lambda: box.socket.exists(), 30, "the agent's socket")
    return proc


async def _jobs(box: Sandbox, n: int) -> list[float]:
    c = await Client.connect(box.socket)
    times = []
    try:
        for _ in range(n):
            spec = box.spec(JOB)
            t0 = time.perf_counter()
            reply = await c.call("start_run", {"spec": spec})
            times.append(time.perf_counter() - t0)
            assert reply["started"] and reply["status"]["state"] in ("running", "ended"), reply
            ended = await c.exited(spec["job_id"])
            assert ended["exit_code"] == 0, ended
            await c.call("forget_run", {"job_id": spec["job_id"], "attempt": 0})
    finally:
        await c.close()
    return times


async def _launches(box: Sandbox, n: int, cgroup: CpuCgroup) -> float:
    """CPU per launch alone: n jobs that only sleep, started one after the other and measured up
    to the last launch report (the jobs are terminated after)."""
    c = await Client.connect(box.socket)
    specs = [box.spec(SLEEPER) for _ in range(n)]
    try:
        cpu0 = cgroup.usage_s()
        for spec in specs:
            reply = await c.call("start_run", {"spec": spec})
            assert reply["status"]["state"] == "running", reply
        cpu = (cgroup.usage_s() - cpu0) / n
        for spec in specs:
            await c.call("terminate_run", {"job_id": spec["job_id"], "attempt": 0, "reason": "cancel"})
        for spec in specs:
            await c.exited(spec["job_id"], timeout=60)
            await c.call("forget_run", {"job_id": spec["job_id"], "attempt": 0})
    finally:
        await c.close()
    return cpu


def round_(mode: str, jobs: int, tag: str) -> tuple[list[float], float, float]:
    box = Sandbox()
    cgroup = CpuCgroup(f"hai-bench-shepherd-{os.getpid()}-{tag}")
    proc = None
    try:
        proc = _agent(box, mode, cgroup)
        asyncio.run(_jobs(box, 3))  # warm-up: the zygote is ready, the agent's imports done
        cpu0 = cgroup.usage_s()
        times = asyncio.run(_jobs(box, jobs))
        cpu = (cgroup.usage_s() - cpu0) / jobs
        launch_cpu = asyncio.run(_launches(box, min(jobs, 20), cgroup))
        log = (box.base / "agent.log").read_text()
        if (mode == "fork") != ("forked from it" in log) or "zygote unusable" in log:
            raise RuntimeError(f"{mode} round: shepherds not started that way:\n{log[-2000:]}")
        return times, cpu, launch_cpu
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        cgroup.remove()
        box.cleanup()


def drain_round(mode: str, n: int) -> tuple[float, float]:
    """A held array of n trivial tasks released at once on a local cluster (one agent, this
    machine's CPUs as slots, tick 1 s): n / (last end - first start), and the median time a task
    held its slot (start to end, the store's times)."""
    from tests.e2e.harness import start_local_cluster
    c = start_local_cluster(tick=1.0, agent_toml=f'shepherd_start = "{mode}"',
                            controller_toml=f"max_array_size = {max(n, 1000)}")
    try:
        array = c.submit("--hold", f"--array=1-{n}", "--wrap=true")
        c.cli("hcontrol", "release", str(array))

        def done():
            jobs = c.call("jobs", {"ids": [array], "all": True})["jobs"]
            return len(jobs) == n and all(j["state"] == "COMPLETED" for j in jobs) and jobs
        jobs = wait_for(done, 600, f"array {array} to complete")
        span = max(j["end_time"] for j in jobs) - min(j["start_time"] for j in jobs)
        return n / span, statistics.median(j["end_time"] - j["start_time"] for j in jobs)
    finally:
        c.close()


def _modes(rep: int) -> tuple[str, str]:
    """The two modes in the order of round `rep`: alternating, so that neither always goes first."""
    return ("fork", "exec") if rep % 2 == 0 else ("exec", "fork")


def _ms(x: float) -> str:
    return f"{x * 1000:.0f}"


def section(jobs: int = 40, reps: int = 3, drain_tasks: int = 100) -> str:
    """The markdown tables (scripts/bench --only shepherd)."""
    if os.geteuid() != 0:
        sys.exit("needs root (jobs run as a test user; the agent runs in a cgroup of its own)")
    out: list[str] = ["### Shepherd start: fork (the zygote) against exec (a fresh interpreter)\n",
                      "A real `hai-agent` per round, rounds alternating between `[agent] shepherd_start` modes "
                      "(`scripts/benchmarks/shepherd_start.py`).\n"]
    res: dict[str, dict[str, list]] = {m: {"times": [], "cpu": [], "launch": []} for m in ("fork", "exec")}
    for rep in range(reps):
        for mode in _modes(rep):
            times, cpu, launch = round_(mode, jobs, f"{mode}{rep}")
            res[mode]["times"] += times
            res[mode]["cpu"].append(cpu)
            res[mode]["launch"].append(launch)
            q = statistics.quantiles(times, n=20)
            print(f"# {mode} round {rep}: start_run p50 {_ms(statistics.median(times))} ms, "
                  f"p95 {_ms(q[18])} ms; CPU {_ms(cpu)} ms/job, {_ms(launch)} ms/launch",
                  file=sys.stderr, flush=True)
    out.append("| shepherd_start | start_run → launch report p50 | p95 | CPU per launch | CPU per job "
               "(start to end) |")
    out.append("|---|---|---|---|---|")
    for mode in ("exec", "fork"):
        t, r = res[mode]["times"], res[mode]
        q = statistics.quantiles(t, n=20)
        out.append(f"| {mode} | {_ms(statistics.median(t))} ms | {_ms(q[18])} ms | "
                   f"{_ms(statistics.median(r['launch']))} ms ({', '.join(_ms(c) for c in r['launch'])}) | "
                   f"{_ms(statistics.median(r['cpu']))} ms ({', '.join(_ms(c) for c in r['cpu'])}) |")
    out.append(f"\n{reps} rounds per mode, alternating, {jobs} jobs each; CPU: the medians of the "
               f"rounds (each round's in parentheses), the agent's cgroup (agent, zygote, shepherds, jobs).")
    if drain_tasks:
        drain: dict[str, list[tuple[float, float]]] = {"fork": [], "exec": []}
        for rep in range(reps):
            for mode in _modes(rep):
                drain[mode].append(drain_round(mode, drain_tasks))
                print(f"# {mode} drain {rep}: {drain[mode][-1][0]:.1f} jobs/s, slot held "
                      f"{_ms(drain[mode][-1][1])} ms", file=sys.stderr, flush=True)
        out.append(f"\n| shepherd_start | released {drain_tasks}-task array: drain | a task's slot held (median) |")
        out.append("|---|---|---|")
        for mode in ("exec", "fork"):
            rates, held = [r for r, _ in drain[mode]], [h for _, h in drain[mode]]
            out.append(f"| {mode} | {statistics.median(rates):.1f} jobs/s ({', '.join(f'{r:.1f}' for r in rates)}) | "
                       f"{_ms(statistics.median(held))} ms ({', '.join(_ms(h) for h in held)}) |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--drain", type=int, default=100, help="tasks of the released array per round (0: skip)")
    a = ap.parse_args()
    print(section(a.jobs, a.reps, a.drain))


if __name__ == "__main__":
    main()
