"""hai-sim run, end to end on tiny traces: outputs, sweeps, skipped jobs, errors."""
import csv
import json

import pytest

from hai_cluster.scheduling.mlfq import MlfqConfig
from hai_cluster.sim.cli import main, policy_options

TRACE = "submit_time,duration,gpus\n0,10,1\n1,5,1\n2,3,1\n"


def trace(tmp_path, text=TRACE, name="t.csv"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def run(*args):
    with pytest.raises(SystemExit) as exc:
        main(["run", *args])
        raise SystemExit(0)
    return exc.value.code


def test_fifo_summary_csv_and_json(tmp_path, capsys):
    out_json, out_csv = tmp_path / "s.json", tmp_path / "jobs.csv"
    assert run(trace(tmp_path), "--cluster", "1x1", "-p", "fifo", "-p", "sjf", "--json", str(out_json),
               "--csv", str(out_csv)) == 0
    doc = json.loads(out_json.read_text())
    fifo = next(r for r in doc["runs"] if r["policy"] == "fifo")
    assert fifo["summary"]["mean_jct"] == pytest.approx(40 / 3) and fifo["summary"]["utilization"] == 1.0
    assert fifo["vs_baseline"]["mean_jct"] == 1.0 and doc["baseline"] == "fifo" and doc["skipped"] == []
    sjf = next(r for r in doc["runs"] if r["policy"] == "sjf")
    assert sjf["summary"]["mean_jct"] == pytest.approx((10 + 12 + 16) / 3)  # 3 s job before the 5 s one
    assert set(fifo["by_size"]) == {"1 GPU"} and set(fifo["by_duration"]) == {"<10 min"}
    assert fifo["perf"]["events"] == 6 and fifo["perf"]["events_per_s"] > 0
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 6 and {r["policy"] for r in rows} == {"fifo", "sjf"}
    text = capsys.readouterr().out
    assert "mean JCT" in text and "fifo" in text and "sjf" in text


def test_oversized_jobs_are_reported_and_skipped(tmp_path, capsys):
    out = tmp_path / "s.json"
    path = trace(tmp_path, "submit_time,duration,gpus\n0,10,1\n0,10,16\n0,10,0\n")
    assert run(path, "--cluster", "1x8", "-p", "fifo", "--json", str(out)) == 0
    doc = json.loads(out.read_text())
    assert doc["trace"]["jobs"] == 1
    assert sorted(s["reason"] for s in doc["skipped"]) == ["asks for no GPUs", "needs more GPUs than 1x8 has"]
    err = capsys.readouterr().err
    assert "skipping 2 job(s)" in err


def test_baseline_is_added_and_sweep_reuses_runs_without_preemption(tmp_path):
    out = tmp_path / "s.json"
    path = trace(tmp_path, "submit_time,duration,gpus\n0,1000,1\n100,10,1\n")
    assert run(path, "--cluster", "1x1", "-p", "tiresias", "-o", "tiresias.thresholds=[50]",
               "--sweep", "restart-cost=0,890", "--json", str(out)) == 0
    doc = json.loads(out.read_text())
    labels = [r["label"] for r in doc["runs"]]
    assert labels == ["tiresias rc=0", "fifo rc=0", "tiresias rc=890", "fifo rc=890"]
    by = {r["label"]: r for r in doc["runs"]}
    assert by["fifo rc=890"]["perf"]["reused"] and not by["tiresias rc=890"]["perf"]["reused"]
    assert by["tiresias rc=0"]["vs_baseline"]["mean_jct"] == pytest.approx(510 / 955)
    assert by["tiresias rc=890"]["vs_baseline"]["mean_jct"] == pytest.approx(1.0)
    assert by["tiresias rc=890"]["summary"]["lost_gpu_s"] == 890


def test_same_seed_same_result(tmp_path):
    text = "submit_time,duration,gpus\n" + "".join(f"{i // 3},{7 + (i * 13) % 50},{1 + i % 3}\n" for i in range(30))
    path = trace(tmp_path, text)
    docs = []
    for i in range(2):
        out = tmp_path / f"s{i}.json"
        assert run(path, "--cluster", "2x2", "--seed", "3", "-p", "tiresias", "-p", "mlfq", "--json", str(out)) == 0
        doc = json.loads(out.read_text())
        for r in doc["runs"]:
            del r["perf"]
        docs.append(doc)
    assert docs[0] == docs[1]


def test_plot_file_is_written(tmp_path):
    png = tmp_path / "p.png"
    assert run(trace(tmp_path), "--cluster", "1x1", "-p", "fifo", "--plot", str(png)) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, message", [
    (["/nonexistent/trace.csv"], "no such file"),
    (["{trace}", "--cluster", "16"], "bad cluster '16'"),
    (["{bad}"], "unrecognised trace header"),
    (["{trace}", "-p", "lottery"], "unknown policy 'lottery'"),
    (["{trace}", "--sweep", "quantum=1,2"], "bad --sweep"),
    (["{trace}", "--load-scale", "0"], "--load-scale must be positive"),
    (["{trace}", "-o", "mlfq.quanta"], "expected POLICY.KEY=VALUE"),
    (["{trace}", "-p", "fifo", "-o", "tiresias.thresholds=[1]"], "options for a policy not being run"),
    (["{trace}", "-p", "tiresias", "-o", "tiresias.bogus=1"], "policy options:"),
    (["{trace}", "--no-such-flag"], "No such option"),
    (["{trace}", "--reservation", "node01:0"], "expected NODES:START:SECONDS"),
    (["{trace}", "--cluster", "2x1", "--reservation", "node7:0:10"], "node7 is not a node of"),
    (["{trace}", "--cluster", "2x1", "--reservation", "node01:0:10:BOGUS"], "Error parsing flags BOGUS"),
    (["{trace}", "--cluster", "2x1", "--reservation", "node01:0:90000:DAILY"], "a DAILY window lasts at most"),
])
def test_errors_are_one_line_and_exit_2(tmp_path, capsys, args, message):
    paths = {"trace": trace(tmp_path), "bad": trace(tmp_path, "x,y\n1,2\n", "bad.csv")}
    assert run(*[a.format(**paths) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hai-sim: error: ") and message in err and err.count("\n") == 1


def test_mlfq_config_file_and_overrides(tmp_path):
    conf = tmp_path / "controller.toml"
    conf.write_text("[scheduler]\npolicy = 'mlfq'\nthresholds = [100.0, 1000.0]\nquanta = [10.0, 20.0, 30.0]\n")
    opts = policy_options(["mlfq.starvation_factor=2.5"], str(conf))
    cfg = opts["mlfq"]["config"]
    assert isinstance(cfg, MlfqConfig) and cfg.thresholds == (100.0, 1000.0) and cfg.quanta == (10.0, 20.0, 30.0)
    assert cfg.starvation_factor == 2.5
    assert policy_options(["mlfq.quanta=[1, 2, 3]", "tiresias.thresholds=[5]"], None) == {
        "mlfq": {"quanta": (1, 2, 3)}, "tiresias": {"thresholds": (5,)}}
    out = tmp_path / "s.json"
    assert run(trace(tmp_path), "--cluster", "1x1", "-p", "mlfq", "--mlfq-config", str(conf), "--json", str(out)) == 0
    bad = tmp_path / "bad.toml"
    bad.write_text("[scheduler]\nquanta = [1.0]\n")
    with pytest.raises(ValueError, match="quantum per level"):
        policy_options([], str(bad))


def test_a_reservation_window_keeps_every_policy_off_its_nodes(tmp_path):
    """node01 of two held from t=0 for 100 s: the three 1-GPU jobs share the other one until then."""
    out = tmp_path / "s.json"
    assert run(trace(tmp_path), "--cluster", "2x1", "-p", "fifo", "-p", "mlfq", "-p", "sjf",
               "--reservation", "node01:0:100", "--json", str(out)) == 0
    runs = {r["policy"]: r for r in json.loads(out.read_text())["runs"]}
    assert runs["fifo"]["summary"]["mean_jct"] == pytest.approx(40 / 3)  # all on node2, as on a 1-GPU cluster
    assert runs["fifo"]["summary"]["makespan"] == pytest.approx(18)
    assert run(trace(tmp_path), "--cluster", "2x1", "-p", "fifo", "--json", str(out)) == 0
    free = {r["policy"]: r for r in json.loads(out.read_text())["runs"]}["fifo"]
    assert free["summary"]["mean_jct"] < runs["fifo"]["summary"]["mean_jct"]  # two nodes without it


def test_a_daily_window_comes_back_in_the_replay(tmp_path):
    """node01 held 0-100 s every day: a 1-GPU job submitted at 86400 s waits for it to end, the
    same job with a one-off window does not."""
    t = tmp_path / "late.csv"
    t.write_text("submit_time,duration,gpus\n86400,10,1\n86400,10,1\n")
    out = tmp_path / "s.json"
    assert run(str(t), "--cluster", "2x1", "-p", "fifo", "--reservation", "node01:0:100:daily", "--json", str(out)) == 0
    daily = json.loads(out.read_text())["runs"][0]["summary"]
    assert run(str(t), "--cluster", "2x1", "-p", "fifo", "--reservation", "node01:0:100", "--json", str(out)) == 0
    once = json.loads(out.read_text())["runs"][0]["summary"]
    assert once["makespan"] == pytest.approx(10) and daily["makespan"] == pytest.approx(20)


def test_mlfq_without_options_replays_what_the_shipped_controller_config_runs(tmp_path):
    # `hai-sim -p mlfq` is the production default (the Gittins order), the same replay as the
    # [scheduler] table of conf/controller.toml, and not the attained-service order's.
    from pathlib import Path
    conf = Path(__file__).resolve().parents[2] / "conf" / "controller.toml"
    jobs = "submit_time,duration,gpus\n" + "".join(f"{i * 200},{d},{g}\n" for i, (d, g) in enumerate(
        [(20000, 8), (600, 1), (30000, 4), (300, 2), (9000, 8), (1200, 1), (700, 4), (50, 1)] * 3))
    t = trace(tmp_path, jobs)

    def summary(*extra):
        out = tmp_path / "s.json"
        assert run(t, "--cluster", "1x8", "-p", "mlfq", "--baseline", "mlfq", *extra, "--json", str(out)) == 0
        return json.loads(out.read_text())["runs"][0]["summary"]

    default = summary()
    assert default == summary("--mlfq-config", str(conf)) == summary("-o", 'mlfq.order="gittins"')
    assert default != summary("-o", 'mlfq.order="las"')
    assert MlfqConfig().order == "gittins"


def test_known_sizes_bound_from_the_command_line(tmp_path, capsys):
    """--known-sizes: mlfq reads the trace's own size distribution from the start (20 jobs of
    1000 s: none is preempted), said in the JSON and the table's title."""
    path = trace(tmp_path, "submit_time,duration,gpus\n" + "".join(f"{100 * i},1000,1\n" for i in range(20)))
    out = {}
    for flag in ("", "--known-sizes"):
        out[flag] = tmp_path / f"s{flag}.json"
        assert run(path, "--cluster", "1x1", "-p", "mlfq", "--restart-cost", "0", "-o", "mlfq.level_ratio=1.1",
                   *([flag] if flag else []), "--json", str(out[flag])) == 0
    learned, known = (json.loads(out[f].read_text()) for f in ("", "--known-sizes"))
    mlfq = {d["trace"]["known_sizes"]: next(r for r in d["runs"] if r["policy"] == "mlfq") for d in (learned, known)}
    assert mlfq[False]["summary"]["preemptions"] >= 10 and mlfq[True]["summary"]["preemptions"] == 0
    assert " ".join(capsys.readouterr().out.split()).count("sizes known (a bound)") == 1  # the title, wrapped or not
