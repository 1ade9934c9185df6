from hai_cluster.agent.health import gpu_count_problem, spool_problem


def test_gpu_count_change_is_a_problem():
    assert gpu_count_problem(8, 8) is None
    assert gpu_count_problem(8, 7) == "GPU count changed: 8 at agent start, 7 now"


def test_spool_nearly_full_is_a_problem():
    mib = 1024 * 1024
    assert spool_problem("/s", 90 * mib, 100 * mib, 95.0) is None
    why = spool_problem("/s", 96 * mib, 100 * mib, 95.0)
    assert why == "spool filesystem of /s is 96% full (limit 95%, 4 MiB free)"
    assert spool_problem("/s", 0, 0, 95.0) is None


# ---- critical XIDs -----------------------------------------------------------------------------

import asyncio  # noqa: E402
import time  # noqa: E402

import sqlalchemy as sa  # noqa: E402

from hai_cluster.agent.health import HealthChecker, xid_problem  # noqa: E402
from hai_cluster.agent.simgpu import SimulatedTelemetryNvml  # noqa: E402
from hai_cluster.agent.telemetry import Sampler  # noqa: E402
from hai_cluster.config import DEFAULT_CRITICAL_XIDS, AgentConfig, SimulatedGpus  # noqa: E402
from hai_cluster.store import schema  # noqa: E402
from hai_cluster.store.nodehealth import STICKY_NOTE, apply_health  # noqa: E402


def test_only_critical_xids_are_problems():
    assert xid_problem(3, 79, DEFAULT_CRITICAL_XIDS) == "GPU 3 XID 79 (GPU has fallen off the bus): needs a GPU reset"
    assert xid_problem(0, 13, DEFAULT_CRITICAL_XIDS) is None  # a graphics engine exception: the job's fault
    assert xid_problem(0, 13, (13,)) == "GPU 0 XID 13 (critical error): needs a GPU reset"


def test_simulated_xid_file_reaches_the_health_check(tmp_path):
    """An XID line in the simulated GPUs' file goes through the sampler's NVML event thread to the
    health checker, which reports it (sticky) ahead of the other checks until a controller got it."""
    xids = tmp_path / "xids"
    xids.write_text("0 79\n")  # written before the event set exists: not an event (as on NVML)
    cfg = AgentConfig(name="n1", spool=str(tmp_path), gpu_backend="simulated",
                      simulated=SimulatedGpus(count=2, xid_file=str(xids)), health_check_interval=0.05)
    checker = HealthChecker(cfg, 2)
    nvml = SimulatedTelemetryNvml("n1", 2, "Sim", 1000, occupancy=dict, xid_file=str(xids))
    sampler = Sampler(nvml, "n1", 1.0, 10, on_event=checker.note_event)
    sampler.open()
    try:
        with open(xids, "a") as f:
            f.write("1 13\n1 79\njunk\n0 4")  # a harmless XID, a critical one, junk, half a line
        deadline = time.monotonic() + 30
        while len(sampler.events) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [(e["gpu"], e["value"]) for e in sampler.events] == [(1, 13), (1, 79)]
    finally:
        sampler.close()

    pushed = []

    async def push(name, body):
        pushed.append(body)
        return len(pushed) > 1  # the first report is not delivered: it is sent again

    async def scenario():
        task = asyncio.create_task(checker.run(push))
        while len(pushed) < 3:
            await asyncio.sleep(0.01)
        task.cancel()
    asyncio.run(scenario())
    reason = "GPU 1 XID 79 (GPU has fallen off the bus): needs a GPU reset"
    assert pushed[:3] == [{"ok": False, "reason": reason, "sticky": True}] * 2 + [{"ok": True, "reason": ""}]


def nodes_db():
    engine = sa.create_engine("sqlite://")
    schema.metadata.create_all(engine)
    with engine.begin() as c:
        c.execute(sa.insert(schema.nodes).values(name="n1", address="h", state="up", partitions=[]))
    return engine


def node_row(engine):
    with engine.connect() as c:
        return tuple(c.execute(sa.select(schema.nodes.c.state, schema.nodes.c.reason)).one())


def test_sticky_drain_waits_for_an_admin():
    engine = nodes_db()
    assert apply_health(engine, "n1", False, "GPU 1 XID 79 (x)", sticky=True) == "drained"
    drained = ("drain", "health: GPU 1 XID 79 (x)" + STICKY_NOTE)
    assert node_row(engine) == drained
    assert apply_health(engine, "n1", True, "") is None  # passing checks do not resume it
    assert apply_health(engine, "n1", False, "spool full") is None  # nor replace its reason
    assert node_row(engine) == drained
    with engine.begin() as c:  # the admin's resume
        c.execute(sa.update(schema.nodes).values(state="up", reason=None))
    assert apply_health(engine, "n1", True, "") is None and node_row(engine) == ("up", None)


def test_sticky_report_takes_over_an_admin_drain():
    engine = nodes_db()
    with engine.begin() as c:
        c.execute(sa.update(schema.nodes).values(state="drain", reason="maintenance"))
    assert apply_health(engine, "n1", False, "GPU 0 XID 48 (x)", sticky=True) is None
    assert node_row(engine) == ("drain", "health: GPU 0 XID 48 (x)" + STICKY_NOTE)
    # a second XID keeps the first reason
    apply_health(engine, "n1", False, "GPU 1 XID 79 (x)", sticky=True)
    assert node_row(engine)[1].startswith("health: GPU 0 XID 48")


def test_critical_xids_config(tmp_path):
    from hai_cluster.config import ConfigError, load_agent_config
    path = tmp_path / "agent.toml"
    path.write_text('[agent]\nname = "n"\ncritical_xids = [79]\n[gpus]\nsimulated_xid_file = "xids"\n')
    cfg = load_agent_config(path)
    assert cfg.critical_xids == (79,) and cfg.simulated.xid_file == str(tmp_path / "xids")
    assert load_agent_config(tmp_path / "agent.toml").critical_xids == (79,)
    path.write_text('[agent]\nname = "n"\ncritical_xids = ["79"]\n')
    try:
        load_agent_config(path)
        raise AssertionError("a string XID was accepted")
    except ConfigError as exc:
        assert "agent.critical_xids must be a list of XID numbers" in str(exc)
    path.write_text('[agent]\nname = "n"\n')
    assert load_agent_config(path).critical_xids == DEFAULT_CRITICAL_XIDS
