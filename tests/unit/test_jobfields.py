"""hqueue asks the controller only for the keys its columns read: NEEDS must cover every getter."""
import pytest

from hai_cluster.cli.jobfields import FIELDS, NEEDS, ROW_KEYS
from hai_cluster.controller.apicontext import LISTING_FIELDS

FULL = {"id": 7, "partition": "gpu", "name": "train", "user": "ann", "code": "R", "state": "RUNNING",
        "start_time": 100.0, "end_time": None, "time_limit": 3600, "nodes": 2, "nodelist": "n01,n02",
        "reason": "None", "gpus_per_node": 4, "cpus_per_task": 3, "tasks_per_node": 2, "priority": "high", "restart_count": 1,
        "level": 2, "array_job_id": 5, "array_task_id": 2, "account": "ml", "gpu_fraction": 0.25, "gpu_mem_mb": None,
        "gpu_compute": None, "gpu_qos": None, "gpu_share_mb": 20480, "gpu_util": 87.5, "gpu_mem_used_mb": 4096,
        "idle": True, "idle_for": 750, "idle_limit": 1800, "preemptible": True, "resumes": "signal",
        "interactive": True, "overcommit": False}


@pytest.mark.parametrize("letter", sorted(FIELDS))
def test_each_column_reads_only_the_keys_it_asks_for(letter):
    only = {k: FULL[k] for k in NEEDS[letter]}
    assert FIELDS[letter][1](only, 200.0) == FIELDS[letter][1](FULL, 200.0)
    pending = {**FULL, "state": "PENDING", "reason": "Priority"}
    assert FIELDS[letter][1]({k: pending[k] for k in NEEDS[letter]}, 200.0) == FIELDS[letter][1](pending, 200.0)


def test_every_key_hqueue_asks_for_is_one_the_controller_serves():
    asked = set(ROW_KEYS).union(*NEEDS.values())
    assert asked <= LISTING_FIELDS, sorted(asked - LISTING_FIELDS)
