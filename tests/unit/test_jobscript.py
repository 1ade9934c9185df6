import signal
import subprocess
import sys
import textwrap

import pytest

from hai_cluster.core.jobscript import (
    NOT_A_SCRIPT, JobScriptError, Submission, parse_submission, split_command_line,
)
from hai_cluster.core.model import JobSpec

ENV = {"PATH": "/usr/bin", "HOME": "/home/alice", "EDITOR": "vi"}


def script(body: str) -> str:
    return "#!/bin/bash\n" + textwrap.dedent(body).lstrip("\n")


def parse(text=None, *options, cwd="/home/alice/proj", env=ENV, **kw) -> JobSpec:
    if text is None and not any(o.startswith("--wrap") for o in options):
        text = "#!/bin/sh\necho hi\n"
    return parse_submission(text, list(options), cwd=cwd, env=env, **kw).spec


def error(text=None, *options, **kw) -> str:
    with pytest.raises(JobScriptError) as exc:
        parse(text, *options, **kw)
    return str(exc.value)


# ---- defaults and the script ----------------------------------------------------------------

def test_defaults():
    sub = parse_submission("#!/bin/sh\necho hi\n", [], cwd="/home/alice", env=ENV)
    assert isinstance(sub, Submission) and sub.parsable is False
    spec = sub.spec
    assert spec.script == "#!/bin/sh\necho hi\n"
    assert spec.workdir == spec.submit_dir == "/home/alice"
    assert spec.name == "script"
    assert (spec.nodes, spec.gpus_per_node, spec.cpus_per_task) == (1, 0, 1)
    assert spec.mem_mb is None and spec.time_limit is None and spec.partition is None
    assert spec.stdout is None and spec.stderr is None
    assert spec.environment == ENV
    assert spec.signal is None and spec.signal_time == 60 and spec.grace == 60
    assert spec.priority == "normal" and spec.requeue is True and spec.hold is False
    assert spec.checkpoint_dir is None and spec.script_args == ()


def test_spec_survives_the_wire():
    spec = parse(script("#SBATCH -N 2 --gpus-per-node=4\nrun\n"), "-t", "1:00:00")
    assert JobSpec.from_wire(spec.to_wire()) == spec


def test_script_name_is_the_default_name():
    assert parse(None, script_name="train.sh").name == "train.sh"
    assert parse(None, script_name="/home/alice/jobs/train.sh").name == "train.sh"
    assert parse(None, "-J", "mine", script_name="train.sh").name == "mine"


@pytest.mark.parametrize("text", ["echo hi\n", " #!/bin/sh\necho\n", "#SBATCH -N 1\n#!/bin/sh\n"])
def test_first_line_must_be_a_shebang(text):
    assert error(text) == NOT_A_SCRIPT
    assert "The first line must start with #!" in NOT_A_SCRIPT


@pytest.mark.parametrize("text, fragment", [
    ("", "the batch script is empty"),
    ("  \n\n", "the batch script is empty"),
    ("#!/bin/sh\r\necho hi\r\n", "DOS line breaks"),
    ("#!/bin/sh\necho \0\n", "NUL character"),
])
def test_bad_script_text(text, fragment):
    assert fragment in error(text)


def test_script_args_reach_the_spec():
    spec = parse(None, script_args=["--epochs", "3", "-N", "x y"])
    assert spec.script_args == ("--epochs", "3", "-N", "x y")
    assert spec.nodes == 1  # they are the script's, not ours


def test_cwd_must_be_absolute():
    assert "must be an absolute path, got 'proj'" in error(None, cwd="proj")
    with pytest.raises(ValueError):
        parse(None, cwd="proj")


# ---- directives -----------------------------------------------------------------------------

def test_sbatch_and_hai_directives_mix():
    spec = parse(script("""
        #SBATCH --job-name=mixed
        #HAI --nodes=2
        #SBATCH -c 4 --mem=8G   # end-of-line comment
        #HAI\t--time=2:00:00
        echo go
    """))
    assert (spec.name, spec.nodes, spec.cpus_per_task, spec.mem_mb, spec.time_limit) == \
        ("mixed", 2, 4, 8192, 7200)


