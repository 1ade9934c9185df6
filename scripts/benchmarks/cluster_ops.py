"""Cluster operations on a real dev cluster, measured the way ../shared/peers/slurm/bench measures
Slurm (its tests a-d), so that the two tables line up row for row:

  a. submit throughput: N x `hsubmit --wrap=true`, one after another and from P submitters
     (threads, each running the command), jobs/s;
  b. drain throughput, the same runs: first submit until `hqueue` shows no job, jobs/s;
  c. submit -> running: time before `hsubmit` to the `date +%s.%N` the job writes first thing, one
     job at a time on the idle cluster, back to back and after a few idle seconds each;
  d. `hsubmit --hold` M jobs, `hqueue` wall time with them (median of 5), `hcancel` of their ids;
  d+. `hqueue` with a large table (10,000 held jobs). Those jobs are written straight into the
     store (the controller's own Repository.submit, one transaction each, not synced) because
     10,000 `hsubmit` calls take longer than the whole suite should; what is measured is hqueue.

The cluster: `hai-dev up` with 4 nodes (simulated GPUs, jobs as root), the production scheduler
defaults (MLFQ, tick 1 s). Jobs ask for no GPU, like Slurm's trivial jobs; each agent offers 64
CPUs (agent.cpus), as the Slurm peer advertises per node, so both can run as many trivial jobs at
once whatever this machine's real CPU count."""
from __future__ import annotations

import concurrent.futures
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent


class DevCluster:
    def __init__(self, nodes: int = 4, gpus_per_node: int = 8, tick: float = 1.0, cpus_per_node: int = 64) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="hai-bench-ops-", dir="/tmp"))
        self.work = self.dir / "work"
        self.work.mkdir()
        up = subprocess.run([str(BIN / "hai-dev"), "up", "--dir", str(self.dir), "--nodes", str(nodes),
                             "--gpus-per-node", str(gpus_per_node), "--cpus-per-node", str(cpus_per_node),
                             "--gpu-backend", "simulated",
                             "--tick", str(tick)], capture_output=True, text=True, cwd=self.dir)
        # cwd: hai-dev starts the daemons with `python -m`, which puts the current directory first
        # on sys.path; from a checkout they would import its hai_cluster, not the installed one.
        if up.returncode != 0:
            raise RuntimeError(f"hai-dev up failed: {up.stderr}")
        self.socket = up.stdout.split("=", 1)[1].strip()
        self.env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "HAI_CONTROLLER": self.socket}

    def cli(self, *argv: str, timeout: float = 600) -> str:
        program = python_argv(argv[0]) if argv[0].endswith(PYTHON) else [str(BIN / argv[0])]
        p = subprocess.run([*program, *argv[1:]], env=self.env, cwd=self.work, capture_output=True,
                           text=True, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:3])} ... failed ({p.returncode}): {p.stderr.strip()}")
        return p.stdout

    def submit(self, *args: str) -> int:
        return int(self.cli("hsubmit", "--parsable", "-o", "/dev/null", "-D", str(self.work), *args).strip())

    def submit_python(self, *args: str) -> int:
        """The Python hsubmit, which is the installed one where no C compiler was (the compiled one
        runs it for --help)."""
        p = subprocess.run([sys.executable, "-c", "from hai_cluster.cli.hsubmit import main; raise SystemExit(main())",
                            "--parsable", "-o", "/dev/null", "-D", str(self.work), *args], env=self.env,
                           cwd=self.work, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"python hsubmit failed ({p.returncode}): {p.stderr.strip()}")
        return int(p.stdout.strip())

    def queue(self) -> list[str]:
        return self.cli("hqueue", "-h", "-o", "%i").split()

    def wait_empty(self, timeout: float = 900, poll: float = 0.25) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.queue():
                return time.time()
            time.sleep(poll)
        raise RuntimeError(f"queue not empty after {timeout} s")

    def cancel_all(self) -> None:
        if self.queue():
            self.cli("hcancel", "-t", "PENDING,RUNNING")
        self.wait_empty(timeout=300)

    def down(self) -> None:
        subprocess.run([str(BIN / "hai-dev"), "down", "--dir", str(self.dir)], capture_output=True)
        subprocess.run(["rm", "-rf", str(self.dir)])


