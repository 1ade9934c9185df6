"""Idle reclamation's pure parts: the clock and its verdicts (scheduling/idle.py), the settings and
their layers (config/idle.py), and the samples the hub keeps for it."""
import pytest

from hai_cluster.config.common import ConfigError, Section
from hai_cluster.config.controller import load_controller_config
from hai_cluster.config.idle import DEFAULTS, IdleRule, IdleSettings, parse_rule, resolve
from hai_cluster.config import TelemetryConfig
from hai_cluster.controller.telemetry import TelemetryHub
from hai_cluster.scheduling.idle import ACT, NONE, WARN, IdleClock, judge, observe, observe_all, warned


def run(clock, samples, threshold=5.0):
    return observe_all(clock, [(t, [u]) for t, u in samples], threshold)


def test_clock_starts_at_the_first_idle_sample_and_resets_on_a_busy_one():
    c = run(IdleClock(), [(0, 50), (10, 1), (20, 2), (30, 0)])
    assert (c.since, c.last, c.idle_for) == (10, 30, 20)
    c = run(c, [(40, 5)])  # at the threshold is busy
    assert (c.since, c.idle_for) == (None, 0.0)
    c = run(c, [(50, 4.9), (70, 0)])
    assert (c.since, c.idle_for) == (50, 20)


def test_every_gpu_must_be_under_the_threshold():
    c = observe(IdleClock(), 0, [0.0, 0.0, 3.0], 5.0)
    assert c.since == 0
    c = observe(c, 10, [0.0, 90.0], 5.0)
    assert c.since is None


def test_a_sample_without_readings_neither_starts_nor_resets():
    c = run(IdleClock(), [(0, 0), (10, 0)])
    assert observe(c, 20, [], 5.0) == c


def test_no_samples_no_idle_time():
    """The clock moves on sample times only: a silent node (link down) adds nothing, however
    long it stays silent; the verdict stays what it was."""
    c = run(IdleClock(), [(0, 0), (100, 0)])
    assert judge(c, window=300, grace=60).kind == NONE
    assert c.idle_for == 100  # and stays so until the next sample arrives


def test_warn_at_the_window_then_act_after_the_grace():
    c = run(IdleClock(), [(0, 0), (299, 0)])
    assert judge(c, 300, 60).kind == NONE
    c = run(c, [(300, 0)])
    v = judge(c, 300, 60)
    assert (v.kind, v.idle_for, v.grace_left) == (WARN, 300, 60)
    c = warned(c)
    assert c.warned == 300
    assert judge(c, 300, 60).kind == NONE  # warned once only
    c = run(c, [(359, 1)])
    assert judge(c, 300, 60).kind == NONE and judge(c, 300, 60).grace_left == 1
    c = run(c, [(360, 0)])
    assert judge(c, 300, 60).kind == ACT


def test_a_busy_sample_in_the_grace_lifts_the_warning():
    c = warned(run(IdleClock(), [(0, 0), (300, 0)]))
    c = run(c, [(310, 80)])
    assert (c.since, c.warned) == (None, None)
    c = run(c, [(320, 0), (1000, 0)])  # idle again: a new window, a new warning first
    assert judge(c, 300, 60).kind == WARN


def test_never_acted_on_without_a_warning_first():
    """A clock far past window + grace (a controller that was down) is warned, not ended."""
    c = run(IdleClock(), [(0, 0), (10_000, 0)])
    assert judge(c, 300, 60).kind == WARN


def test_a_restored_clock_goes_on_from_its_stored_start():
    stored = IdleClock(since=100.0, warned=None)  # what the store keeps: no last sample
    assert judge(stored, 300, 60).kind == NONE
    c = run(stored, [(450, 0)])
    assert (c.idle_for, judge(c, 300, 60).kind) == (350, WARN)
    c = run(IdleClock(since=100.0, warned=400.0), [(470, 0)])
    assert judge(c, 300, 60).kind == ACT


def test_samples_of_other_nodes_out_of_order():
    """A multi-node run: a busy sample older than the newest resets all the same; an idle one
    older than the stretch's start moves the start back."""
    c = run(IdleClock(), [(10, 0), (20, 0)])
    assert run(c, [(15, 99)]).since is None
    assert run(c, [(5, 0)]).since == 5


# ---- settings ------------------------------------------------------------------------------

def test_layers_qos_over_partition_over_interactive_over_defaults():
    base = DEFAULTS
    assert resolve(base, None, IdleRule(), IdleRule()) is None  # batch: off by default
    assert resolve(base, IdleRule(reclaim=True), IdleRule(), IdleRule()) == IdleSettings(5.0, 1800.0, 600.0, "cancel")
    part = IdleRule(reclaim=True, window=60.0, threshold=10.0)
    assert resolve(base, None, part, IdleRule()) == IdleSettings(10.0, 60.0, 600.0, "cancel")
    qos = IdleRule(threshold=2.0, action="requeue")
    assert resolve(base, None, part, qos) == IdleSettings(2.0, 60.0, 600.0, "requeue")
    assert resolve(base, IdleRule(reclaim=True), IdleRule(), IdleRule(reclaim=False)) is None