def test_directives_stop_at_the_first_command():
    spec = parse(script("""
        #SBATCH -N 2

        # a comment, then an indented one
           # still the header
        #SBATCH -c 3
        module load cuda
        #SBATCH -N 5
        #SBATCH --bogus-after-command
    """))
    assert (spec.nodes, spec.cpus_per_task) == (2, 3)


def test_lines_that_only_look_like_directives_are_comments():
    spec = parse(script("""
        #SBATCHX -N 9
        ##SBATCH -N 8
        # SBATCH -N 7
         #SBATCH -N 6
        #sbatch -N 5
        #HAI
        #SBATCH
        true
    """))
    assert spec.nodes == 1


def test_directive_quoting_and_comments():
    spec = parse(script("""
        #SBATCH -J "two words" --output='out #1.log'
        #SBATCH --error=err#comment
        #SBATCH --export=ALL,GREETING=hello\\ world
        x
    """), env={})
    assert spec.name == "two words"
    assert spec.stdout == "out #1.log"
    assert spec.stderr == "err"  # an unquoted # starts a comment, as in Slurm
    assert spec.environment == {"GREETING": "hello world"}


def test_command_line_overrides_directives():
    spec = parse(script("""
        #SBATCH -J from-script -N 4 --time=10 --partition=a
        #HAI --no-requeue --priority=low
        run
    """), "-J", "from-cli", "--nodes=2", "--requeue", "-p", "b")
    assert (spec.name, spec.nodes, spec.partition, spec.requeue) == ("from-cli", 2, "b", True)
    assert spec.time_limit == 600 and spec.priority == "low"  # not overridden: kept


def test_later_directive_wins():
    assert parse(script("#SBATCH -N 2\n#SBATCH -N 3\nx\n")).nodes == 3


def test_gpu_options_share_one_setting():
    text = script("#SBATCH -N 2 --gpus-per-node=1\nrun\n")
    assert parse(text).gpus_per_node == 1
    assert parse(text, "--gres=gpu:3").gpus_per_node == 3
    assert parse(text, "-G", "8").gpus_per_node == 4
    # -G given in the script is divided by -N given on the command line
    assert parse(script("#SBATCH -G 8\nrun\n"), "-N", "4").gpus_per_node == 2


@pytest.mark.parametrize("line, fragment", [
    ("#SBATCH --gpus-per-node=abc", "line 3: --gpus-per-node=abc: expected a non-negative integer"),
    ("#SBATCH --bogus=1", "line 3: --bogus: unrecognized option"),
    ("#SBATCH -Z", "line 3: -Z: unrecognized option"),
    ("#SBATCH --licenses=lic", "line 3: --licenses: sbatch's option is not supported by this cluster"),
    ("#HAI -N", "line 3: -N: option requires a value"),
    ("#SBATCH --hold=yes", "line 3: --hold: option takes no value"),
    ("#SBATCH -J 'open", "line 3: No closing quotation"),
    ("#SBATCH -N 2 extra", "line 3: unexpected argument 'extra'"),
    ("#SBATCH --nodes=-1", "line 3: --nodes=-1: expected a positive integer"),
    ("#SBATCH -N 0", "line 3: -N 0: expected a positive integer"),
])
def test_directive_errors_name_the_line(line, fragment):
    text = f"#!/bin/sh\n# header\n{line}\necho\n"
    assert error(text).startswith(fragment)


# ---- options one by one ---------------------------------------------------------------------

