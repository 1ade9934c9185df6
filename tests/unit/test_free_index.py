"""The free-GPU index finds the nodes place() chooses: on random working copies (free GPUs, free
CPUs, partitions, drained nodes), after random changes, for both node orders and any excluded set."""
import random

import pytest

from hai_cluster.core.model import GpuInfo, JobView, NodeView
from hai_cluster.core.states import JobState
from hai_cluster.scheduling.placement import place, place_on_each, placement_on, reserve
from hai_cluster.scheduling.victims import FreeIndex


def random_nodes(rng: random.Random) -> dict[str, NodeView]:
    per_node = rng.choice([2, 4, 8])
    gpus = tuple(GpuInfo(i, f"G{i}", "sim", 1) for i in range(per_node))
    nodes = {}
    for i in range(rng.randint(1, 30)):
        used = frozenset(rng.sample(range(per_node), rng.randint(0, per_node)))
        nodes[f"n{i:02d}"] = NodeView(name=f"n{i:02d}", gpus=gpus, cpus=16, mem_mb=1000,
                                      partitions=(rng.choice(["gpu", "debug"]),),
                                      state="drain" if rng.random() < 0.1 else "up", used_gpus=used,
                                      used_cpus=rng.randint(0, 16))
    return nodes


def random_job(rng: random.Random, jid: int) -> JobView:
    return JobView(id=jid, user="u", state=JobState.PENDING, submit_time=0.0, nodes=rng.choice([1, 1, 2, 3]),
                   gpus_per_node=rng.choice([0, 1, 2, 4, 8]), cpus_per_task=rng.choice([1, 4, 12]),
                   partition=rng.choice([None, "gpu", "debug"]))


@pytest.mark.parametrize("mode", ["binpack", "spread"])
def test_first_fitting_chooses_what_place_chooses(mode):
    found = 0
    for seed in range(300):
        rng = random.Random(seed)
        nodes = random_nodes(rng)
        index = FreeIndex(nodes, mode)
        for jid in range(8):
            job = random_job(rng, jid)
            excluded = set(rng.sample(sorted(nodes), rng.randint(0, 2) if len(nodes) > 2 else 0))
            expected = place(job, nodes, mode, only=[n for n in nodes if n not in excluded])
            chosen = index.first_fitting(job, excluded)
            assert (None if chosen is None else placement_on(job, chosen)) == expected, f"seed {seed} job {jid}"
            if expected is not None:
                found += 1
                reserve(job, expected, nodes)  # the pass changes its working copy; the index follows
                for name in expected.nodes:
                    index.update(name)
    assert found > 300  # the jobs did find room, often


@pytest.mark.parametrize("mode", ["binpack", "spread"])
def test_place_on_each_is_place_on_exactly_those_nodes(mode):
    found = missed = 0
    for seed in range(300):
        rng = random.Random(seed)
        nodes = random_nodes(rng)
        job = random_job(rng, seed)
        if job.nodes > len(nodes):
            continue
        offered = {name: nodes[name] for name in rng.sample(sorted(nodes), job.nodes)}
        expected = place(job, offered, mode)
        assert place_on_each(job, list(offered.values())) == expected, f"seed {seed}"
        found += expected is not None
        missed += expected is None
    assert found > 30 and missed > 30  # both answers were compared, often
