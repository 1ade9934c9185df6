"""Fractional-GPU options and directives: --gpus-per-node=0.25, --gpu-mem, --gpu-compute, --gpu-qos."""
import textwrap

import pytest

from hai_cluster.core.jobscript import JobScriptError, parse_submission
from hai_cluster.core.model import JobSpec
from hai_cluster.core.sharing import GpuShare, spec_share


def parse(text=None, *options) -> JobSpec:
    text = text or "#!/bin/sh\necho hi\n"
    return parse_submission(text, list(options), cwd="/home/a", env={}).spec


def error(text=None, *options) -> str:
    with pytest.raises(JobScriptError) as exc:
        parse(text, *options)
    return str(exc.value)


def test_fraction_of_a_card():
    spec = parse(None, "--gpus-per-node=0.25")
    assert (spec.gpus_per_node, spec.gpu_fraction, spec.gpu_mem_mb, spec.gpu_qos) == (0, 0.25, None, None)
    assert spec_share(spec) == GpuShare(fraction=0.25)
    assert parse(None, "--gpus-per-node=h100:.5").gpu_fraction == 0.5
    assert JobSpec.from_wire(spec.to_wire()) == spec


def test_memory_and_compute_in_directives():
    text = "#!/bin/sh\n" + textwrap.dedent("""\
        #HAI --gpu-mem=8G --gpu-compute=30
        #SBATCH --gpu-qos=best-effort
        python train.py
        """)
    spec = parse(text)
    assert spec_share(spec) == GpuShare(mem_mb=8192, compute=30, qos="best-effort") and spec.gpus_per_node == 0
    assert parse(text, "--gpu-qos", "burstable").gpu_qos == "burstable"  # the command line wins
    both = parse(None, "--gpus-per-node=0.5", "--gpu-mem=10G")
    assert spec_share(both) == GpuShare(fraction=0.5, mem_mb=10240)


def test_whole_gpu_requests_unchanged():
    spec = parse(None, "--gpus-per-node=2")
    assert (spec.gpus_per_node, spec.gpu_fraction, spec.gpu_mem_mb) == (2, None, None)
    assert spec_share(spec) is None


@pytest.mark.parametrize("options, fragment", [
    (["--gpus-per-node=1.5"], "--gpus-per-node=1.5: a fraction of a GPU must be below 1"),
    (["--gpus-per-node=1.0"], "must be below 1"),
    (["--gpus-per-node=0.0"], "must be above 0"),
    (["--gpus-per-node=x y:0.5"], "invalid GPU type"),
    (["--gpu-compute=30"], "--gpu-compute=30: only for a share of a GPU"),
    (["--gpu-qos=best-effort", "-G", "1"], "--gpu-qos=best-effort: only for a share"),
    (["--gpu-qos=gold", "--gpu-mem=1G"], "--gpu-qos=gold: expected one of guaranteed, burstable, best-effort"),
    (["--gpu-mem=8G", "--gpu-compute=101"], "--gpu-compute=101: expected a percentage"),
    (["--gpu-mem=8G", "--gpu-compute=-3"], "--gpu-compute=-3: expected a non-negative integer"),
    (["--gpu-mem=lots"], "--gpu-mem=lots:"),
    (["--gpu-mem=8G", "--gpus-per-node=2"], "cannot be combined with 2 whole GPUs"),
    (["-G", "0.5"], "-G 0.5: expected a non-negative integer"),
])
def test_bad_values_are_refused_clearly(options, fragment):
    assert fragment in error(None, *options)


def test_bad_directive_names_its_line():
    text = "#!/bin/sh\n#SBATCH --gpus-per-node=2.5\necho\n"
    assert error(text) == "line 2: --gpus-per-node=2.5: a fraction of a GPU must be below 1 (whole GPUs are whole numbers)"
