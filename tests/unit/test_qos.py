"""--qos: [[qos]] tables, what a QOS gives a submission, and its per-user limits in every policy."""
from dataclasses import replace

import pytest

from hai_cluster.config.common import ConfigError
from hai_cluster.config.controller import load_controller_config
from hai_cluster.controller.partitions import PartitionRefused, admit_qos, qos_time_limit
from hai_cluster.core.jobscript import parse_submission
from hai_cluster.core.model import GpuInfo, JobView, NodeView, Snapshot
from hai_cluster.core.quota import Quotas
from hai_cluster.core.states import JobState
from hai_cluster.scheduling.plan import Start, Wait
from hai_cluster.scheduling.registry import CONTROLLER_POLICIES, make_policy

QOS_TOML = '''
[controller]
default_qos = "normal"

[[qos]]
name = "high"
priority = "high"
max_time = "4:00:00"
max_gpus_per_user = 4
allowed_accounts = ["vision"]

[[qos]]
name = "debug"
priority = "urgent"
max_time = "30:00"
max_jobs_per_user = 1
description = "one short job at a time"
'''


@pytest.fixture
def cfg(tmp_path):
    path = tmp_path / "controller.toml"
    path.write_text(QOS_TOML)
    return load_controller_config(path)


def spec(*options):
    return parse_submission("#!/bin/sh\ntrue\n", list(options), cwd="/tmp", env={}, now=0.0).spec


def test_tables_and_the_normal_qos_that_always_exists(cfg, tmp_path):
    assert [q.name for q in cfg.qos] == ["normal", "high", "debug"]
    assert cfg.qos_named("high").max_time == 4 * 3600 and cfg.qos_named("debug").max_jobs_per_user == 1
    bad = tmp_path / "bad.toml"
    for text, says in [('[[qos]]\nname = "x"\npriority = "vip"\n', "priority must be one of"),
                       ('[[qos]]\nname = "x y"\n', r"qos\[0\].name is required"),
                       ('[[qos]]\nname = "x"\nmax_gpus_per_user = -1\n', "max_gpus_per_user must be >= 0"),
                       ('[[qos]]\nname = "x"\n[[qos]]\nname = "x"\n', "the name is given twice"),
                       ('[[qos]]\nname = "x"\nmaxtime = "1:00"\n', "maxtime"),
                       ('[controller]\ndefault_qos = "gold"\n', "default_qos 'gold' is not")]:
        bad.write_text(text)
        with pytest.raises(ConfigError, match=says):
            load_controller_config(bad)


def admitted(cfg, s, user="ann", account="vision", groups=frozenset(), admin=False):
    return admit_qos(s, cfg, user=user, account=account, groups=set(groups), admin=admin)


def test_a_named_qos_sets_the_class_and_the_limit_of_a_job_without_one(cfg):
    s, granted = admitted(cfg, spec("--qos=high"))
    assert (s.qos, s.priority, granted) == ("high", "high", True)
    assert qos_time_limit(s, cfg, None).time_limit == 4 * 3600  # the MaxWall of a job without -t
    short = qos_time_limit(replace(s, time_limit=3600), cfg, None)  # its partition's max_time is shorter
    assert short.time_limit == 3600 and qos_time_limit(replace(s, time_limit=60), cfg, 60).time_limit == 60
    named, _ = admitted(cfg, spec("-q", "high", "--priority=low"))  # a named QOS sets the class
    assert named.priority == "high"
    plain, granted = admitted(cfg, spec("--priority=high"))  # the default QOS leaves --priority be
    assert (plain.qos, plain.priority, plain.time_limit, granted) == ("normal", "high", None, False)


@pytest.mark.parametrize("options, account, says", [
    (["--qos=gold"], "vision", "Invalid qos specification: no QOS named gold (hcontrol show qos lists them)"),
    (["--qos=high"], "nlp", "Invalid qos specification: QOS high is not open to user ann or account nlp"),
    (["--qos=debug", "-t", "1:00:00"], "nlp",
     "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits): 1:00:00 is more "
     "than MaxWall=30:00 of QOS debug"),
])
def test_refusals_in_slurms_words(cfg, options, account, says):
    with pytest.raises(PartitionRefused) as exc:
        admitted(cfg, spec(*options), account=account)
    assert str(exc.value) == says
    assert admitted(cfg, spec("--qos=high"), account="nlp", admin=True)[0].qos == "high"  # admins may use any


def node(name):
    return NodeView(name=name, gpus=tuple(GpuInfo(i, f"{name}{i}", "sim", 1) for i in range(8)), cpus=64,
                    mem_mb=64000, partitions=("gpu",))


def job(id, qos, gpus=2, user="ann", state=JobState.PENDING, **kw):
    return JobView(id=id, user=user, state=state, submit_time=float(id), nodes=1, gpus_per_node=gpus,
                   partition="gpu", qos=qos, **kw)


@pytest.mark.parametrize("name", sorted(CONTROLLER_POLICIES))
def test_every_policy_keeps_a_users_jobs_of_a_qos_within_its_limits(name):
    quotas = Quotas(qos_user_gpus={"high": 4}, qos_user_jobs={"debug": 1})
    running = job(1, "high", gpus=2, state=JobState.RUNNING, run_start=0.0,
                  allocation=(("a", (0, 1)),), nodelist=("a",))
    jobs = (running, job(2, "high", gpus=2), job(3, "high", gpus=2), job(4, "debug", gpus=1),
            job(5, "debug", gpus=1), job(6, "high", gpus=2, user="bob"), job(7, "normal", gpus=2))
    nodes = (replace(node("a"), used_gpus=frozenset({0, 1}), used_cpus=1), node("b"))
    plan = make_policy(name).decide(Snapshot(now=10.0, jobs=jobs, nodes=nodes, quotas=quotas))
    started = {a.job_id for a in plan.actions if isinstance(a, Start)}
    waits = {a.job_id: a.reason for a in plan.actions if isinstance(a, Wait)}
    assert {2, 4, 6, 7} <= started and not {3, 5} & started  # 2 reaches ann's 4 GPUs of high; 4 is debug's one
    assert waits[3] == "QOSMaxGRESPerUser" and waits[5] == "QOSMaxJobsPerUserLimit"