@pytest.mark.parametrize("options, field, value", [
    (["-J", "a"], "name", "a"), (["-Jb"], "name", "b"), (["--job-name", "c"], "name", "c"),
    (["--job-name=d e"], "name", "d e"), (["--job=f"], "name", "f"),  # unique prefix
    (["-N", "3"], "nodes", 3), (["-N3"], "nodes", 3), (["--nodes=4-4"], "nodes", 4),
    (["--gpus-per-node=8"], "gpus_per_node", 8), (["--gpus-per-node=a100:2"], "gpus_per_node", 2),
    (["--gpus-per-node", "0"], "gpus_per_node", 0),
    (["--gres=gpu:4"], "gpus_per_node", 4), (["--gres=gpu:h100:2"], "gpus_per_node", 2),
    (["--gres=gpu"], "gpus_per_node", 1), (["--gres=gpu:h100"], "gpus_per_node", 1),
    (["--gres=gres/gpu:3"], "gpus_per_node", 3), (["--gres=none"], "gpus_per_node", 0),
    (["-G", "2"], "gpus_per_node", 2), (["--gpus=v100:3"], "gpus_per_node", 3),
    (["-c", "16"], "cpus_per_task", 16), (["--cpus-per-task=2"], "cpus_per_task", 2),
    (["--mem=4G"], "mem_mb", 4096), (["--mem", "100"], "mem_mb", 100),
    (["-t", "30"], "time_limit", 1800), (["--time=1-00:00:00"], "time_limit", 86400),
    (["-t", "UNLIMITED"], "time_limit", None), (["-t0"], "time_limit", None),
    (["-p", "gpu"], "partition", "gpu"), (["--partition=long.q"], "partition", "long.q"),
    (["-p", "a,b"], "partition", "a,b"),
    (["-o", "logs/%j.out"], "stdout", "logs/%j.out"), (["-e", "%x.err"], "stderr", "%x.err"),
    (["--output=none"], "stdout", "none"),
    (["--grace=0"], "grace", 0), (["--grace", "300"], "grace", 300),
    (["--priority=urgent"], "priority", "urgent"), (["--priority=HIGH"], "priority", "high"),
    (["--priority", "low"], "priority", "low"),
    (["--no-requeue"], "requeue", False), (["--no-requeue", "--requeue"], "requeue", True),
    (["-H"], "hold", True), (["--hold"], "hold", True),
])
def test_option_values(options, field, value):
    assert getattr(parse(None, *options), field) == value


def test_chdir_and_checkpoint_dir():
    spec = parse(None, "-D", "runs/a", "--checkpoint-dir=ckpt")
    assert spec.workdir == "/home/alice/proj/runs/a"
    assert spec.checkpoint_dir == "/home/alice/proj/runs/a/ckpt"
    assert spec.submit_dir == "/home/alice/proj"
    spec = parse(None, "--chdir=/scratch/x/../y", "--checkpoint-dir=/ckpt//j")
    assert (spec.workdir, spec.checkpoint_dir) == ("/scratch/y", "/ckpt/j")


@pytest.mark.parametrize("value, number, seconds, batch", [
    ("USR1", signal.SIGUSR1, 60, False), ("SIGUSR2@90", signal.SIGUSR2, 90, False),
    ("usr1@0", signal.SIGUSR1, 0, False), ("10", 10, 60, False), ("15@120", 15, 120, False),
    ("B:TERM@30", signal.SIGTERM, 30, True), ("B:SIGINT", signal.SIGINT, 60, True),
    ("R:HUP", signal.SIGHUP, 60, False), ("RB:USR1@5", signal.SIGUSR1, 5, True),
])
def test_signal(value, number, seconds, batch):
    spec = parse(None, f"--signal={value}")
    assert (spec.signal, spec.signal_time, spec.signal_batch) == (int(number), seconds, batch)


@pytest.mark.parametrize("value, fragment", [
    ("FOO", "unknown signal 'FOO'"), ("0", "invalid signal number 0"),
    ("65", "invalid signal number 65"), ("USR1@", "expected a non-negative integer"),
    ("USR1@-5", "expected a non-negative integer"), ("USR1@70000", "the signal time must be at most 65535 seconds"),
    ("", "expected [B:]SIGNAL[@SECONDS]"), ("B:", "expected [B:]SIGNAL[@SECONDS]"),
    ("X:USR1", "unknown signal 'X:USR1'"),
])
def test_signal_errors(value, fragment):
    assert error(None, f"--signal={value}") == f"--signal={value}: {fragment}"