def _load(tmp_path, text):
    p = tmp_path / "controller.toml"
    p.write_text(text)
    return load_controller_config(str(p))


def test_controller_toml(tmp_path):
    cfg = _load(tmp_path, """
[idle]
threshold = 10
window = "1:00:00"
grace = 120
action = "requeue"
[interactive]
idle_window = "15:00"
[[partitions]]
name = "gpu"
default = true
idle_reclaim = true
[[partitions]]
name = "debug"
[[qos]]
name = "long"
idle_reclaim = false
""")
    assert cfg.idle_settings(interactive=False, partition="gpu", qos=None) == IdleSettings(10.0, 3600.0, 120.0, "requeue")
    assert cfg.idle_settings(interactive=False, partition="debug", qos=None) is None
    assert cfg.idle_settings(interactive=True, partition="debug", qos=None) == IdleSettings(10.0, 900.0, 120.0, "requeue")
    assert cfg.idle_settings(interactive=True, partition="gpu", qos="long") is None
    # none of it given: interactive on (30 min, 10 min grace, under 5 %), batch off
    cfg = _load(tmp_path, "")
    assert cfg.idle_settings(interactive=True, partition=None, qos=None) == IdleSettings(5.0, 1800.0, 600.0, "cancel")
    assert cfg.idle_settings(interactive=False, partition=None, qos=None) is None


@pytest.mark.parametrize("text, words", [
    ("[idle]\nthreshold = 0\n", "idle.threshold must be a percentage"),
    ("[idle]\nthreshold = 101\n", "idle.threshold must be a percentage"),
    ("[idle]\nwindow = 0\n", "idle.window must be positive"),
    ("[idle]\nwindow = \"UNLIMITED\"\n", "idle.window must be a duration, not UNLIMITED"),
    ("[idle]\nwindow = \"soon\"\n", "idle.window"),
    ("[idle]\ngrace = -1\n", "idle.grace must be 0 or more"),
    ("[idle]\naction = \"kill\"\n", "idle.action must be one of cancel, requeue"),
    ("[idle]\nreclaim = 1\n", "idle.reclaim must be true or false"),
    ("[idle]\nwindows = 5\n", "unknown key(s) in [idle]: windows"),
    ("[interactive]\nidle_action = \"requeue\"\n", "interactive.idle_action cannot be requeue"),
    ("[[qos]]\nname = \"x\"\nidle_threshold = \"5\"\n", "idle_threshold must be a number"),
    ("[[partitions]]\nname = \"gpu\"\nidle_grace = \"1:xx\"\n", "idle_grace"),
])
def test_bad_settings_are_refused_by_name(tmp_path, text, words):
    with pytest.raises(ConfigError, match=None) as err:
        _load(tmp_path, text)
    assert words in str(err.value)


def test_parse_rule_takes_only_its_keys():
    sec = Section("f.toml", "t", {"idle_window": "2:00", "other": 1})
    assert parse_rule(sec, "idle_") == IdleRule(window=120.0)
    assert sec.data == {"other": 1}


# ---- the hub keeps each live run's samples for the reclaimer --------------------------------

def _batch(t, util, job=7):
    gpu = {"index": 0, "util": util, "mem_used_mb": 0, "mem_total_mb": 80000, "power_w": 70.0, "temp_c": 30,
           "sm_mhz": 300, "ecc_corrected": 0, "ecc_uncorrected": 0}
    run = {"job_id": job, "attempt": 0, "gpus": [0], "gpu_mem_mb": 0, "cpu_pct": 1.0, "rss_mb": 10, "pids": 1}
    return {"v": 1, "node": "n1", "interval": 1.0,
            "samples": [{"t": t, "gpus": [gpu], "runs": [run], "events": [], "cost_ms": 1.0}]}


def test_hub_hands_the_new_samples_over_once():
    hub = TelemetryHub(TelemetryConfig())
    hub.ingest("n1", _batch(10.0, 0))
    hub.ingest("n1", _batch(11.0, 40))
    assert hub.take_samples() == {(7, 0): [(10.0, (0.0,)), (11.0, (40.0,))]}
    assert hub.take_samples() == {}
    hub.ingest("n1", _batch(11.0, 0))  # sent twice: not taken again
    assert hub.take_samples() == {}


# ---- simulated GPUs: a job's utilization set through gpus.simulated_util_file ----------------

def test_simulated_util_file_sets_a_jobs_gpus_through_the_nvml_calls(tmp_path):
    from hai_cluster.agent.simgpu import SimulatedTelemetryNvml
    util = tmp_path / "util"
    nvml = SimulatedTelemetryNvml("n1", 3, "Sim", 81920, occupancy=lambda: {0: [10], 1: [11]}, busy_util=90,
                                  util_file=str(util), gpu_jobs=lambda: {0: [7], 1: [8]})
    nvml.nvmlInit()
    reading = lambda g: nvml.nvmlDeviceGetUtilizationRates(g).gpu  # noqa: E731
    assert [reading(g) for g in range(3)] == [90, 90, 0]  # no file yet: busy_util; a free GPU idles
    util.write_text("7 3\n8 50\nbad line\n7 2\n999 101\n")
    assert [reading(g) for g in range(3)] == [2, 50, 0]  # the last line for a job wins
    assert nvml.nvmlDeviceGetPowerUsage(0) < nvml.nvmlDeviceGetPowerUsage(1)  # power follows it
    util.unlink()
    (tmp_path / "target").write_text("7 0\n")
    util.symlink_to(tmp_path / "target")  # never followed (the agent is root)
    assert reading(0) == 90


