"""[[partitions]] tables in the controller config, and which partitions take a submission."""
import pytest

from hai_cluster.config import ConfigError, load_controller_config
from hai_cluster.controller.partitions import PartitionRefused, admit
from hai_cluster.core.model import GpuInfo, JobSpec, JobView, NodeView
from hai_cluster.core.states import JobState
from hai_cluster.scheduling.placement import place

TABLES = """
[[partitions]]
name = "gpu"
default = true
[[partitions]]
name = "short"
max_time = "1:00:00"
nodes = ["n2"]
[[partitions]]
name = "private"
allowed_users = ["alice"]
allowed_groups = ["ml"]
[[nodes]]
name = "n1"
[[nodes]]
name = "n2"
[[nodes]]
name = "n3"
partitions = ["private"]
"""


def load(tmp_path, text):
    path = tmp_path / "controller.toml"
    path.write_text(text)
    return load_controller_config(path)


def test_partition_tables(tmp_path):
    cfg = load(tmp_path, TABLES)
    assert cfg.partitions == ("gpu", "short", "private") and cfg.default_partition == "gpu"
    assert {n.name: n.partitions for n in cfg.nodes} == {
        "n1": ("gpu", "private"), "n2": ("gpu", "short", "private"), "n3": ("private",)}
    assert cfg.partition("short").max_time == 3600 and cfg.partition("gpu").max_time is None
    assert cfg.partition("private").allows("bob", {"ml"}) and not cfg.partition("private").allows("bob", {"bob"})


@pytest.mark.parametrize("text, message", [
    ("[controller]\npartitions = [\"a\"]\n[[partitions]]\nname = \"a\"\n", "not both"),
    ("[[partitions]]\nname = \"a\"\nmax_time = \"soon\"\n", "partitions[0].max_time"),
    ("[[partitions]]\nname = \"a\"\nmaxtime = \"1:00\"\n", "unknown key(s) in [partitions[0]]: maxtime"),
    ("[[partitions]]\nname = \"a\"\ndefault = true\n[[partitions]]\nname = \"b\"\ndefault = true\n",
     "partitions[1].default: 'a' is already the default"),
    ("[[partitions]]\nname = \"a\"\nnodes = [\"zz\"]\n", "partitions[0].nodes names unknown node 'zz'"),
    ("[[partitions]]\nname = \"a\"\n[[partitions]]\nname = \"a\"\n", "given twice"),
    ("[[partitions]]\nmax_time = \"1:00\"\n", "partitions[0].name is required"),
    ("[controller]\ndefault_partition = \"a\"\n[[partitions]]\nname = \"a\"\ndefault = true\n", "set twice"),
    ("[[partitions]]\nname = \"a\"\nnodes = [\"n2\"]\n[[nodes]]\nname = \"n1\"\n[[nodes]]\nname = \"n2\"\n",
     "nodes[0] (n1) is in no partition"),
    ("[controller]\nmax_array_size = 0\n", "controller.max_array_size must be positive"),
])
def test_bad_partition_configs_name_the_file_and_key(tmp_path, text, message):
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, text)
    assert message in str(exc.value) and str(tmp_path / "controller.toml") in str(exc.value)


def spec(**kw):
    return JobSpec(script="#!/bin/sh\n", workdir="/tmp", **kw)


def test_admit(tmp_path):
    cfg = load(tmp_path, TABLES)
    assert admit(spec(), cfg, user="bob", groups=set(), admin=False)[0] == "gpu"
    column, s = admit(spec(partition="short"), cfg, user="bob", groups=set(), admin=False)
    assert (column, s.time_limit) == ("short", 3600)  # no -t: the partition's MaxTime
    with pytest.raises(PartitionRefused, match=r"2:00:00 is more than MaxTime=1:00:00 of partition short"):
        admit(spec(partition="short", time_limit=7200), cfg, user="bob", groups=set(), admin=False)
    with pytest.raises(PartitionRefused, match="user bob may not use partition private"):
        admit(spec(partition="private"), cfg, user="bob", groups=set(), admin=False)
    assert admit(spec(partition="private"), cfg, user="bob", groups={"ml"}, admin=False)[0] == "private"
    assert admit(spec(partition="private"), cfg, user="root", groups=set(), admin=True)[0] == "private"
    column, s = admit(spec(partition="private,short,gpu", time_limit=7200), cfg, user="bob", groups=set(), admin=False)
    assert (column, s.partition, s.time_limit) == ("gpu", "gpu", 7200)  # the others dropped
    with pytest.raises(PartitionRefused, match="invalid partition specified: nope"):
        admit(spec(partition="gpu,nope"), cfg, user="bob", groups=set(), admin=False)


def node(name, partitions, used=()):
    return NodeView(name=name, gpus=tuple(GpuInfo(i, f"{name}{i}", "sim", 1) for i in range(2)), cpus=8, mem_mb=1000,
                    partitions=partitions, used_gpus=frozenset(used))


def test_a_gang_is_placed_in_one_of_its_partitions_the_first_with_room():
    nodes = {n.name: n for n in (node("a1", ("a",)), node("a2", ("a",), used=(0, 1)), node("b1", ("b",)),
                                 node("b2", ("b",)))}
    job = JobView(id=1, user="u", state=JobState.PENDING, submit_time=0, nodes=2, gpus_per_node=2, partition="a,b")
    assert place(job, nodes).nodes == ("b1", "b2")  # a has one free node, a gang never spans a and b
    one = JobView(id=2, user="u", state=JobState.PENDING, submit_time=0, nodes=1, gpus_per_node=1, partition="b,a")
    assert place(one, nodes).nodes[0].startswith("b")
    nodes["b1"] = node("b1", ("b",), used=(0, 1))
    assert place(job, nodes) is None