@pytest.mark.parametrize("value, env", [
    ("ALL", ENV),
    ("all", ENV),
    ("NONE", {}),
    ("EDITOR", {"EDITOR": "vi"}),
    ("EDITOR,MISSING,ARG1=test", {"EDITOR": "vi", "ARG1": "test"}),
    ("ARG1=a=b", {"ARG1": "a=b"}),
    ("EMPTY=", {"EMPTY": ""}),
    ("ALL,ARG1=test", {**ENV, "ARG1": "test"}),
    # Slurm: with ALL, a variable the caller already has keeps the caller's value
    ("ALL,EDITOR=emacs", ENV),
    ("EDITOR=emacs", {"EDITOR": "emacs"}),
])
def test_export(value, env):
    assert parse(None, f"--export={value}").environment == env


@pytest.mark.parametrize("value, fragment", [
    ("NONE,EDITOR", "NONE cannot be combined with other variables"),
    ("1BAD=x", "invalid variable name '1BAD'"),
    ("A,,B", "invalid variable name ''"),
    ("", "invalid variable name ''"),
    ("A-B=1", "invalid variable name 'A-B'"),
])
def test_export_errors(value, fragment):
    assert error(None, f"--export={value}") == f"--export={value}: {fragment}"


def test_export_is_the_last_one_given():
    text = script("#SBATCH --export=NONE\nrun\n")
    assert parse(text).environment == {}
    assert parse(text, "--export=ALL").environment == ENV


@pytest.mark.parametrize("options, message", [
    (["--nodes=0"], "--nodes=0: expected a positive integer"),
    (["-N", "abc"], "-N abc: expected a positive integer"),
    (["-N", "1-4"], "-N 1-4: node count ranges are not supported; give one number"),
    (["--nodes=2-"], "--nodes=2-: node count ranges are not supported; give one number"),
    (["--nodes=99999999999"], "--nodes=99999999999: 99999999999 is too large"),
    (["--gpus-per-node=abc"], "--gpus-per-node=abc: expected a non-negative integer"),
    (["--gpus-per-node=-1"], "--gpus-per-node=-1: expected a non-negative integer"),
    (["--gpus-per-node=a b:2"], "--gpus-per-node=a b:2: invalid GPU type 'a b'"),
    (["--gpus-per-node=:2"], "--gpus-per-node=:2: invalid GPU type ''"),
    (["--gres=nvme:1"], "--gres=nvme:1: unsupported GRES 'nvme': only gpu is supported"),
    (["--gres=gpu:2,nvme:1"], "--gres=gpu:2,nvme:1: unsupported GRES 'nvme': only gpu is supported"),
    (["--gres=gpu:1,gpu:2"], "--gres=gpu:1,gpu:2: gpu is given more than once"),
    (["--gres=gpu:a:b:1"], "--gres=gpu:a:b:1: expected gpu[:TYPE][:COUNT]"),
    (["--gres=gpu:-1"], "--gres=gpu:-1: expected gpu[:TYPE][:COUNT]"),
    (["-N", "2", "-G", "3"], "-G 3: 3 GPUs cannot be spread evenly over 2 nodes; use --gpus-per-node"),
    (["-c", "0"], "-c 0: expected a positive integer"),
    (["--cpus-per-task=x"], "--cpus-per-task=x: expected a positive integer"),
    (["--mem=lots"], "--mem=lots: invalid memory size 'lots'"),
    (["--mem=-1G"], "--mem=-1G: invalid memory size '-1G': must not be negative"),
    (["--mem=0"], "--mem=0: invalid memory size '0': must be greater than zero (Slurm's --mem=0"),
    (["-t", "soon"], "-t soon: invalid time limit 'soon'"),
    (["-t", "-5"], "-t -5: invalid time limit '-5': must not be negative"),
    (["-p", "a,a"], "-p a,a: a partition is given twice"),
    (["-p", "bad name"], "-p bad name: expected partition names"),
    (["-p", "a,"], "-p a,: expected partition names"),
    (["--job-name="], "--job-name=: must not be empty"),
    (["-J", ""], "-J : must not be empty"),
    (["-J", "a\nb"], "-J a\nb: must not contain control characters"),
    (["-J", "a\x9bb"], "-J a\x9bb: must not contain control characters"),  # C1: the one-byte CSI
    (["-o", ""], "-o : must not be empty"),
    (["-D", ""], "-D : must not be empty"),
    (["--grace=-1"], "--grace=-1: expected a non-negative integer"),
    (["--grace=1.5"], "--grace=1.5: expected a non-negative integer"),
    (["--grace=3601"], "--grace=3601: at most 3600 seconds"),  # past it a job outlives any cancel
    (["--priority=asap"], "--priority=asap: expected one of urgent, high, normal, low"),
    (["--parsable=yes"], "--parsable: option takes no value"),
    (["--no-such-option"], "--no-such-option: unrecognized option"),
    (["--pa=x"], "--pa: ambiguous option (could be --partition --parsable)"),
    (["--pri=x"], "--priority=x: expected one of"),  # a unique prefix is the option
    (["-L", "matlab"], "-L/--licenses: sbatch's option is not supported by this cluster"),
    (["-Z"], "-Z: unrecognized option"),
    (["--licen=x"], "--licenses: sbatch's option is not supported"),  # a prefix of a known one
    (["--exclusive=user"], "--exclusive=user: only --exclusive (whole nodes"),
    (["-w", "n[1-2]", "-N", "1"], "-w n[1-2]: names 2 nodes, more than the job's -N 1"),
    (["-w", "n1", "-x", "n[1-3]"], "-w n1: n1 both required (-w) and excluded (-x)"),
    (["-w", "/etc/nodes"], "-w /etc/nodes: a file of node names is not supported"),
    (["-x", "n[1-"], "-x n[1-: hostlist"),
    (["--partiton=gpu"], "--partiton: unrecognized option (did you mean --partition?)"),
    (["-J"], "-J: option requires a value"),
    (["--time"], "--time: option requires a value"),
    (["-N", "1", "stray"], "unexpected argument 'stray' among the options"),
])
def test_command_line_errors_name_the_option(options, message):
    assert error(None, *options).startswith(message)


