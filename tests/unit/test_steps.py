"""Job steps' pure layout (core/steps.py) and their messages (protocol/steps.py). The expected
layouts, warnings and errors are Slurm 22.05's, from the same srun lines in an allocation of
`-N 2 --ntasks-per-node=2` on the Slurm peer (srun reads SLURM_NNODES=2, SLURM_NTASKS=4 and
SLURM_NTASKS_PER_NODE=2 from the job as its defaults, so they are given here as srun sends them)."""
from __future__ import annotations

import pytest

from hai_cluster.core.steps import (Allocation, StepError, StepRequest, Task, layout_from_wire, plan_step,
                                    task_environment, tasks_per_node_text)
from hai_cluster.protocol import steps as wire
from hai_cluster.protocol.runspec import SpecError

ALLOC = Allocation(7, ("n1", "n2"), 2, 1, ((0, 1), (2, 3)))


def env_defaults(**kw) -> StepRequest:
    given = dict(nodes=2, ntasks=4, ntasks_per_node=2)
    given.update(kw)
    return StepRequest(**given)


def plan(req: StepRequest, alloc: Allocation = ALLOC):
    layout, warnings = plan_step(alloc, req, 3)
    return tasks_per_node_text(layout.counts), [(t.procid, layout.nodes[t.node], t.localid) for t in layout.tasks], warnings


def test_the_default_step_is_every_task_of_the_allocation_in_blocks():
    counts, tasks, warnings = plan(env_defaults())
    assert counts == "2(x2)" and warnings == []
    assert tasks == [(0, "n1", 0), (1, "n1", 1), (2, "n2", 0), (3, "n2", 1)]
    assert plan(StepRequest())[:2] == (counts, tasks)  # nothing given: the same


def test_an_uneven_count_gives_the_first_nodes_one_more_and_warns_as_srun():
    counts, tasks, warnings = plan(env_defaults(ntasks=3))
    assert counts == "2,1" and [t[1] for t in tasks] == ["n1", "n1", "n2"]
    assert warnings == ["can't honor --ntasks-per-node set to 2 which doesn't match the requested tasks 3 with "
                        "the number of requested nodes 2. Ignoring --ntasks-per-node."]
    assert plan(env_defaults(ntasks=2))[2] == []  # 2 tasks on 2 nodes: Slurm says nothing


def test_fewer_tasks_than_nodes_cut_the_nodes():
    counts, tasks, warnings = plan(env_defaults(ntasks=1, exclude=("n1",)))
    assert counts == "1" and tasks == [(0, "n2", 0)]
    assert warnings == ["can't run 1 processes on 2 nodes, setting nnodes to 1"]


@pytest.mark.parametrize("req, message", [
    (env_defaults(ntasks=99), "Unable to create step for job 7: More processors requested than permitted"),
    (env_defaults(nodes=1), "Unable to create step for job 7: More processors requested than permitted"),
    (env_defaults(nodes=3), "Only allocated 2 nodes asked for 3"),
    (env_defaults(nodelist=("n9",)), "Unable to create step for job 7: Requested node configuration is not "
                                     "available (node n9 is not in the job's allocation n[1-2])"),
    (env_defaults(gpus_per_task=2), "Unable to create step for job 7: Requested node configuration is not "
                                    "available (2 task(s) x 2 GPU(s) on n1, which holds 2 for the job)"),
    (env_defaults(cpus_per_task=2), "Unable to create step for job 7: More processors requested than permitted"),
])
def test_a_step_beyond_the_allocation_is_refused_with_sruns_message(req, message):
    with pytest.raises(StepError) as e:
        plan_step(ALLOC, req, 0)
    assert str(e.value) == message


def test_gpus_per_task_gives_each_task_its_own_gpus_of_its_node():
    layout, _ = plan_step(ALLOC, env_defaults(gpus_per_task=1), 0)
    assert [t.gpus for t in layout.tasks] == [(0,), (1,), (2,), (3,)]
    layout, _ = plan_step(ALLOC, env_defaults(), 0)
    assert [t.gpus for t in layout.tasks] == [(0, 1), (0, 1), (2, 3), (2, 3)]  # the node's all


def test_nodelist_picks_the_nodes_in_allocation_order():
    counts, tasks, _ = plan(StepRequest(nodes=1, ntasks=1, nodelist=("n2",)))
    assert tasks == [(0, "n2", 0)]


