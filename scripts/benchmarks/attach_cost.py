"""sattach's cost, on hai-dev (2 nodes, jobs as root): (1) the wall time of `srun` outside a job
printing 20 MB, with 0 and with 2 `sattach -l` attached (and how much each attacher got);
(2) from sattach's start to the first replayed line of a quiet running step; (3) `sattach
JOB.batch` from its start to the output file's first line.

    .venv/bin/python -m scripts.benchmarks.attach_cost
"""
import statistics
import subprocess
import threading
import time

from .cluster_ops import BIN, DevCluster

PRINT = "sleep 3; head -c 15000000 /dev/zero | base64 -w 99; echo END"


def main() -> None:
    c = DevCluster(nodes=2, gpus_per_node=2, tick=1.0)
    try:
        def run_srun(attachers):
            t0 = time.monotonic()
            p = subprocess.Popen([str(BIN / "srun"), "-N1", "bash", "-c", PRINT], env=c.env, cwd=c.work,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            atts = []
            if attachers:
                jid = None
                while jid is None:
                    out = subprocess.run([str(BIN / "squeue"), "-h", "-o", "%i"], env=c.env, capture_output=True, text=True).stdout.split()
                    jid = out[-1] if out else None
                    time.sleep(0.1)
                while subprocess.run([str(BIN / "sattach"), "--layout", f"{jid}.0"], env=c.env, capture_output=True).returncode:
                    time.sleep(0.1)
                atts = [subprocess.Popen([str(BIN / "sattach"), "-l", f"{jid}.0"], env=c.env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) for _ in range(attachers)]
            got = [0] * len(atts)
            def drain(i, a):
                got[i] = sum(len(chunk) for chunk in iter(lambda: a.stdout.read(1 << 16), b""))
            ts = [threading.Thread(target=drain, args=(i, a)) for i, a in enumerate(atts)]
            for t in ts: t.start()
            n = sum(len(chunk) for chunk in iter(lambda: p.stdout.read(1 << 20), b""))
            p.wait()
            wall = time.monotonic() - t0
            for t in ts: t.join(120)
            for a in atts: a.wait(60)
            while subprocess.run([str(BIN / "squeue"), "-h"], env=c.env, capture_output=True, text=True).stdout.strip():
                time.sleep(0.2)
            return wall, n, got
        rows = {0: [], 2: []}
        for rep in range(3):
            for k in (0, 2):
                wall, n, got = run_srun(k)
                rows[k].append(wall)
                print(f"rep {rep} attachers {k}: srun {wall:.2f} s for {n} bytes; attachers got {got}", flush=True)
        for k, v in rows.items():
            print(f"srun wall, {k} attachers: median {statistics.median(v):.2f} s of {['%.2f' % x for x in v]}")
        # attach latency on a quiet step
        p = subprocess.Popen([str(BIN / "srun"), "-N1", "bash", "-c", "echo first; sleep 60"], env=c.env, cwd=c.work,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        p.stdout.readline()
        jid = subprocess.run([str(BIN / "squeue"), "-h", "-o", "%i"], env=c.env, capture_output=True, text=True).stdout.split()[-1]
        lat = []
        for _ in range(5):
            t0 = time.monotonic()
            a = subprocess.Popen([str(BIN / "sattach"), f"{jid}.0"], env=c.env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            a.stdout.readline()
            lat.append(time.monotonic() - t0)
            a.send_signal(2); a.wait()
        print(f"sattach start to first replayed line: median {statistics.median(lat)*1000:.0f} ms of {['%.0f' % (x*1000) for x in lat]}")
        subprocess.run([str(BIN / "scancel"), jid], env=c.env)
        # batch follow latency
        (c.work / "b.sh").write_text("#!/bin/bash\necho first\nsleep 60\n")
        jid = c.cli("hsubmit", "--parsable", "-o", str(c.work / "b.out"), "-D", str(c.work), str(c.work / "b.sh")).strip()
        while not (c.work / "b.out").exists() or not (c.work / "b.out").read_text():
            time.sleep(0.1)
        lat = []
        for _ in range(5):
            t0 = time.monotonic()
            a = subprocess.Popen([str(BIN / "sattach"), f"{jid}.batch"], env=c.env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            a.stdout.readline()
            lat.append(time.monotonic() - t0)
            a.send_signal(2); a.wait()
        print(f"sattach JOB.batch start to the file's first line: median {statistics.median(lat)*1000:.0f} ms of {['%.0f' % (x*1000) for x in lat]}")
        subprocess.run([str(BIN / "scancel"), jid], env=c.env)
    finally:
        c.down()


if __name__ == "__main__":
    main()