# ---- what the user sees: the mail, the columns, the notice the agent writes ------------------

def test_idle_mail_is_sent_for_idle_or_all_and_says_so():
    import asyncio
    from hai_cluster.controller.mail import Mailer, subject
    from hai_cluster.core.optionvalues import BadValue, _mail_types
    from tests.unit.test_mail import record

    assert subject(record(), "IDLE", start=100.0, end=1900.0) == \
        "Slurm Job_id=12 Name=train GPUs idle, to be reclaimed, Run time 00:30:00"

    def sent(mail_type):
        m = Mailer("/bin/true", "lab")
        m.queue = asyncio.Queue()
        m.notice(record(mail_type=mail_type), "IDLE")
        return m.queue.qsize()
    assert [sent(t) for t in (("IDLE",), ("ALL",), ("END", "FAIL"), ())] == [1, 1, 0, 0]
    assert _mail_types("idle,END") == ("IDLE", "END")
    with pytest.raises(BadValue, match="invalid mail type 'IDLENESS'"):
        _mail_types("IDLENESS")


def test_the_idle_clock_in_hqueue_and_show_job():
    from hai_cluster.cli.hcontrol import job_lines
    from hai_cluster.cli.jobfields import FIELDS
    job = {"idle_for": 750, "idle_limit": 1800}
    assert FIELDS["W"][1](job, 0.0) == "12:30/30:00"
    assert FIELDS["W"][1]({"idle_for": None, "idle_limit": None}, 0.0) == "-"
    base = {"id": 7, "name": "x", "user": "ann", "uid": 1, "gid": 1, "priority": "normal", "partition": "gpu",
            "level": 0, "state": "RUNNING", "reason": "None", "hold": False, "restart_count": 0, "exit_code": 0,
            "exit_signal": 0, "time_limit": None, "submit_time": 0.0, "start_time": 1.0, "end_time": None,
            "nodelist": "n1", "nodes": 1, "cpus_per_task": 1, "tasks_per_node": 1, "mem_mb": None,
            "gpus_per_node": 1, "attained_gpu_seconds": 0.0, "runs": [],
            "spec": {"workdir": "/w", "stdout": None}}
    lines = job_lines({**base, **job}, 100.0)
    assert "IdleFor=00:12:30 IdleLimit=00:30:00" in lines
    assert "IdleFor=N/A IdleLimit=NONE" in job_lines(base, 100.0)


def test_the_agent_checks_the_notice_and_writes_it_without_following_links(tmp_path):
    import json
    import os
    from hai_cluster.agent import spool
    from hai_cluster.agent.service import check_idle_notice
    from hai_cluster.protocol.runspec import SpecError

    good = {"idle_for": 1800, "threshold": 5.0, "window": 1800.0, "grace": 600.0, "action": "cancel",
            "time": 1.0, "message": "job 7: idle"}
    assert check_idle_notice(dict(good)) == good
    for bad, words in (({**good, "action": "kill"}, "action must be cancel or requeue"),
                       ({**good, "grace": -1}, "grace must be a number"), ({**good, "extra": 1}, "unknown field"),
                       ({**good, "message": "x" * 501}, "at most 500"), ({**good, "time": True}, "time must be")):
        with pytest.raises(SpecError, match=words):
            check_idle_notice(bad)
    control = spool.make_control_dir(tmp_path)
    assert spool.write_idle_notice(control, good)
    path = control / spool.IDLE_NOTICE
    assert json.loads(path.read_text()) == good and path.stat().st_mode & 0o777 == 0o644
    assert spool.write_idle_notice(control, None) and not path.exists()
    assert spool.write_idle_notice(control, None)  # already gone: fine
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "linked"
    os.symlink(elsewhere, link)
    assert not spool.write_idle_notice(link, good)  # a control dir that is a link is not followed
    assert not list(elsewhere.iterdir())
    assert not spool.write_idle_notice(tmp_path / "gone", good)  # no control dir: no live run


def test_the_job_library_reads_the_idle_warning(tmp_path, monkeypatch):
    from hai_cluster import job
    from hai_cluster.agent import spool
    control = spool.make_control_dir(tmp_path)
    monkeypatch.setenv("HAI_CONTROL_DIR", str(control))
    assert job.idle_warning() is None
    notice = {"idle_for": 1800, "threshold": 5.0, "window": 1800.0, "grace": 600.0, "action": "cancel",
              "time": 1.0, "message": "job 7: idle"}
    spool.write_idle_notice(control, notice)
    assert job.idle_warning() == notice
    spool.write_idle_notice(control, None)
    assert job.idle_warning() is None
    monkeypatch.delenv("HAI_CONTROL_DIR")
    assert job.idle_warning() is None