def test_a_task_environment_is_slurms_and_torchs_and_its_nodes_own():
    layout, _ = plan_step(ALLOC, env_defaults(gpus_per_task=1), 5)
    base = {"PATH": "/bin", "SLURMD_NODENAME": "n1", "HAI_CONTROL_DIR": "/spool1/c", "CUDA_VISIBLE_DEVICES": "0,1"}
    node = {"SLURMD_NODENAME": "n2", "HAI_CONTROL_DIR": "/spool2/c"}
    env = task_environment(base, node, layout, layout.tasks[3], "10.0.0.1")
    assert env["PATH"] == "/bin" and env["SLURMD_NODENAME"] == "n2" and env["HAI_CONTROL_DIR"] == "/spool2/c"
    assert {k: env[k] for k in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_ID", "SLURM_STEPID",
                                "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NUM_NODES", "SLURM_STEP_NODELIST",
                                "SLURM_STEP_TASKS_PER_NODE", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                                "LOCAL_WORLD_SIZE", "MASTER_ADDR", "CUDA_VISIBLE_DEVICES")} == {
        "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_STEP_ID": "5", "SLURM_STEPID": "5",
        "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "CUDA_VISIBLE_DEVICES": "3"}


def test_each_step_has_its_own_master_port_unless_the_script_chose_one():
    ports = []
    for step in range(3):
        layout, _ = plan_step(ALLOC, env_defaults(), step)
        ports.append(task_environment({"MASTER_PORT": "10007"}, {}, layout, layout.tasks[0], "n1")["MASTER_PORT"])
    assert ports[0] == "10007" and len(set(ports)) == 3 and all(10000 <= int(p) < 30000 for p in ports)
    layout, _ = plan_step(ALLOC, env_defaults(), 2)
    assert task_environment({"MASTER_PORT": "29500"}, {}, layout, layout.tasks[0], "n1")["MASTER_PORT"] == "29500"


def test_a_layout_crosses_the_wire_and_garbage_does_not():
    layout, _ = plan_step(ALLOC, env_defaults(ntasks=3), 2)
    assert layout_from_wire(layout.to_wire()) == layout
    bad = layout.to_wire()
    bad["tasks"][1] = [1, 5, 0, []]  # a node index outside the step
    with pytest.raises(ValueError):
        layout_from_wire(bad)
    for junk in (None, [], {"job_id": 1}, {**layout.to_wire(), "counts": [3]}):
        with pytest.raises(ValueError):
            layout_from_wire(junk)
    assert layout.on("n9") == () and layout.on("n2") == (Task(2, 1, 0, (2, 3)),)


def test_step_messages_are_checked_field_by_field():
    req = wire.step_request(wire.request_to_wire(env_defaults(exclude=("n1",))))
    assert req == env_defaults(exclude=("n1",))
    for body in ({**wire.request_to_wire(StepRequest()), "ntasks": 0},
                 {**wire.request_to_wire(StepRequest()), "nodelist": "n1"},
                 {**wire.request_to_wire(StepRequest()), "extra": 1}):
        with pytest.raises(SpecError):
            wire.step_request(body)
    ok = {"argv": ["echo", "hi"], "cwd": "/tmp", "env": {"A": "1"}}
    assert wire.command(ok) == (["echo", "hi"], "/tmp", {"A": "1"})
    for bad in ({**ok, "argv": []}, {**ok, "argv": ["a\0b"]}, {**ok, "cwd": "rel"}, {**ok, "env": {"A=B": "1"}}):
        with pytest.raises(SpecError):
            wire.command(bad)
    out = {"job_id": 1, "step_id": 0, "task": 2, "seq": 0, "stream": "out", "data": b"x\n"}
    assert wire.output(out) == (1, 0, 2, "out", b"x\n")
    for bad in ({**out, "stream": "tty"}, {**out, "data": "text"}, {**out, "seq": -1}, {**out, "data": b"x" * (wire.MAX_OUTPUT_CHUNK + 1)}):
        with pytest.raises(SpecError):
            wire.output(bad)
    end = {"job_id": 1, "step_id": 0, "task": 2, "exit_code": None, "signal": 9}
    assert wire.task_exit(end) == (1, 0, 2, None, 9)
    with pytest.raises(SpecError):
        wire.task_exit({**end, "exit_code": 300})


def test_a_master_addr_the_script_exported_reaches_every_task_and_ours_follows_the_step():
    layout = plan_step(Allocation(7, ("n1", "n2"), 1, 1, ((), ())), StepRequest(nodes=1, nodelist=("n2",)), 0)[0]
    ours = {"MASTER_ADDR": "10.0.0.1", "HAI_MASTER_ADDR": "10.0.0.1"}
    assert task_environment(ours, {}, layout, layout.tasks[0], "10.0.0.2")["MASTER_ADDR"] == "10.0.0.2"
    mine = {**ours, "MASTER_ADDR": "n1"}  # export MASTER_ADDR=$(scontrol show hostnames | head -n 1)
    assert task_environment(mine, {}, layout, layout.tasks[0], "10.0.0.2")["MASTER_ADDR"] == "n1"


def test_srun_exports_the_tasks_per_node_it_keeps():
    """srun's SLURM_NTASKS_PER_NODE for its tasks (srun.c's setup_env): its own count when opt.c
    keeps it (-n over -N), else the job's stays (Lightning compares it with its `devices`)."""
    from hai_cluster.cli.srun import kept_per_node
    assert kept_per_node(env_defaults(ntasks=2, ntasks_per_node=1)) == 1  # srun -n 2 --ntasks-per-node=1
    assert kept_per_node(env_defaults(ntasks_per_node=1)) is None  # -n 4 from the job: dropped, with a warning
    assert kept_per_node(env_defaults()) == 2
    assert kept_per_node(StepRequest(nodes=2, ntasks_per_node=3)) == 3


def test_overcommit_lets_a_step_run_more_tasks_than_the_allocations_cpus():
    one_cpu = Allocation(8, ("n1",), 1, 1, ((0,),))  # sbatch -O -n 16: one CPU on its node
    with pytest.raises(StepError, match="More processors requested than permitted"):
        plan_step(one_cpu, StepRequest(ntasks=16), 0)
    layout, warnings = plan_step(one_cpu, StepRequest(ntasks=16, overcommit=True), 0)
    assert layout.counts == (16,) and [t.localid for t in layout.tasks] == list(range(16)) and warnings == []
    back = wire.step_request(wire.request_to_wire(StepRequest(ntasks=16, overcommit=True)))
    assert back.overcommit is True
    old = {k: v for k, v in wire.request_to_wire(StepRequest(ntasks=2)).items() if k != "overcommit"}
    assert wire.step_request(old).overcommit is False  # an srun from before -O
    with pytest.raises(SpecError, match="overcommit must be true or false"):
        wire.step_request({**old, "overcommit": "yes"})
