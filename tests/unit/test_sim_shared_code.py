"""hai-sim replays the production policies themselves: found through the registry, never copied."""
import ast
import pathlib

import hai_cluster.sim as sim
from hai_cluster.core.model import Placement
from hai_cluster.scheduling import registry
from hai_cluster.scheduling.plan import Plan, Start
from hai_cluster.sim import runner
from hai_cluster.sim.cluster import Cluster
from hai_cluster.sim.runner import Point, run_all
from hai_cluster.sim.traces import TraceJob

SIM_DIR = pathlib.Path(sim.__file__).parent


def test_the_simulator_gets_its_policies_from_the_scheduling_registry():
    assert runner.make_policy is registry.make_policy
    for name in registry.POLICIES:
        policy = registry.make_policy(name)
        assert type(policy).__module__.startswith("hai_cluster.scheduling."), name


def test_a_policy_registered_for_the_controller_is_what_the_simulator_calls(monkeypatch):
    calls = []

    class Spy:
        name = "spy"

        def decide(self, snap):
            calls.append(snap.now)
            j = next(j for j in snap.jobs if j.state.value == "PENDING")
            return Plan((Start(j.id, Placement(("node01",), ((0,),)), "spy"),))
    monkeypatch.setitem(registry.POLICIES, "spy", registry.PolicyEntry(lambda **_: Spy(), controller=True))
    (r,) = run_all([TraceJob("a", 0, 5, 1)], Cluster(1, 1), ["spy"], [Point()])
    assert calls == [0] and r.result.records[0].end == 5


def test_no_scheduling_code_is_copied_into_the_simulator():
    for path in SIM_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                assert node.name not in ("decide", "place", "fits", "reserve"), f"{path.name} defines {node.name}"
            if isinstance(node, ast.ImportFrom) and node.module and "scheduling" in node.module:
                assert node.module.endswith(("scheduling.registry", "scheduling.plan")), (path.name, node.module)