# ---- --wrap ---------------------------------------------------------------------------------

def test_wrap():
    spec = parse(None, "--wrap", "python train.py --lr 0.1", "-N", "2")
    assert spec.script == ("#!/bin/sh\n# This script was generated by hsubmit --wrap.\n"
                           "python train.py --lr 0.1\n")
    assert spec.name == "wrap" and spec.nodes == 2


def test_wrap_name_and_directives():
    assert parse(None, "--wrap=true", "-J", "w").name == "w"
    # the generated script is not read for directives
    assert parse(None, "--wrap=#SBATCH -N 9").nodes == 1


def test_wrap_errors():
    assert error("#!/bin/sh\ntrue\n", "--wrap=ls") == \
        "--wrap=ls: --wrap cannot be used together with a script file"
    assert error(script("#SBATCH --wrap=ls\ntrue\n")).startswith("line 2: --wrap=ls: --wrap cannot")
    assert error(None, "--wrap=ls", script_args=["a"]) == \
        "script arguments are not permitted with --wrap"
    assert error(None, "--wrap=") == "--wrap=: must not be empty"
    with pytest.raises(JobScriptError, match="no batch script: give a script file or --wrap"):
        parse_submission(None, ["-N", "1"], cwd="/", env={})


def test_parsable():
    assert parse_submission(None, ["--wrap=x", "--parsable"], cwd="/", env={}).parsable is True
    sub = parse_submission(script("#SBATCH --parsable\nx\n"), [], cwd="/", env={})
    assert sub.parsable is True


# ---- split_command_line ---------------------------------------------------------------------

