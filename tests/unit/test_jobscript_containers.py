"""--container-image and --runtime in job scripts and on the command line (core/jobscript.py)."""
import pytest

from hai_cluster.core.jobscript import JobScriptError, parse_submission
from hai_cluster.core.model import JobSpec

CWD = "/home/alice/project"


def submit(script=None, *opts, **kw):
    return parse_submission(script, list(opts), cwd=CWD, env={"PATH": "/bin"}, **kw).spec


def test_defaults_leave_the_choice_to_the_node():
    spec = submit(None, "--wrap", "true")
    assert spec.container_image is None and spec.runtime is None


def test_image_paths_are_made_absolute_against_the_workdir():
    assert submit(None, "--container-image=img/root", "--wrap", "true").container_image == f"{CWD}/img/root"
    spec = submit(None, "-D", "sub", "--container-image", "../images/x.tar.gz", "--wrap", "true")
    assert spec.container_image == f"{CWD}/images/x.tar.gz"
    assert submit(None, "--container-image=/srv/images/torch", "--wrap", "true").container_image == "/srv/images/torch"


def test_directives_and_the_command_line_wins():
    script = "#!/bin/sh\n#HAI --container-image=/srv/a\n#SBATCH --runtime=runc\nhostname\n"
    spec = submit(script)
    assert (spec.container_image, spec.runtime) == ("/srv/a", "runc")
    spec = submit(script, "--runtime=bwrap", "--container-image=b")
    assert (spec.container_image, spec.runtime) == (f"{CWD}/b", "bwrap")


@pytest.mark.parametrize("runtime", ["none", "bwrap"])
def test_runtimes_that_need_no_image(runtime):
    assert submit(None, f"--runtime={runtime}", "--wrap", "true").runtime == runtime


def test_a_podman_image_may_be_a_registry_reference():
    spec = submit(None, "--runtime=podman", "--container-image=docker.io/library/busybox:1.36", "--wrap", "true")
    assert spec.container_image == "docker.io/library/busybox:1.36"


@pytest.mark.parametrize("opts, message", [
    (["--runtime=docker"], "--runtime=docker: expected one of none, bwrap, runc, podman, apptainer, enroot"),
    (["--runtime=none", "--container-image=x"], "a container image needs a container runtime"),
    (["--runtime=runc"], "--runtime=runc: this runtime needs --container-image"),
    (["--runtime=podman"], "this runtime needs --container-image"),
    (["--container-image="], "must not be empty"),
])
def test_bad_combinations_are_refused(opts, message):
    with pytest.raises(JobScriptError, match=message.replace("(", r"\(")):
        submit(None, *opts, "--wrap", "true")


def test_the_directive_line_is_named():
    with pytest.raises(JobScriptError, match="line 2: --runtime=lxc"):
        submit("#!/bin/sh\n#HAI --runtime=lxc\ntrue\n")


def test_the_fields_cross_the_wire_and_old_specs_still_load():
    spec = submit(None, "--runtime=runc", "--container-image=/i", "--wrap", "true")
    assert JobSpec.from_wire(spec.to_wire()) == spec
    old = spec.to_wire()
    del old["container_image"], old["runtime"]  # stored before these options existed
    assert JobSpec.from_wire(old).runtime is None


def test_begin_is_read_against_the_submission_time():
    import datetime as dt

    from hai_cluster.core.jobscript import JobScriptError, parse_submission
    now = dt.datetime(2026, 11, 30, 14, 0).timestamp()
    sub = parse_submission("#!/bin/sh\n#SBATCH --begin=now+1hour\ntrue\n", [], cwd="/tmp", env={}, now=now)
    assert sub.spec.begin_time == now + 3600
    sub = parse_submission(None, ["--begin=09:00", "--wrap=true"], cwd="/tmp", env={}, now=now)
    assert sub.spec.begin_time == dt.datetime(2026, 12, 1, 9, 0).timestamp()  # 09:00 has passed: tomorrow
    with pytest.raises(JobScriptError, match="--begin=soonish"):
        parse_submission(None, ["--begin=soonish", "--wrap=true"], cwd="/tmp", env={}, now=now)
