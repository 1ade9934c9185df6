import pytest

from hai_cluster.core.jobenv import job_environment, master_port

ARGS = dict(job_id=1234, job_name="train", user="alice", partition="gpu",
            nodelist=["node02", "node01", "node03"], rank=1, node="node01", gpus=[4, 5],
            cpus_per_task=8, restart_count=3, checkpoint_dir="/ckpt/1234",
            submit_dir="/home/alice", master_addr="10.0.0.2", time_limit=3600)


def env(base=None, **overrides):
    return job_environment(base or {}, **{**ARGS, **overrides})


def test_job_variables():
    e = env()
    assert e["HAI_JOB_ID"] == "1234"
    assert e["HAI_JOB_NAME"] == "train"
    assert e["HAI_NODELIST"] == "node[01-03]"
    assert e["HAI_NNODES"] == "3"
    assert e["HAI_NODE_RANK"] == "1"
    assert e["HAI_GPUS_ON_NODE"] == "2"
    assert e["HAI_RESTART_COUNT"] == "3"
    assert e["HAI_CHECKPOINT_DIR"] == "/ckpt/1234"
    assert e["HAI_SUBMIT_DIR"] == "/home/alice"
    assert e["HAI_PARTITION"] == "gpu"
    assert e["HAI_TIME_LIMIT"] == "3600"


def test_torch_variables():
    e = env()
    assert e["MASTER_ADDR"] == "10.0.0.2"
    assert e["MASTER_PORT"] == str(master_port(1234)) == "11234"
    assert e["WORLD_SIZE"] == "6"  # 3 nodes x 2 GPUs
    assert e["NNODES"] == "3"
    assert e["NODE_RANK"] == "1"
    assert e["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert e["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_slurm_aliases():
    e = env()
    assert e["SLURM_JOB_ID"] == e["SLURM_JOBID"] == "1234"
    assert e["SLURM_JOB_NAME"] == "train"
    assert e["SLURM_JOB_NODELIST"] == e["SLURM_NODELIST"] == "node[01-03]"
    assert e["SLURM_NNODES"] == e["SLURM_JOB_NUM_NODES"] == "3"
    assert e["SLURM_NODEID"] == e["SLURM_PROCID"] == "1"
    assert e["SLURM_LOCALID"] == "0"
    assert e["SLURM_RESTART_COUNT"] == "3"
    assert e["SLURM_SUBMIT_DIR"] == "/home/alice"
    assert e["SLURM_JOB_PARTITION"] == "gpu"
    assert e["SLURM_CPUS_PER_TASK"] == "8"
    assert e["SLURM_GPUS_ON_NODE"] == "2"
    assert e["SLURM_JOB_GPUS"] == "4,5"
    assert e["SLURM_JOB_USER"] == "alice"
    assert e["SLURMD_NODENAME"] == "node01"


def test_user_environment_is_kept_and_job_variables_win():
    e = env({"PATH": "/usr/bin", "HOME": "/home/alice", "HAI_JOB_ID": "1", "SLURM_JOB_ID": "1",
             "MASTER_PORT": "1"})
    assert e["PATH"] == "/usr/bin" and e["HOME"] == "/home/alice"
    assert e["HAI_JOB_ID"] == e["SLURM_JOB_ID"] == "1234"
    assert e["MASTER_PORT"] == "11234"


def test_base_env_is_not_modified():
    base = {"CUDA_VISIBLE_DEVICES": "0"}
    env(base, gpus=[])
    assert base == {"CUDA_VISIBLE_DEVICES": "0"}


def test_no_gpus_leaves_cuda_unset_even_if_the_submitter_had_it():
    e = env({"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "FASTEST_FIRST",
             "SLURM_JOB_GPUS": "0"}, gpus=[])
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "SLURM_GPUS_ON_NODE",
                 "SLURM_JOB_GPUS"):
        assert name not in e
    assert e["HAI_GPUS_ON_NODE"] == "0"
    assert e["WORLD_SIZE"] == "3"  # one process per node


def test_no_limit_and_no_partition_are_absent():
    e = env({"HAI_TIME_LIMIT": "5", "HAI_PARTITION": "old"}, time_limit=None, partition=None)
    for name in ("HAI_TIME_LIMIT", "HAI_PARTITION", "SLURM_JOB_PARTITION"):
        assert name not in e


def test_single_node():
    e = env(nodelist=["gpu7"], rank=0, node="gpu7", gpus=[0])
    assert e["HAI_NODELIST"] == "gpu7"
    assert e["WORLD_SIZE"] == "1"
    assert e["CUDA_VISIBLE_DEVICES"] == "0"


def test_every_value_is_a_string():
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in env().items())


@pytest.mark.parametrize("rank", [-1, 3])
def test_rank_outside_the_job(rank):
    with pytest.raises(ValueError, match=f"rank {rank} is outside a job of 3 nodes"):
        env(rank=rank)


@pytest.mark.parametrize("job_id, port", [(0, 10000), (1, 10001), (19999, 29999), (20000, 10000),
                                          (123456, 13456)])
def test_master_port(job_id, port):
    assert master_port(job_id) == port


def test_array_task_variables_and_slurm_aliases():
    e = env({"SLURM_ARRAY_TASK_ID": "99"}, array_job_id=1200, array_task_id=8, array_indices=[0, 4, 8, 12])
    for prefix in ("HAI", "SLURM"):
        assert e[f"{prefix}_ARRAY_JOB_ID"] == "1200"
        assert e[f"{prefix}_ARRAY_TASK_ID"] == "8"
        assert e[f"{prefix}_ARRAY_TASK_COUNT"] == "4"
        assert e[f"{prefix}_ARRAY_TASK_MIN"] == "0"
        assert e[f"{prefix}_ARRAY_TASK_MAX"] == "12"
        assert e[f"{prefix}_ARRAY_TASK_STEP"] == "4"


def test_a_job_outside_an_array_has_no_array_variables_even_if_the_submitter_had_them():
    e = env({"SLURM_ARRAY_TASK_ID": "3", "HAI_ARRAY_JOB_ID": "7"})
    assert not [k for k in e if "_ARRAY_" in k]


def test_overcommit_sets_slurms_variables():
    from hai_cluster.core.jobenv import allocation_variables, job_environment
    env = job_environment({"SLURM_OVERCOMMIT": "stale"}, job_id=5, job_name="j", user="ann", partition=None,
                          nodelist=["n1"], rank=0, node="n1", gpus=[], cpus_per_task=1, restart_count=0,
                          checkpoint_dir="/c", submit_dir="/s", master_addr="n1", time_limit=None,
                          tasks_per_node=64, ntasks=64, overcommit=True)
    assert (env["SLURM_OVERCOMMIT"], env["SLURM_CPUS_ON_NODE"], env["SLURM_JOB_CPUS_PER_NODE"],
            env["SLURM_TASKS_PER_NODE"], env["SLURM_NTASKS"]) == ("1", "1", "1", "64", "64")
    assert allocation_variables(env)["SLURM_OVERCOMMIT"] == "1"  # salloc's command has it too
    plain = job_environment({"SLURM_OVERCOMMIT": "1"}, job_id=5, job_name="j", user="ann", partition=None,
                            nodelist=["n1"], rank=0, node="n1", gpus=[], cpus_per_task=1, restart_count=0,
                            checkpoint_dir="/c", submit_dir="/s", master_addr="n1", time_limit=None, tasks_per_node=4)
    assert "SLURM_OVERCOMMIT" not in plain and plain["SLURM_CPUS_ON_NODE"] == "4"
