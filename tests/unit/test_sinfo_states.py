"""sinfo's node states in reservations open now, as Slurm 22.05's sinfo shows them on the peer:
an idle node is `resv` (`reserved`), `maint` in a Flags=MAINT window; a busy one in a MAINT window
has a `$` (`mix$`, `mixed$`)."""
import pytest

from hai_cluster.cli.sinfo import LONG_STATE, state_of


def node(reserved=None, jobs=0, gpus_alloc=0, state="up", responding=True):
    return {"state": state, "jobs": jobs, "gpus_alloc": gpus_alloc, "gpus_total": 4, "cpus": 8, "cpus_alloc": jobs,
            "responding": responding, "reserved": reserved}


@pytest.mark.parametrize("n, short", [
    (node(), "idle"), (node("RESV"), "resv"), (node("MAINT"), "maint"), (node("MAINT", responding=False), "maint*"),
    (node("MAINT", jobs=1, gpus_alloc=1), "mix$"), (node("MAINT", jobs=1, gpus_alloc=4), "alloc$"),
    (node("RESV", jobs=1, gpus_alloc=1), "mix"), (node("MAINT", state="drain"), "drain"),
    (node("RESV", jobs=1, state="drain"), "drng"),
])
def test_reserved_nodes(n, short):
    assert state_of(n) == short
    assert LONG_STATE[short.rstrip("*")] in ("idle", "reserved", "maint", "mixed$", "allocated$", "mixed", "drained",
                                             "draining")


def test_node_and_cpu_counts_as_the_peer_counts_them():
    """Slurm 22.05 on the peer, one line per state (sinfo -o '%F|%A|%C|%T'): maint 0/1/0/1|0/1|
    0/64/0/64, drained 0/0/1/1|0/0|0/0/64/64, mixed (4 CPUs used) 1/0/0/1|1/0|4/60/0/64, down
    0/0/1/1|0/0|0/0/64/64; a reserved idle node and a non-responding one count as idle."""
    from hai_cluster.cli.sinfo import LETTERS

    def line(n):
        n = {**n, "cpus": 64, "state_c": state_of(n)}
        g = {"members": [n]}
        return "|".join(LETTERS[c][1](g) for c in "FAC")

    assert line(node("MAINT")) == "0/1/0/1|0/1|0/64/0/64"
    assert line(node(state="drain")) == "0/0/1/1|0/0|0/0/64/64"
    assert line({**node(jobs=1, gpus_alloc=1), "cpus_alloc": 4}) == "1/0/0/1|1/0|4/60/0/64"
    assert line(node("RESV")) == line(node(responding=False)) == "0/1/0/1|0/1|0/64/0/64"
    assert line({**node(jobs=1, state="drain"), "cpus_alloc": 4}) == "1/0/0/1|1/0|4/0/60/64"  # draining
    group = {"members": [{**n, "cpus": 64, "state_c": state_of(n)} for n in
                         (node("MAINT"), node(state="drain"), {**node(jobs=1, gpus_alloc=1), "cpus_alloc": 4})]}
    assert LETTERS["F"][1](group) == "1/1/1/3"