@pytest.mark.parametrize("argv, expected", [
    ([], ([], None, [])),
    (["job.sh"], ([], "job.sh", [])),
    (["-J", "x", "--parsable", "job.sh", "a", "b"], (["-J", "x", "--parsable"], "job.sh", ["a", "b"])),
    # the script's own arguments may look like our options
    (["-N", "2", "job.sh", "-N", "5", "--parsable", "--", "-J"],
     (["-N", "2"], "job.sh", ["-N", "5", "--parsable", "--", "-J"])),
    # an option's value is not the script, even when it looks like one
    (["-o", "out.sh", "-J", "job.sh", "run.sh"], (["-o", "out.sh", "-J", "job.sh"], "run.sh", [])),
    (["--output", "x", "--hold", "s"], (["--output", "x", "--hold"], "s", [])),
    (["-Jname", "-HN2", "s"], (["-Jname", "-HN2"], "s", [])),  # clustered short options
    (["--wrap", "echo hi", "--parsable"], (["--wrap", "echo hi", "--parsable"], None, [])),
    (["--wrap=echo hi"], (["--wrap=echo hi"], None, [])),
    (["-H", "--", "-weird.sh", "x"], (["-H"], "-weird.sh", ["x"])),  # "--" ends the options
    (["-J", "x", "--"], (["-J", "x"], None, [])),
    (["-", "a"], ([], "-", ["a"])),  # "-" is an operand, as in getopt
    (["--job", "-x", "s"], (["--job", "-x"], "s", [])),  # a value may start with '-'
])
def test_split_command_line(argv, expected):
    assert split_command_line(argv) == expected


@pytest.mark.parametrize("argv, expected", [
    (["--bogus", "s.sh"], (["--bogus"], "s.sh", [])),
    (["--licenses", "lic", "s.sh", "a"], (["--licenses", "lic"], "s.sh", ["a"])),  # sbatch's: its value skipped
    (["-L", "lic", "s.sh"], (["-L", "lic"], "s.sh", [])),
    (["-J"], (["-J"], None, [])),
])
def test_split_command_line_leaves_refusals_to_the_parse(argv, expected):
    # the whole submission's parse reports every refusal at once, the script's too
    assert split_command_line(argv) == expected


def test_every_refusal_is_reported_at_once():
    text = script("#SBATCH --mincpus=4 --deadline=now  # two on one line, and a comment\n"
                  "#SBATCH --deadline=now+1hour -N 0\nrun\n")
    message = error(text, "--bogus", "-L", "lic", "--time=forever")
    assert message.splitlines() == [
        "--bogus: unrecognized option",
        "-L/--licenses: sbatch's option is not supported by this cluster (docs/SLURM.md)",
        "line 2: --mincpus: sbatch's option is not supported by this cluster (docs/SLURM.md)",
        "line 2: --deadline: sbatch's option is not supported by this cluster (docs/SLURM.md)",
        "line 3: --deadline: sbatch's option is not supported by this cluster (docs/SLURM.md)",
        "line 3: -N 0: expected a positive integer",
        message.splitlines()[-1],
    ]
    assert message.splitlines()[-1].startswith("--time=forever: ")


def test_split_then_parse():
    argv = ["-N", "2", "--gpus-per-node=4", "train.sh", "--epochs", "3", "-N", "1"]
    options, path, args = split_command_line(argv)
    text = script("#SBATCH -N 1 -t 60\npython train.py \"$@\"\n")
    spec = parse_submission(text, options, cwd="/w", env={}, script_args=args,
                            script_name=path).spec
    assert (spec.nodes, spec.gpus_per_node, spec.time_limit) == (2, 4, 3600)
    assert spec.script_args == ("--epochs", "3", "-N", "1")
    assert spec.name == "train.sh"


# ---- purity ---------------------------------------------------------------------------------