def hsubmit_kind() -> str:
    """Which hsubmit the benchmark runs: the compiled one (hai_cluster/native) or pip's Python launcher."""
    from hai_cluster.native.build import is_compiled

    return "C" if is_compiled(BIN / "hsubmit") else "Python"


def _wait_file(path: Path, timeout: float = 180, poll: float = 0.01) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text = path.read_text()
            if text.endswith("\n"):
                return text
        except FileNotFoundError:
            pass
        time.sleep(poll)
    raise RuntimeError(f"{path} did not appear within {timeout} s")


def pct(values, q):
    """q-th percentile, nearest rank (the Slurm peer's bench uses the same)."""
    v = sorted(values)
    k = max(0, min(len(v) - 1, int(round(q / 100 * len(v) + 0.5)) - 1))
    return v[k]


def log(msg: str) -> None:
    print(f"[cluster_ops {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def test_throughput(c: DevCluster, n: int, submitters: int, reps: int) -> dict:
    res = {}
    for mode, workers in (("sequential", 1), (f"{submitters} parallel", submitters)):
        sub_rates, drain_rates, errors = [], [], 0
        for rep in range(reps):
            c.cancel_all()
            per = [n // workers + (1 if i < n % workers else 0) for i in range(workers)]

            def submitter(count):
                bad = 0
                for _ in range(count):
                    try:
                        c.submit("--job-name=tp", "--wrap=true")
                    except RuntimeError:
                        bad += 1
                return bad

            t0 = time.time()
            with concurrent.futures.ThreadPoolExecutor(workers) as ex:
                bad = sum(ex.map(submitter, per))
            t_sub = time.time()
            t_end = c.wait_empty()
            errors += bad
            sub_rates.append((n - bad) / (t_sub - t0))
            drain_rates.append((n - bad) / (t_end - t0))
            log(f"throughput {mode} rep {rep + 1}/{reps}: submit {sub_rates[-1]:.1f} jobs/s, "
                f"drain {drain_rates[-1]:.1f} jobs/s ({t_end - t0:.1f} s), errors {bad}")
        res[mode] = {"submit_jobs_per_s": sub_rates, "drain_jobs_per_s": drain_rates, "submit_errors": errors}
    return res


def test_latency(c: DevCluster, count: int, idle_count: int, gap: float) -> dict:
    c.cancel_all()
    res: dict = {}
    for key, n, pause in (("latency_s", count, 0), ("latency_idle_s", idle_count, gap)):
        lat, call = [], []
        for _ in range(n):
            time.sleep(pause)
            t0 = time.time()
            jid = c.submit("--job-name=lat", "--wrap=date +%s.%N > lat.$HAI_JOB_ID")
            t1 = time.time()
            start = float(_wait_file(c.work / f"lat.{jid}").strip())
            lat.append(start - t0)
            call.append(t1 - t0)
            c.wait_empty(poll=0.05)
        if lat:
            log(f"latency ({'back to back' if not pause else f'{pause} s idle before each'}): "
                f"p50 {statistics.median(lat):.3f} s, p95 {pct(lat, 95):.3f} s, "
                f"hsubmit call p50 {statistics.median(call) * 1000:.1f} ms")
        res[key] = lat
        res.setdefault("sbatch_call_s", []).extend(call)
    res["idle_gap_s"] = gap
    res["hsubmit"] = hsubmit_kind()
    # The Python hsubmit, on held jobs (the submit path is the same), alternating with the installed one.
    py, installed = [], []
    for _ in range(count):
        for submit, into in ((c.submit_python, py), (c.submit, installed)):
            t0 = time.time()
            submit("--hold", "--job-name=call", "--wrap=true")
            into.append(time.time() - t0)
    c.cancel_all()
    log(f"hsubmit ({res['hsubmit']}) p50 {statistics.median(installed) * 1000:.1f} ms, "
        f"Python hsubmit p50 {statistics.median(py) * 1000:.1f} ms (held jobs, alternating)")
    res["held_call_s"], res["python_call_s"] = installed, py
    return res


def _time_hqueue(c: DevCluster, reps: int, command: str = "hqueue") -> list[float]:
    times = []
    for _ in range(reps):
        t = time.monotonic()
        c.cli(command)
        times.append(time.monotonic() - t)
    return times


def test_pending(c: DevCluster, m: int, squeue_reps: int = 5) -> dict:
    c.cancel_all()
    t0 = time.time()
    ids = [str(c.submit("--hold", "--job-name=held", "--wrap=true")) for _ in range(m)]
    t_sub = time.time() - t0
    pending = len(c.cli("hqueue", "-h", "-t", "PD", "-o", "%i").split())
    times = _time_hqueue(c, squeue_reps)
    ours = _time_hqueue(c, squeue_reps, "squeue")  # the Slurm-named front end, Slurm's default columns
    t = time.time()
    c.cli("hcancel", *ids)
    t_cancel = time.time() - t
    t_empty = c.wait_empty(poll=0.05) - t
    log(f"pending {pending}: hqueue {statistics.median(times) * 1000:.0f} ms, hcancel {t_cancel:.2f} s, "
        f"queue empty after {t_empty:.2f} s")
    return {"held_submit_jobs_per_s": m / t_sub, "pending_seen": pending, "squeue_s": times,
            "squeue_ours_s": ours, "scancel_cmd_s": t_cancel, "scancel_until_empty_s": t_empty}


def seed_held_jobs(c: DevCluster, m: int) -> float:
    """m held jobs written into the dev cluster's store, as the controller's submit would."""
    from sqlalchemy import create_engine, event

    from hai_cluster.core.jobscript import parse_submission
    from hai_cluster.store.repository import Repository

    engine = create_engine(f"sqlite:///{c.dir}/hai.db", connect_args={"timeout": 60})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn, _record):
        dbapi_conn.execute("PRAGMA synchronous=OFF")  # seeding only: the rows, not their durability

    spec = parse_submission(None, ["--hold", "--job-name=held", "--wrap=true", "-o", "/dev/null"],
                            cwd=str(c.work), env={"PATH": os.environ["PATH"]}, script_args=[],
                            script_name=None).spec
    repo = Repository(engine)
    t0 = time.time()
    for _ in range(m):
        repo.submit(spec, user="root", uid=0, gid=0, partition="gpu", now=time.time())
    engine.dispose()
    return time.time() - t0


def test_pending_large(c: DevCluster, m: int, squeue_reps: int = 5) -> dict:
    c.cancel_all()
    seconds = seed_held_jobs(c, m)
    pending = len(c.cli("hqueue", "-h", "-t", "PD", "-o", "%i").split())
    times = _time_hqueue(c, squeue_reps)
    ours = _time_hqueue(c, squeue_reps, "squeue")
    log(f"pending {pending} (seeded in {seconds:.1f} s): hqueue {statistics.median(times) * 1000:.0f} ms, "
        f"squeue (ours) {statistics.median(ours) * 1000:.0f} ms")
    return {"pending_seen": pending, "squeue_s": times, "squeue_ours_s": ours, "seed_s": seconds}


def measure(jobs: int = 500, submitters: int = 4, reps: int = 1, latency_jobs: int = 20,
            latency_idle_jobs: int = 10, latency_gap: float = 5.0, pending: int = 1000,
            pending_large: int = 10000, only: str = "a,b,c,d,dl", tick: float = 1.0) -> dict:
    only_set = set(only.split(","))
    c = DevCluster(nodes=4, gpus_per_node=8, tick=tick)
    r: dict = {"settings": {"nodes": 4, "gpus_per_node": 8, "cpus_per_node": 64, "tick_s": tick, "policy": "mlfq"}}
    try:
        if "c" in only_set:
            r["latency"] = test_latency(c, latency_jobs, latency_idle_jobs, latency_gap)
        if "d" in only_set:
            r["pending"] = test_pending(c, pending)
        if "a" in only_set or "b" in only_set:
            r["throughput"] = test_throughput(c, jobs, submitters, reps)
        if "dl" in only_set and pending_large:
            r["pending_large"] = test_pending_large(c, pending_large)
    finally:
        c.down()
    return r


# The listings tools poll (squeue, sacct): the commands and the formats timed, ours and Slurm's alike.
LISTINGS = (("squeue", ()), ("squeue", ("-h", "-o", "%i|%T")),
            ("sacct", ("-P", "-o", "JobID,State,Elapsed")), ("sacct", ()))
# bin/squeue and bin/sacct are the compiled ones where a C compiler was (native/squeue.c, sacct.c);
# the Python ones, which they run for the forms they leave to Python, are timed beside them under
# these names
PYTHON = "[Python]"
PYTHON_SQUEUE, PYTHON_SACCT = "squeue" + PYTHON, "sacct" + PYTHON


def python_argv(name: str) -> list[str]:
    """The Python program behind a compiled one (PYTHON_SQUEUE, PYTHON_SACCT), run as it runs it."""
    prog = name.removesuffix(PYTHON)
    return [sys.executable, "-P", "-c", f"import sys; sys.argv[0] = {prog!r}; "
            f"from hai_cluster.cli.{prog} import main; raise SystemExit(main())"]


OUR_LISTINGS = LISTINGS + ((PYTHON_SQUEUE, ()), (PYTHON_SQUEUE, ("-h", "-o", "%i|%T")),
                           (PYTHON_SACCT, ("-P", "-o", "JobID,State,Elapsed")), (PYTHON_SACCT, ()))


def time_listings(run, reps: int, between=None, listings=LISTINGS) -> dict:
    """{command line: [seconds]} for each of `listings`, reps times, the commands interleaved;
    between(): called before each round (a write, so that no listing is the one kept before it)."""
    times: dict[str, list[float]] = {" ".join((cmd, *args)): [] for cmd, args in listings}
    for _ in range(reps):
        for cmd, args in listings:
            if between is not None:
                between()
            t = time.monotonic()
            ok = run(cmd, *args)
            if ok is not False:
                times[" ".join((cmd, *args))].append(time.monotonic() - t)
    return times


def test_listing(c: DevCluster, sizes=(1000, 10000), reps: int = 20) -> dict:
    """squeue and sacct with `size` held jobs: polled (nothing changes between calls: the controller
    serves the listing it keeps until the store's next write) and right after a write (one job
    cancelled before each call: the store is read again). The jobs are written straight into the
    store (seed_held_jobs), all but one: the last goes through hsubmit, a write of the controller's
    own, which is what ends a kept listing (store/generation.py)."""
    c.cancel_all()
    out: dict = {}
    have = 0
    for size in sizes:
        seed_held_jobs(c, size - have - 1)
        c.submit("--hold", "--job-name=held", "--wrap=true")
        have = size
        seen = len(c.cli("squeue", "-h", "-t", "PD", "-o", "%i").split())
        polled = time_listings(lambda *a: c.cli(*a), reps, listings=OUR_LISTINGS)
        ids = iter(c.cli("squeue", "-h", "-t", "PD", "-o", "%i").split())
        rounds = max(3, reps // 4)
        after_write = time_listings(lambda *a: c.cli(*a), rounds, between=lambda: c.cli("scancel", next(ids)),
                                    listings=OUR_LISTINGS)
        have -= len(OUR_LISTINGS) * rounds
        log(f"listing {seen} jobs: " + ", ".join(f"{k} {statistics.median(v) * 1000:.0f} ms"
                                                   for k, v in polled.items()))
        out[str(size)] = {"pending_seen": seen, "polled_s": polled, "after_write_s": after_write}
    c.cancel_all()
    return out


def measure_listing(sizes=(1000, 10000), reps: int = 20) -> dict:
    c = DevCluster(nodes=4, gpus_per_node=8, tick=1.0)
    try:
        return test_listing(c, sizes, reps)
    finally:
        c.down()
