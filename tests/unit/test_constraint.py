"""-C/--constraint: Slurm's feature expressions, the node check and the node-set choice, the
submission's checks, and placement by every policy through fits()/place()."""
from dataclasses import replace

import pytest

from hai_cluster.config.agent import load_agent_config
from hai_cluster.config.common import ConfigError
from hai_cluster.core.constraint import ConstraintError, parse_constraint
from hai_cluster.core.jobscript import JobScriptError, parse_submission
from hai_cluster.core.model import GpuInfo, JobView, NodeView, Placement, Snapshot
from hai_cluster.core.resources import could_ever_fit, fits, placement_misfit, unknown_features
from hai_cluster.core.states import JobState
from hai_cluster.scheduling.fifo import FifoPolicy
from hai_cluster.scheduling.mlfq import MlfqConfig, MlfqPolicy
from hai_cluster.scheduling.placement import place, place_on_each

F = frozenset


def node(name, *features, gpus=4, used=()):
    return NodeView(name=name, gpus=tuple(GpuInfo(i, f"{name}{i}", "sim", 1) for i in range(gpus)), cpus=16,
                    mem_mb=64000, partitions=("gpu",), used_gpus=frozenset(used), features=F(features))


def job(text, id=1, nodes=1, gpus=1, **kw):
    return JobView(id=id, user="u", state=JobState.PENDING, submit_time=float(id), nodes=nodes, gpus_per_node=gpus,
                   partition="gpu", constraint=parse_constraint(text), **kw)


# Two racks: a and b hold A100s with InfiniBand in rack1, c and d H100s in rack2.
NODES = {"a": node("a", "a100", "ib", "rack1"), "b": node("b", "a100", "ib", "rack1"),
         "c": node("c", "h100", "rack2"), "d": node("d", "h100", "rack2")}


def test_slurm_syntax_parses_to_what_each_node_and_the_set_must_have():
    assert parse_constraint("a100").node_any == (F({"a100"}),)
    and_ = parse_constraint("a100,ib")  # "," is AND, and Slurm shows it as "&"
    assert and_.node_any == (F({"a100", "ib"}),) and and_.text == "a100&ib"
    assert parse_constraint("a100|h100&ib").node_any == (F({"a100"}), F({"h100", "ib"}))  # & binds tighter
    assert parse_constraint("(a100|h100)&ib").node_any == (F({"a100", "ib"}), F({"h100", "ib"}))
    m = parse_constraint("[rack1|rack2]&ib")
    assert m.matching == (F({"rack1", "ib"}), F({"rack2", "ib"})) and not m.counts
    c = parse_constraint("[(rack1|rack2)*1&h100*2]")
    assert c.counts == (((F({"rack1"}), F({"rack2"})), 1), ((F({"h100"}),), 2)) and c.min_nodes == 3
    single = parse_constraint("a100*2")  # at least two of the job's nodes have it; the others any
    assert single.counts == (((F({"a100"}),), 2),) and single.node_any == (F(),)
    assert parse_constraint("a100|h100").names == {"a100", "h100"}


@pytest.mark.parametrize("text, says", [
    ("", "empty"), ("a100 | h100", "a space at position 5"), ("a100&", "ends where a feature"),
    ("[a100*1&h100]", "every part needs a count"), ("[a|b]*2", "either [a|b]"), ("[a|b*2]", "no counts"),
    ("ib*1&h100", "counts need brackets"), ("(a*2)", "needs brackets"), ("a|[b|c]", "only at the top level"),
    ("[a|b]&[c|d]", "only one bracketed set"), ("[a|b]|c", "only be joined with &"), ("a*0", "whole number"),
    ("a;rm", "';' at position 2"), ("((a)", "expected ')'"), ("a)", "unexpected ')'"), ("x" * 1025, "longer than"),
    ("&".join(f"(a{i}|b{i})" for i in range(7)), "too many alternatives"),
])
def test_malformed_expressions_say_what_is_wrong(text, says):
    with pytest.raises(ConstraintError, match=says.replace("[", r"\[").replace("|", r"\|").replace("*", r"\*")
                       .replace("(", r"\(").replace(")", r"\)")):
        parse_constraint(text)


def test_each_node_and_the_node_set():
    assert [n for n in NODES if fits(job("a100&ib"), NODES[n])] == ["a", "b"]
    assert "c does not have the features a100&ib" == fits(job("a100&ib"), NODES["c"]).reason
    assert place(job("a100|h100", nodes=3), NODES).nodes == ("a", "b", "c")  # OR: nodes may differ
    # matching OR: all from one rack; three nodes exist in no rack, two in each
    assert place(job("[rack1|rack2]", nodes=3), NODES) is None
    assert place(job("[rack1|rack2]", nodes=2), NODES).nodes == ("a", "b")
    busy = {**NODES, "a": node("a", "a100", "ib", "rack1", used=(0, 1, 2, 3))}
    assert place(job("[rack1|rack2]", nodes=2), busy).nodes == ("c", "d")  # rack1 has no room now
    assert place(job("[a100*1&h100*2]", nodes=3), NODES).nodes == ("a", "c", "d")
    assert place(job("a100*2", nodes=3), busy) is None  # only b of the A100s has room
    assert place(job("a100*1", nodes=3), busy).nodes == ("b", "c", "d")
    assert place_on_each(job("[rack1|rack2]", nodes=2), [NODES["b"], NODES["c"]]) is None
    assert place_on_each(job("[rack1|rack2]", nodes=2), [NODES["c"], NODES["d"]]).nodes == ("c", "d")
    # the applier's own check refuses a placement across racks
    mixed = Placement(("b", "c"), ((0,), (0,)))
    assert "do not meet --constraint=[rack1|rack2]" in placement_misfit(job("[rack1|rack2]", nodes=2), mixed, NODES)