def test_core_text_modules_import_nothing_that_does_io():
    modules = ["timefmt", "hostlist", "patterns", "jobenv", "jobscript"]
    code = ("import sys\n"
            + "".join(f"import hai_cluster.core.{m}\n" for m in modules)
            + "bad = {'asyncio', 'sqlalchemy', 'asyncssh', 'psutil', 'pynvml', 'socket', "
              "'subprocess', 'msgpack'}\n"
              "print(sorted(bad & set(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- arrays and dependencies ----------------------------------------------------------------

def test_array_and_dependency_from_directives_and_the_command_line():
    text = script("""
        #SBATCH --array=0-15:4
        #HAI -d afterok:12:13
        echo hi
    """)
    spec = parse(text)
    assert (spec.array, spec.dependency) == ("0,4,8,12", "afterok:12,afterok:13")
    spec = parse(text, "-a", "1,3,5-9%2", "--dependency=singleton")
    assert (spec.array, spec.dependency) == ("1,3,5-9%2", "singleton")
    assert JobSpec.from_wire(spec.to_wire()) == spec


@pytest.mark.parametrize("option, message", [
    ("--array=5-1", "--array=5-1: invalid job array specification: invalid range '5-1': the end is below the start"),
    ("--array=0-100000", "max_array_size is 1001"),
    ("--array=a", "--array=a: invalid job array specification"),
    ("--dependency=afterok", "--dependency=afterok: invalid dependency specification"),
    ("--dependency=sometime:3", "invalid dependency type 'sometime'"),
    ("--dependency=afterok:" + ":".join(str(i) for i in range(1000, 1300)), "too long"),
])
def test_bad_arrays_and_dependencies(option, message):
    assert message in error(None, "--wrap=true", option)


def test_array_bound_is_the_callers():
    assert parse(None, "--wrap=true", "--array=0-5000", max_array_size=None).array == "0-5000"
    assert "max_array_size is 10" in error(None, "--wrap=true", "--array=10", max_array_size=10)


def test_a_partition_list_longer_than_the_job_table_holds_is_refused():
    assert "the partition list is too long" in error(None, "--wrap=true", "-p", ",".join(f"p{i}" for i in range(30)))


@pytest.mark.parametrize("options, resumes", [
    ([], None),  # a script that said nothing: time-slicing never preempts it
    (["--requeue"], "requeue"),
    (["--checkpoint-dir=ckpt"], "checkpoint"),
    (["--signal=USR2@90"], "signal"),  # submitit's contract: warned, it checkpoints and requeues itself
    (["--signal=B:USR1@60", "--requeue"], "requeue"),
    (["--no-requeue", "--checkpoint-dir=ckpt"], None),  # never preempted at all
])
def test_how_a_job_resumes(options, resumes):
    assert parse(None, "--wrap", "run", *options).resumes == resumes


def test_node_choice():
    spec = parse(None, "--wrap", "run", "--exclusive", "-w", "gpu[02-03],gpu01", "-x", "gpu09")
    assert (spec.exclusive, spec.required_nodes, spec.excluded_nodes, spec.nodes) == (
        True, ("gpu01", "gpu02", "gpu03"), ("gpu09",), 3)  # -N defaults to -w's count
    assert parse(None, "--wrap", "run", "-w", "a", "-N", "3").nodes == 3  # a, and two more
    assert parse(None, "--wrap", "run").exclusive is False


def test_overcommit_asks_one_tasks_cpus_per_node_as_slurm():
    spec = parse(None, "-O", "-n", "64", "-N", "1", "--wrap=env")
    assert (spec.overcommit, spec.tasks_per_node, spec.cpus_per_node) == (True, 64, 1)
    spec = parse("#!/bin/sh\n#SBATCH --overcommit\n#SBATCH -n 8 -c 4 -N 2\n", "--mem-per-cpu=100")
    assert (spec.tasks_per_node, spec.cpus_per_node, spec.mem_mb) == (4, 4, 400)
    assert parse(None, "-n", "8", "--wrap=x").cpus_per_node == 8
    assert parse(None, "-n", "8", "--wrap=x", env={**ENV, "SBATCH_OVERCOMMIT": "1"}).cpus_per_node == 1
