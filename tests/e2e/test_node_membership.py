"""hcontrol node add/remove on real SSH nodes: a node that is not in the config is added, its
GPUs are read from its agent and it takes work; removing it is refused while jobs run there,
and --force drains it, requeues its jobs (checkpointed) and removes it."""
from __future__ import annotations

import pytest

from .harness import TEST_USER, Daemon, python_daemon, start_ssh_cluster, wait_for


@pytest.fixture(scope="module")
def cluster(ssh_nodes):
    c = start_ssh_cluster(ssh_nodes[:1], gpus_per_node=2)  # the second node is not in [[nodes]]
    extra = ssh_nodes[1]
    nd = c.workdir / extra.name
    nd.mkdir()
    sock = c.workdir / f"{extra.name}.sock"
    (nd / "agent.toml").write_text(f'[agent]\nname = "{extra.name}"\nsocket = "{sock}"\nspool = "{nd}/spool"\n'
                                   f'[gpus]\nbackend = "simulated"\nsimulated_count = 4\n')
    c.agents[extra.name] = agent = Daemon(python_daemon("hai_cluster.agent.daemon", nd / "agent.toml"),
                                          nd / "agent.log", spawn=extra.popen)
    agent.start()
    c.extra, c.extra_socket = extra, str(sock)
    yield c
    c.close()


def node_row(cluster, name):
    return next((n for n in cluster.call("nodes", {})["nodes"] if n["name"] == name), None)


def test_add_bad_input_and_non_admins_are_refused(cluster):
    for argv, text in [(("node", "add", "x y", "--address", "h"), "Invalid node name"),
                       (("node", "add", "nx", "--address", "h", "--partitions", "cpu"), "Invalid partition"),
                       (("node", "add", "nx", "--address", "h", "--agent-socket", "rel.sock"), "absolute path"),
                       (("node", "add", "nx", "--address", "h",
                         "--port", "0"), "Invalid value for '--port'"),
                       (("node", "remove", "nosuch"), "Node nosuch not found")]:
        proc = cluster.cli("hcontrol", *argv, user="root", check=False)
        assert proc.returncode != 0 and text in proc.stderr, (argv, proc.stderr)
    proc = cluster.cli("hcontrol", "node", "add", "nx", "--address", "h", check=False)
    assert proc.returncode != 0 and "only administrators may add nodes" in proc.stderr
    configured = next(n["name"] for n in cluster.call("nodes", {})["nodes"])
    proc = cluster.cli("hcontrol", "node", "remove", configured, user="root", check=False)
    assert proc.returncode != 0 and "comes from [[nodes]]" in proc.stderr
    assert [n["name"] for n in cluster.call("nodes", {})["nodes"]] == [configured]


def test_added_node_takes_work_and_is_removed_with_force(cluster):
    extra = cluster.extra
    out = cluster.cli("hcontrol", "node", "add", extra.name, "--address", extra.address, "--port", str(extra.port),
                      "--agent-socket", cluster.extra_socket, "--wait", "60", user="root").stdout
    assert f"Node {extra.name} added: 4 GPUs (simulated)" in out, out
    proc = cluster.cli("hcontrol", "node", "add", extra.name, "--address", extra.address, user="root", check=False)
    assert "already exists" in proc.stderr
    # The store keeps it: a restarted controller links to it again.
    cluster.controller.stop()
    cluster.controller.start()
    cluster.wait_nodes(2)
    # A 4-GPU job fits only on the added node (the configured one has 2 GPUs).
    job = cluster.submit("--gpus-per-node=4", "--wrap", "sleep 300")
    running = cluster.wait_state(job, "RUNNING")
    assert running["nodelist"] == extra.name
    proc = cluster.cli("hcontrol", "node", "remove", extra.name, user="root", check=False)
    assert proc.returncode != 0 and f"runs job(s) {job}" in proc.stderr and "--force" in proc.stderr
    assert node_row(cluster, extra.name) is not None
    out = cluster.cli("hcontrol", "node", "remove", extra.name, "--force", user="root").stdout
    assert "draining" in out and f"{job} told to checkpoint" in out
    wait_for(lambda: node_row(cluster, extra.name) is None, 60, what="the node to be removed")
    # The job was requeued; nothing can run it now, and the node's history is kept.
    done = cluster.wait_state(job, "PENDING")
    assert done["restart_count"] == 1
    history = cluster.cli("hcontrol", "show", "events", "--node", extra.name, user=TEST_USER).stdout
    for kind in ("node_added", "node_up", "started", "node_state", "node_removed"):
        assert f"event={kind}" in history, history
    cluster.cli("hcancel", str(job))
