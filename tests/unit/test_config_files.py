"""The example configs in conf/ load, and the shipped MLFQ defaults are the code's defaults (the
ones docs/BENCHMARKS.md justifies)."""
from pathlib import Path

import pytest

from hai_cluster.config import ConfigError, load_agent_config, load_controller_config
from hai_cluster.scheduling.mlfq import MlfqConfig

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_example_configs_load_and_match_the_defaults():
    ctl = load_controller_config(CONF / "controller.toml")
    assert ctl.scheduler.mlfq == MlfqConfig()
    assert [n.name for n in ctl.nodes] == ["gpu01", "gpu02"]
    agent = load_agent_config(CONF / "agent.toml")
    assert agent.name == "gpu01" and agent.shepherd_start == "fork"


@pytest.mark.parametrize("text, message", [
    ("[scheduler]\nquanta = [1.0]\n", "one quantum per level"),
    ("[scheduler]\nthresholds = [10.0, 5.0]\n", "increasing"),
    ("[scheduler]\npolicy = \"lottery\"\n", "scheduler.policy"),
    ("[scheduler]\nmax_user_priority = \"godlike\"\n", "max_user_priority"),
    ("[scheduler]\nquantum = 5\n", "unknown key(s) in [scheduler]: quantum"),
    ("[scheduler]\norder = \"sjf\"\n", "mlfq order must be gittins or las, got 'sjf'"),
    ("[scheduler]\norder = 1\n", "scheduler.order must be a string"),
    ("[scheduler]\nrestart_cost = -5\n", "mlfq restart_cost must not be negative"),
    ("[scheduler]\nrestart_cost = \"30s\"\n", "scheduler.restart_cost must be a number"),
    ("[scheduler]\nlevel_ratio = 1\n", "mlfq level_ratio must be > 1"),
    ("[scheduler]\npreempt_margin = 0\n", "mlfq preempt_margin must be >= 1"),
    ("[scheduler]\npreempt_margin = 1.5\n", "scheduler.preempt_margin must be an integer"),
    ("[scheduler]\nfinish_likely = 2.0\n", "mlfq finish_likely must be a probability"),
    ("[scheduler]\nmax_preemptions = -1\n", "mlfq max_preemptions must not be negative"),
    ("[scheduler]\nlift_factor = -1.0\n", "mlfq lift_factor must not be negative"),
    ("[controller]\ntick_seconds = \"fast\"\n", "controller.tick_seconds must be a number"),
    ("[controller]\nmin_pass_interval = -1.0\n", "controller.min_pass_interval must be >= 0"),
    ("[[nodes]]\naddress = \"x\"\n", "nodes[0].name is required"),
    ("[[nodes]]\nname = \"a\"\ntransport = \"carrier-pigeon\"\n", "transport must be ssh or local"),
    ("not toml at all [", "invalid TOML"),
])
def test_bad_controller_configs_name_the_key(tmp_path, text, message):
    path = tmp_path / "controller.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        load_controller_config(path)


def test_scheduler_reads_the_gittins_settings(tmp_path):
    path = tmp_path / "controller.toml"
    path.write_text('[scheduler]\norder = "las"\nrestart_cost = 90\nlevel_ratio = 2.0\npreempt_margin = 2\n'
                    'min_run_restarts = 5\nfinish_likely = 1.0\nfinish_window = 3.0\nmax_preemptions = 0\n'
                    'lift_factor = 8.0\nlift_floor = 36000\nmax_slowdown = 4.0\nslowdown_floor = 600\n')
    m = load_controller_config(path).scheduler.mlfq
    assert (m.order, m.restart_cost, m.level_ratio, m.preempt_margin, m.min_run_restarts) == ("las", 90.0, 2.0, 2, 5.0)
    assert (m.finish_likely, m.finish_window, m.max_preemptions) == (1.0, 3.0, 0)
    assert (m.lift_factor, m.lift_floor, m.max_slowdown, m.slowdown_floor) == (8.0, 36000.0, 4.0, 600.0)


@pytest.mark.parametrize("mode", ["fork", "exec"])
def test_agent_shepherd_start_is_read(tmp_path, mode):
    path = tmp_path / "agent.toml"
    path.write_text(f'[agent]\nshepherd_start = "{mode}"\n')
    assert load_agent_config(path).shepherd_start == mode


@pytest.mark.parametrize("text, message", [
    ('[agent]\nshepherd_start = "clone"\n', "agent.shepherd_start must be fork or exec, got 'clone'"),
    ("[agent]\nshepherd_start = true\n", "agent.shepherd_start must be a string"),
    ("[agent]\ncpus = -1\n", "agent.cpus must be >= 0"),
    ("[agent]\ncpus = \"many\"\n", "agent.cpus must be an integer"),
])
def test_bad_agent_configs_name_the_key(tmp_path, text, message):
    path = tmp_path / "agent.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_agent_config(path)
