"""hcontrol show hostnames / hostlist / hostlistsorted: scontrol's keywords, output, messages and
exit codes, as Slurm 22.05 answered the same commands on this machine. No controller is asked."""
import pytest
from click.testing import CliRunner

from hai_cluster.cli import hcontrol


def run(*argv, env=None, input=None):
    return CliRunner().invoke(hcontrol.main, list(argv), env={"SLURM_NODELIST": None, **(env or {})}, input=input)


@pytest.fixture(autouse=True)
def prog(monkeypatch):
    monkeypatch.setattr(hcontrol, "PROG", "hcontrol")


def test_hostnames_one_per_line_in_the_order_written():
    r = run("show", "hostnames", "n[1-3],gpu[01-02]")
    assert (r.exit_code, r.output) == (0, "n1\nn2\nn3\ngpu01\ngpu02\n")


def test_keywords_as_scontrol_takes_them():
    assert run("show", "hostname", "n[1-2]").output == "n1\nn2\n"
    assert run("show", "HOSTNAMES", "n[1-2]").output == "n1\nn2\n"
    assert run("show", "hostl", "a1,a2").output == "a[1-2]\n"
    assert run("show", "hostlistsorted", "n3,n1,n2,n2,x,n4").output == "n[1-2,2-4],x\n"
    assert run("show", "hostlist", "n3,n1,n2,n2,x,n4").output == "n[3,1-2,2],x,n4\n"
    assert run("show", "hosts", "n1").exit_code != 0  # too short for any keyword


def test_hostnames_default_to_the_jobs_nodelist():
    assert run("show", "hostnames", env={"SLURM_NODELIST": "a[1-2]"}).output == "a1\na2\n"
    empty = run("show", "hostnames")  # Slurm: an error message, and exit 0
    assert empty.exit_code == 0 and "hcontrol: error: host list is empty" in empty.output


def test_bad_lists_are_named():
    bad = run("show", "hostnames", "n[3-1]")
    assert bad.exit_code == 0 and "Invalid hostlist: n[3-1]" in bad.output and "goes backwards" in bad.output
    missing = run("show", "hostlist")
    assert missing.exit_code == 1 and "invalid encode argument" in missing.output
    assert run("show", "hostlist", "n[1-").exit_code == 1


def test_hostlist_reads_a_file_or_stdin(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("n5\nn6\n\nn8\n")
    assert run("show", "hostlist", str(hosts)).output == "n[5-6,8]\n"
    assert run("show", "hostlist", "-", input="n1,n2\nn3\n").output == "n[1-3]\n"
    gone = run("show", "hostlist", str(tmp_path / "nonexist"))
    assert gone.exit_code == 1 and f"Can not open {tmp_path}/nonexist" in gone.output
    hosts.write_bytes(b"n1," * 400_000)
    big = run("show", "hostlist", str(hosts))
    assert big.exit_code == 1 and "is too large" in big.output
