"""srun -o/-e: which task's stream goes where, and the file names a step's patterns make."""
import io

import pytest

from hai_cluster.cli.srun_output import SinkError, Sinks
from hai_cluster.core.patterns import expand_output_pattern
from hai_cluster.core.steps import StepLayout, Task

LAYOUT = StepLayout(job_id=42, step_id=3, nodes=("n1", "n2"), counts=(2, 1),
                    tasks=(Task(0, 0, 0, ()), Task(1, 0, 1, ()), Task(2, 1, 0, ())), cpus_per_task=1)
ENV = {"SLURM_JOB_NAME": "train"}


def test_step_fields_of_a_pattern():
    kw = dict(job_id=42, job_name="train", user="ann", node="n2", restart_count=0)
    assert expand_output_pattern("%J-%s-%t-%n-%N-%x-%u-%3t", step_id=3, task=2, node_index=1, **kw) == \
        "42.3-3-2-1-n2-train-ann-002"
    assert expand_output_pattern("%J-%t", **kw) == "42-%t"  # a batch script's: no step, no task


def sinks():
    return Sinks(io.BytesIO(), io.BytesIO())


def test_unset_all_none_and_one_task(tmp_path):
    s = sinks()
    s.route(LAYOUT, None, None, None, str(tmp_path), ENV)
    assert s.target(2, "out") is s.std["out"] and s.target(2, "err") is s.std["err"]
    s = sinks()
    s.route(LAYOUT, "1", "none", None, str(tmp_path), ENV)
    assert [s.target(t, "out") for t in range(3)] == [None, s.std["out"], None]
    assert all(s.target(t, "err") is None for t in range(3))


def test_files_per_task_per_node_and_error_following_output(tmp_path):
    s = sinks()
    s.route(LAYOUT, "out-%j.%s-%t.txt", None, None, str(tmp_path), ENV)
    for t in range(3):
        s.target(t, "out").write(f"o{t}\n".encode())
        s.target(t, "err").write(f"e{t}\n".encode())
    s.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out-42.3-0.txt", "out-42.3-1.txt", "out-42.3-2.txt"]
    assert (tmp_path / "out-42.3-2.txt").read_text() == "o2\ne2\n"  # -e unset follows -o
    s = sinks()
    s.route(LAYOUT, "node-%N", "err-%x", None, str(tmp_path), ENV)
    assert s.target(0, "out") is s.target(1, "out") is not s.target(2, "out")
    assert s.target(0, "err") is s.target(2, "err")
    s.close()
    assert {p.name for p in tmp_path.iterdir()} >= {"node-n1", "node-n2", "err-train"}


def test_open_mode_and_a_file_that_cannot_be_opened(tmp_path):
    (tmp_path / "log").write_text("before\n")
    s = sinks()
    s.route(LAYOUT, "log", None, "append", str(tmp_path), ENV)
    s.target(0, "out").write(b"after\n")
    s.close()
    assert (tmp_path / "log").read_text() == "before\nafter\n"
    s = sinks()
    s.route(LAYOUT, "log", None, None, str(tmp_path), ENV)  # truncate, as srun's default
    s.close()
    assert (tmp_path / "log").read_text() == ""
    s = sinks()
    with pytest.raises(SinkError, match=r"^Could not open stderr file: No such file or directory$"):
        s.route(LAYOUT, "task-%t", "nodir/x", None, str(tmp_path), ENV)
    assert s.target(0, "out") is None and s.target(0, "err") is None  # the failed step's output goes nowhere