def test_the_submission_check_names_what_no_node_has_or_cannot_be_met():
    nodes = tuple(NODES.values())
    assert unknown_features(job("a100&(tpu|ipu)"), nodes) == ["ipu", "tpu"]
    assert could_ever_fit(job("[rack1|rack2]", nodes=2), nodes)
    three = could_ever_fit(job("[rack1|rack2]", nodes=3), nodes)
    assert not three and "no 3 node(s) meet --constraint=[rack1|rack2] together" in three.reason
    few = could_ever_fit(job("a100&ib", nodes=3), nodes)
    assert not few and "the features a100&ib each are needed; 2 node(s) qualify" in few.reason


def test_policies_start_constrained_jobs_only_on_matching_nodes():
    nodes = list(NODES.values())
    jobs = [job("h100", id=1, gpus=4), job("[rack1|rack2]", id=2, nodes=2, gpus=2), job("ib", id=3, gpus=1)]
    for policy in (MlfqPolicy(MlfqConfig()), FifoPolicy()):
        starts = {s.job_id: s.placement for s in policy.decide(Snapshot(100.0, tuple(jobs), tuple(nodes))).starts}
        assert starts[1].nodes[0] in ("c", "d")
        assert starts[2].nodes in (("a", "b"), ("c", "d"))
        assert starts[3].nodes[0] in ("a", "b")


def submit(*options, script="#!/bin/sh\ntrue\n"):
    return parse_submission(script, list(options), cwd="/tmp", env={}, now=0.0).spec


def test_sbatch_options_and_the_node_count_the_counts_ask():
    assert submit("-C", "a100,ib").constraint == "a100&ib"
    assert submit(script="#!/bin/sh\n#SBATCH --constraint=[rack1|rack2] -N2\ntrue\n").constraint == "[rack1|rack2]"
    assert submit("--constraint=[a100*1&h100*2]").nodes == 3  # -N defaults to the counts
    with pytest.raises(JobScriptError, match=r"-C \[a\*1&b\*2\]: its counts ask for 3 nodes, more than the job's -N 2"):
        submit("-N", "2", "-C", "[a*1&b*2]")
    with pytest.raises(JobScriptError, match="Invalid feature specification: a space at position 5"):
        submit("-C", "a100 | h100")
    spec = parse_submission("#!/bin/sh\ntrue\n", [], cwd="/tmp", env={"SBATCH_CONSTRAINT": "h100"}, now=0.0).spec
    assert spec.constraint == "h100"


def test_agent_declares_features_and_refuses_bad_names(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text('[agent]\nname = "n1"\nfeatures = ["a100", "ib", "a100"]\n')
    assert load_agent_config(path).features == ("a100", "ib")
    path.write_text('[agent]\nname = "n1"\nfeatures = ["a100", "rack 1"]\n')
    with pytest.raises(ConfigError, match=r"agent.features: feature 'rack 1' is not a name"):
        load_agent_config(path)


def test_constraint_keeps_jobs_of_the_wrong_kind_off_even_with_room():
    """A job of no constraint goes anywhere; one with -C waits for its kind even when others are free."""
    only_c = {"c": NODES["c"], "a": node("a", "a100", used=(0, 1, 2, 3))}
    assert place(job("a100"), only_c) is None
    assert place(replace(job("a100"), constraint=None), only_c).nodes == ("c",)


def test_counts_and_node_counts_that_do_not_add_up_are_refused_or_met():
    with pytest.raises(JobScriptError, match=r"its counts ask for 2 nodes, more than the job's -N 1"):
        submit("-n", "4", "-C", "a100*2")  # -n alone asks for one node
    assert submit("-w", "n1", "-C", "[a*1&b*1]").nodes == 2  # the most of what -w and -C ask
    # a node of two groups serves the scarcer one: n2 (a only) takes a, n1 takes b
    both = {"n1": node("n1", "a", "b"), "n2": node("n2", "a")}
    assert place(job("[a*1&b*1]", nodes=2), both).nodes == ("n1", "n2")
    assert parse_constraint("[a*3&b*1]").choose(list(both.values()), 2, lambda n: n.features) is None
    with pytest.raises(ConstraintError, match="nested deeper than 16"):
        parse_constraint("(" * 300 + "a" + ")" * 300)
    with pytest.raises(JobScriptError, match="a GPU share takes -C with per-node features only"):
        submit("--gpus-per-node=0.5", "-C", "[r1|r2]")
