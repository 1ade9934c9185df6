"""The Slurm side of the comparison: ../shared/peers/slurm (Debian's Slurm 22.05 on this machine,
4 virtual nodes x 8 GPUs). Its scripts are tools we call, never copy: `up`, `bench`, `down`.

`run_live` starts the peer (default profile: Slurm's own defaults), runs its bench tests a-d with
the same sizes as ours, then a and b again with SchedulerParameters=batch_sched_delay=0, and stops
it whatever happens. By default Slurm starts a batch job no sooner than batch_sched_delay (~3 s)
after its last scheduling pass, so during a burst of submissions its jobs wait and its CPUs serve
sbatch; ours start at once, as Slurm's do with the delay at 0: that run does the same work. A large `squeue` table needs a cold
restart first: Slurm keeps finished jobs for MinJobAge (300 s) and refuses new ones beyond
MaxJobCount (10,000). `load_saved` reads a results JSON of an earlier run instead (the peer's
baseline in ../shared/peers/slurm/results/, or one that `run_live` left in $SLURM_PEER_DIR)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PEER = Path(os.environ.get("HAI_SLURM_PEER", REPO.parent / "shared" / "peers" / "slurm"))
BASELINE = PEER / "results" / "2026-11-30-debian12-2core.json"
SLURM_MAX_PENDING = 9990  # MaxJobCount defaults to 10,000; the 10,000th submission already blocks
NO_DELAY = "batch_sched_delay=0"  # batch jobs start at slurmctld's next pass (its 1 s tick), not ~3 s later


def log(msg: str) -> None:
    print(f"[slurm_peer] {msg}", file=sys.stderr, flush=True)


def _peer(cmd: str, *args: str, timeout: float = 1800, sched_params: str = "") -> str:
    env = {**os.environ, "SLURM_PEER_PROFILE": "default", "SLURM_PEER_PREEMPT": "0",
           "SLURM_PEER_SCHED_PARAMS": sched_params, "SLURM_PEER_NODES": "4", "SLURM_PEER_GPUS": "8"}
    p = subprocess.run([str(PEER / cmd), *args], env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"slurm peer {cmd} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return p.stdout


def _bench(*args: str, sched_params: str = "") -> dict:
    out = _peer("bench", *args, sched_params=sched_params)
    m = re.search(r"^Raw values: (.+\.json)$", out, re.M)
    if not m:
        raise RuntimeError(f"slurm peer bench printed no results file:\n{out[-2000:]}")
    return load_saved(Path(m.group(1)))


def load_saved(path: Path) -> dict:
    """{'results': the default profile's results, 'version', 'machine', 'date', 'source'}. Where the
    file also has the default profile with NO_DELAY, its a/b results are 'throughput_no_delay'."""
    doc = json.loads(Path(path).read_text())
    name = "default" if "default" in doc["results"] else next(n for n in doc["results"] if n != "preemption")
    results = dict(doc["results"][name])
    no_delay = doc["results"].get(f"default +{NO_DELAY}", {})
    if name == "default" and "throughput" in no_delay:
        results["throughput_no_delay"] = no_delay["throughput"]
    return {"results": results, "version": doc.get("version", ""), "machine": doc.get("machine", ""),
            "date": doc.get("date", ""), "source": str(path), "profile": name, "args": doc.get("args", {})}


def run_live(jobs: int, submitters: int, reps: int, latency_jobs: int, latency_idle_jobs: int,
             latency_gap: float, pending: int, pending_large: int) -> dict:
    if not (PEER / "up").exists():
        raise RuntimeError(f"no Slurm peer at {PEER}")
    try:
        log("./up (default profile, 4 nodes x 8 GPUs)")
        _peer("up")
        log(f"./bench --only a,b,c,d --jobs {jobs} --pending {pending} (a few minutes)")
        main = _bench("--only", "a,b,c,d", "--jobs", str(jobs), "--submitters", str(submitters), "--reps", str(reps),
                      "--latency-jobs", str(latency_jobs), "--latency-idle-jobs", str(latency_idle_jobs),
                      "--latency-gap", str(latency_gap), "--pending", str(pending))
        if pending_large:
            # MaxJobCount (10,000 by default) counts every job slurmctld holds: stay just below it.
            large_n = min(pending_large, SLURM_MAX_PENDING)
            log(f"./down, ./up (cold start: an empty job table), ./bench --only d --pending {large_n}")
            try:
                _peer("down")
                _peer("up")
                large = _bench("--only", "d", "--pending", str(large_n))
                main["results"]["pending_large"] = large["results"]["pending"]
            except (RuntimeError, subprocess.TimeoutExpired) as exc:  # keep the main results
                log(f"the large squeue test failed: {exc}")
                main["large_error"] = str(exc)[:300]
        log(f"./down, ./up with SchedulerParameters={NO_DELAY}, ./bench --only a,b (its jobs start during "
            "the burst, as ours do)")
        try:
            _peer("down")
            _peer("up", sched_params=NO_DELAY)
            no_delay = _bench("--only", "a,b", "--jobs", str(jobs), "--submitters", str(submitters),
                              "--reps", str(reps), sched_params=NO_DELAY)
            main["results"]["throughput_no_delay"] = no_delay["results"]["throughput"]
        except (RuntimeError, subprocess.TimeoutExpired) as exc:  # keep the main results
            log(f"the {NO_DELAY} run failed: {exc}")
            main["no_delay_error"] = str(exc)[:300]
        main["live"] = True
        return main
    finally:
        log("./down")
        try:
            _peer("down", timeout=120)
        except RuntimeError as exc:
            log(f"./down failed: {exc}")


def run_listing(sizes, reps: int, accounting: bool = True) -> dict:
    """The peer's squeue and sacct with `size` pending jobs each (below MaxJobCount), timed as
    cluster_ops.time_listings times ours. Its jobs go through sbatch, its own submission path; the
    peer starts cold and is stopped whatever happens. With `accounting` (slurm_accounting: a
    slurmdbd for the run) the jobs wait behind one job that holds every node, since sacct lists
    no held job (a held job has no eligible time); without it, or where that setup fails, they
    are held and sacct has no Slurm time."""
    from .cluster_ops import time_listings
    from .slurm_accounting import Accounting

    if not (PEER / "up").exists():
        raise RuntimeError(f"no Slurm peer at {PEER}")
    conf = re.search(r"^export SLURM_CONF=(\S+)$", _peer("up"), re.M)
    if not conf:
        raise RuntimeError("the Slurm peer's up printed no SLURM_CONF")
    env = {**os.environ, "SLURM_CONF": conf.group(1)}
    work = Path(conf.group(1)).parent.parent / "bench"
    work.mkdir(exist_ok=True)

    def run(cmd: str, *args: str, check: bool = True):
        p = subprocess.run([cmd, *args], env=env, cwd=work, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            if check:
                raise RuntimeError(f"{cmd} {' '.join(args)} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
            return False
        return p.stdout

    out: dict = {}
    acct = Accounting(Path(conf.group(1)), int(os.environ.get("SLURM_PEER_PORT", "16817"))) if accounting else None
    try:
        if acct is not None:
            try:
                acct.start()
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                log(f"no accounting for the peer: {exc}")
                acct.stop()
                acct = None
        have = 0
        probe = subprocess.run(["sacct", "-n"], env=env, cwd=work, capture_output=True, text=True, timeout=60)
        accounting = probe.returncode == 0 and "disabled" not in probe.stderr
        log(f"sacct: {'accounting on' if accounting else 'no accounting: ' + probe.stderr.strip()[:100]}")
        if accounting:
            nodes = len(run("sinfo", "-h", "-N", "-o", "%N").split())
            blocker = run("sbatch", "--parsable", f"--nodes={nodes}", "--exclusive", "--output=/dev/null",
                          f"--chdir={work}", "--job-name=blocker", "--wrap=sleep 100000").strip()
            deadline = time.monotonic() + 120
            while run("squeue", "-h", "-j", blocker, "-o", "%T").strip() != "RUNNING" and time.monotonic() < deadline:
                time.sleep(0.5)
        for size in sizes:
            n = min(size, SLURM_MAX_PENDING)
            log(f"sbatch {'' if accounting else '--hold '}× {n - have} (the peer's own submission path)")
            for _ in range(n - have):
                run("sbatch", "--parsable", *([] if accounting else ["--hold"]), "--output=/dev/null",
                    f"--chdir={work}", "--job-name=held", "--wrap=true")
            have = n
            seen = len(run("squeue", "-h", "-t", "PD", "-o", "%i").split())
            if accounting:  # slurmctld sends its records to slurmdbd in the background
                deadline = time.monotonic() + 300
                while len(run("sacct", "-n", "-X", "-s", "PD", "-o", "JobID").split()) < seen \
                        and time.monotonic() < deadline:
                    time.sleep(2)
            times = time_listings(lambda cmd, *a: run(cmd, *a) if cmd != "sacct" or accounting else False, reps)
            log(f"listing {seen} jobs: " + ", ".join(f"{k} {sorted(v)[len(v) // 2] * 1000:.0f} ms"
                                                       for k, v in times.items() if v))
            out[str(size)] = {"pending_seen": seen, "polled_s": times, "accounting": accounting,
                              "sacct_rows": len(run("sacct", "-n", "-X", "-o", "JobID").split()) if accounting
                              else None}
        return {"results": out, "version": _version(env)}
    finally:
        try:
            run("scancel", "--user=root", check=False)
        finally:
            if acct is not None:
                try:
                    acct.stop()
                except (OSError, RuntimeError) as exc:
                    log(f"stopping the peer's accounting failed: {exc}")
            log("./down")
            try:
                _peer("down", timeout=300)
            except RuntimeError as exc:
                log(f"./down failed: {exc}")


def _version(env) -> str:
    p = subprocess.run(["sinfo", "--version"], env=env, capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else "Slurm"
