"""hcontrol: look at and act on single jobs and nodes, like scontrol."""
from __future__ import annotations

import os
import sys
import time

import click

from ..controller.events import format_line
from ..core.timefmt import format_duration, format_limit, slurm_duration
from ..core.jobids import ArrayError, job_label, parse_job_ref
from .client import ClientError, ControllerClient
from ..core.usertext import printable
from .common import call, call_pages, fail, iso_time, print_table
from .hinfo import node_state
from .hostnames import print_hostlist, print_hostnames
from .jobfields import cpus, elapsed, gres, job_class, nodelist, preemption, tasks
from .reservations import register as register_reservations


PROG = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "hcontrol"  # scontrol too



def _names(listed: str | None) -> str:
    """A -w/-x list as scontrol shows it: compressed, (null) when not given."""
    from ..core.hostlist import compress
    return compress(listed.split(",")) if listed else "(null)"


def _stream(job: dict, pattern: str | None) -> str:
    """StdOut=/StdErr= as scontrol shows them: the pattern expanded, absolute (%N: the first node,
    once the job has one)."""
    from ..core.patterns import resolve_output_path
    spec = job["spec"]
    first = (job.get("nodelist") or "").split(",")[0] or "%N"
    return resolve_output_path(pattern, spec["workdir"], job_id=job["id"], job_name=job["name"], user=job["user"],
                               node=first, restart_count=job["restart_count"], array_job_id=job.get("array_job_id"),
                               array_task_id=job.get("array_task_id"))


def job_lines(job: dict, now: float) -> list[str]:
    spec = job["spec"]
    pairs = [
        [("JobId", job["id"])] + ([("ArrayJobId", job["array_job_id"]), ("ArrayTaskId", job["array_task_id"])]
                                  if job.get("array_job_id") is not None else []) + [("JobName", job["name"])],
        [("UserId", f"{job['user']}({job['uid']})"), ("GroupId", job["gid"]), ("Account", job.get("account") or "default")],
        [("Priority", job["priority"]), ("Partition", job["partition"]), ("QOS", job.get("qos") or "normal"),
         ("Nice", job.get("nice") or 0), ("Level", job["level"]),
         ("Preemptible", preemption(job)), ("Class", job_class(job))],
        [("JobState", job["state"]), ("Reason", job["reason"] or "None"), ("Hold", job["hold"]),
         ("Dependency", job.get("dependency") or "(null)")],
        [("Restarts", job["restart_count"]), ("BatchFlag", 0 if job.get("interactive") else 1), ("ExitCode", f"{job['exit_code'] or 0}:{job['exit_signal'] or 0}")],
        [("RunTime", format_duration(elapsed(job, now))), ("TimeLimit", format_limit(job["time_limit"])),
         ("TimeMin", "N/A" if spec.get("time_min") is None else format_limit(spec["time_min"]))],
        # ours: the idle clock of a running job whose idle reclamation is on (N/A, NONE: off)
        [("IdleFor", "N/A" if job.get("idle_limit") is None else slurm_duration(job.get("idle_for") or 0)),
         ("IdleLimit", "NONE" if job.get("idle_limit") is None else slurm_duration(job["idle_limit"]))],
        [("SubmitTime", iso_time(job["submit_time"])), ("StartTime", iso_time(job["start_time"])),
         ("EndTime", iso_time(job["end_time"]))],
        [("NodeList", nodelist(job) or "(null)"), ("NumNodes", job["nodes"]), ("NumCPUs", cpus(job)),
         ("NumTasks", tasks(job)), ("CPUsPerTask", job["cpus_per_task"]),
         ("MinMemoryNode", f"{job['mem_mb'] or 0}M")],
        [("TresPerNode", f"gres/{gres(job)}" if job.get("gpu_fraction") or job.get("gpu_mem_mb")
          else f"gres/gpu:{job['gpus_per_node']}")],
        [("Features", job.get("constraint") or "(null)"), ("Reservation", job.get("reservation") or "(null)")],
        [("ReqNodeList", _names(job.get("required_nodes"))), ("ExcNodeList", _names(job.get("excluded_nodes"))),
         ("OverSubscribe", "NO" if job.get("exclusive") else "OK")],
        [("WorkDir", spec["workdir"])],
        [("Comment", spec.get("comment") or "(null)"), ("WCKey", spec.get("wckey") or "(null)")],
        [("Runtime", spec.get("runtime") or "default"), ("ContainerImage", spec.get("container_image") or "(null)")],
        [("StdErr", _stream(job, spec.get("stderr") or spec.get("stdout")))],
        [("StdOut", _stream(job, spec.get("stdout")))],
        [("Requeue", int(bool(spec.get("requeue", True)))), ("GraceTime", spec.get("grace"))],
        [("GPUSeconds", f"{job['attained_gpu_seconds']:.0f}")],
    ]
    lines = [" ".join(f"{k}={v}" for k, v in row) for row in pairs]
    if job.get("waiting"):  # a pending job: what keeps it from starting now, node by node
        lines.insert(4, f"Waiting={job['waiting']}")
    for run in job["runs"]:
        lines.append(f"Run={run['attempt']} State={run['state']} NodeList={run['nodelist']} "
                     f"ExitCode={run['exit_code'] or 0}:{run['exit_signal'] or 0}"
                     + (f" Reason={run['reason']}" if run.get("reason") else ""))
    for st in job.get("steps", ()):  # the newest run's job steps
        lines.append(f"Step={job['id']}.{st['step_id']} Name={st['name']} State={st['state']} "
                     f"NumTasks={st['ntasks']} NodeList={nodelist(st)} "
                     f"ExitCode={st['exit_code'] or 0}:{st['exit_signal'] or 0} "
                     f"RunTime={format_duration(elapsed(st, now))}")
    return lines


@click.group(context_settings={"help_option_names": ["--help"]})
def main():
    """Show and control jobs and nodes."""


class _ShowGroup(click.Group):
    """scontrol's keywords: any case, and the host keywords by their prefixes as Slurm takes them
    ("hostname" for hostnames, "hostl" for hostlist)."""
    PREFIXES = (("hostnames", 5), ("hostlist", 5), ("hostlistsorted", 9))

    def get_command(self, ctx, name):
        word = name.lower()
        for keyword, shortest in self.PREFIXES:
            if len(word) >= shortest and keyword.startswith(word):
                return super().get_command(ctx, keyword)
        return super().get_command(ctx, word)


@main.group(cls=_ShowGroup)
def show():
    """Show a job, nodes, a history, accounts, QOS, reservations, or expand and encode host lists."""


register_reservations(main, show, PROG)  # create/delete reservation, show reservation

@show.command("hostnames")
@click.argument("hostlist", required=False)
def show_hostnames(hostlist):
    """The hosts of HOSTLIST (default: $SLURM_NODELIST), one per line."""
    sys.exit(print_hostnames(PROG, hostlist))


@show.command("hostlist")
@click.argument("hostlist", required=False)
def show_hostlist(hostlist):
    """HOSTLIST (names with commas, an absolute path of a file of names, or - for stdin) as one
    hostlist expression, in the order given."""
    sys.exit(print_hostlist(hostlist, sort=False))


@show.command("hostlistsorted")
@click.argument("hostlist", required=False)
def show_hostlistsorted(hostlist):
    """As hostlist, the names sorted first."""
    sys.exit(print_hostlist(hostlist, sort=True))


@show.command("job")
@click.argument("job_id")
def show_job(job_id):
    """One job; every task for an array's id (as scontrol does); one task for 12_4."""
    body = _job_body(job_id)
    reply = call("hcontrol", "show_job", body)
    shown = [reply["job"]]
    if "task_id" not in body and reply["job"].get("array_job_id") == body["job_id"]:
        tasks = call_pages("hcontrol", "jobs", {"ids": [body["job_id"]], "all": True})["jobs"]
        shown += [call("hcontrol", "show_job", {"job_id": t["id"]})["job"] for t in tasks if t["id"] != body["job_id"]]
    for job in shown:
        for line in job_lines(job, reply["now"]):
            print(("   " if not line.startswith("JobId") else "") + line)


def _job_body(job_id: str) -> dict:
    """'12' -> {'job_id': 12}; '12_4' -> {'job_id': 12, 'task_id': 4}."""
    try:
        ref = parse_job_ref(job_id)
    except ArrayError as exc:
        fail("hcontrol", str(exc))
    if ref.tasks is None:
        return {"job_id": ref.job_id}
    if len(ref.tasks) != 1:
        fail("hcontrol", f"Invalid job id specified: {job_id} (give one task, e.g. {ref.job_id}_{ref.tasks[0]})")
    return {"job_id": ref.job_id, "task_id": ref.tasks[0]}


@show.command("events")
@click.argument("job_id", required=False)
@click.option("--node", "node", metavar="NAME", help="a node's history instead of a job's")
@click.option("-n", "--last", "last", type=click.IntRange(min=1), help="only the newest N events")
def show_events(job_id, node, last):
    """A job's decision history (why it waited, when it started, who preempted it and for whom),
    or a node's (--node NAME): one line per event, oldest first."""
    if (job_id is None) == (node is None):
        fail("hcontrol", "show events needs a job id or --node NAME (one of them)")
    body: dict = {"node": node} if node else {"job_id": _job_id(job_id)}
    if last:
        body["limit"] = last
    reply = call("hcontrol", "events", body)
    if not reply["events"]:
        print(f"No events for {'node ' + node if node else 'job ' + job_id}")
    for e in reply["events"]:
        print(event_line(e))


def event_line(e: dict) -> str:
    return f"{iso_time(e['time'])} " + format_line(e["kind"], e["job_id"], e["node"], e["detail"])


def _job_id(job_id: str) -> int:
    try:
        return int(job_id)
    except ValueError:
        fail("hcontrol", f"Invalid job id specified: {job_id}")


def _job_action(method: str, job_id: str) -> None:
    """Act on one job, one task (12_4), or every unfinished task of an array (12), as scontrol does."""
    body = _job_body(job_id)
    tasks = [] if "task_id" in body else [
        j for j in call_pages("hcontrol", "jobs", {"ids": [body["job_id"]]})["jobs"] if j.get("array_job_id") == body["job_id"]]
    if len(tasks) <= 1:
        call("hcontrol", method, body)
        return
    errors = []
    client = ControllerClient()
    try:
        for t in tasks:
            try:
                client.call(method, {"job_id": t["id"]})
            except ClientError as exc:
                errors.append(f"{job_label(t)}: {exc}")
    finally:
        client.close()
    for e in errors:
        print(f"hcontrol: error: {printable(e)}", file=sys.stderr)
    if errors:
        sys.exit(1)


@main.command()
@click.argument("job_id")
def requeue(job_id):
    """Checkpoint a running job now and put it back in the queue (same id, Restarts + 1)."""
    _job_action("requeue", job_id)


@main.command()
@click.argument("job_id")
def requeuehold(job_id):
    """Requeue a running job and hold it (JobHeldUser; JobHeldAdmin when an admin does it to another's job)."""
    _job_action("requeuehold", job_id)


@main.command()
@click.argument("job_id")
def hold(job_id):
    """Keep a pending job from starting (JobHeldUser; JobHeldAdmin when an admin holds another's job)."""
    _job_action("hold", job_id)


@main.command()
@click.argument("job_id")
def release(job_id):
    """Let a held job start again."""
    _job_action("release", job_id)


@main.command()
@click.argument("job_id")
def preempt(job_id):
    """Operators and admins: checkpoint a running job and requeue it, as the scheduler does."""
    _job_action("preempt", job_id)


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("assignments", nargs=-1, required=True)
def update(assignments):
    """Change a node or a pending job, scontrol style:
    update NodeName=X State=DRAIN|RESUME|DOWN Reason="...";
    update JobId=N [TimeLimit=T] [Partition=P] [Dependency=D] (users may only lower TimeLimit);
    (admins) update Account=NAME|User=NAME MaxGPUs=N MaxPending=N MaxJobs=N [Shares=N] (0: no limit);
    (admins) update [reservation] ReservationName=NAME Flags=F,... (adds them; Flags-= takes them off)."""
    if assignments[0].lower() == "reservation" or assignments[0].lower().startswith("reservationname="):
        return update_reservation(assignments[1:] if "=" not in assignments[0] else assignments)
    fields = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep:
            fail("hcontrol", f"Invalid input: {item} (expected KEY=VALUE)")
        fields[key.lower()] = value
    if "jobid" in fields:
        body = _job_body(fields.pop("jobid"))
        if not fields:
            fail("hcontrol", "update JobId=... needs TimeLimit=, Partition= or Dependency=")
        names = {item.partition("=")[0].lower(): item.partition("=")[0] for item in assignments}
        call("hcontrol", "update_job", {**body, "fields": {names[k]: v for k, v in fields.items()}})
        return
    for kind in ("account", "user"):
        if kind in fields:
            return update_limits(kind, fields.pop(kind), fields)
    name = fields.pop("nodename", None) or fields.pop("node", None)
    if not name:
        fail("hcontrol", "update needs NodeName=NAME, JobId=ID, Account=NAME or User=NAME")
    if "state" not in fields:
        fail("hcontrol", "update NodeName=... needs State=DRAIN, RESUME or DOWN")
    body = {"name": name, "state": fields.pop("state"), "reason": fields.pop("reason", None)}
    if fields:
        fail("hcontrol", f"Update of node {name} failed: unknown field(s) {', '.join(sorted(fields))}")
    call("hcontrol", "update_node", body)


def update_reservation(assignments) -> None:
    """update ReservationName=NAME Flags=...|Flags+=...|Flags-=...: Slurm's flag edits (the other
    fields of a reservation are changed by deleting and creating it again here)."""
    name, edits = None, []
    for item in assignments:
        key, sep, value = item.partition("=")
        low = key.lower()
        if not sep:
            fail(PROG, f"Invalid input: {item} (expected KEY=VALUE)")
        if low == "reservationname":
            name = value
        elif low in ("flags", "flags+", "flags-"):
            edits.append((low[5:], value))
        else:
            fail(PROG, f"Error updating the reservation: {key}= cannot be changed by this cluster (only "
                             f"Flags=; delete and create the reservation again). No reservation update.")
    if not name or not edits:
        fail(PROG, "update ReservationName=NAME needs Flags=, Flags+= or Flags-=")
    for op, text in edits:
        call(PROG, "update_reservation", {"name": name, "op": op, "flags": text})
    print("Reservation updated.")


LIMIT_KEYS = {"maxgpus": "max_gpus", "maxpending": "max_pending", "maxjobs": "max_jobs", "shares": "shares",
              "maxsubmitjobs": "max_jobs", "maxsubmit": "max_jobs", "fairshare": "shares"}


def update_limits(kind: str, name: str, fields: dict) -> None:
    body: dict = {"kind": kind, "name": name}
    for key, value in fields.items():
        if key not in LIMIT_KEYS:
            fail("hcontrol", f"Update of {kind} {name} failed: unknown field {key} "
                             f"(MaxGPUs, MaxPending, MaxJobs{', Shares' if kind == 'account' else ''})")
        try:
            body[LIMIT_KEYS[key]] = int(value)
        except ValueError:
            shown = {"max_gpus": "MaxGPUs", "max_pending": "MaxPending", "max_jobs": "MaxJobs", "shares": "Shares"}
            fail("hcontrol", f"Update of {kind} {name} failed: {shown[LIMIT_KEYS[key]]}={value} is not a whole number")
    if len(body) == 2:
        fail("hcontrol", f"update {kind.capitalize()}={name} needs MaxGPUs=, MaxPending=, MaxJobs= or Shares=")
    r = call("hcontrol", "update_limits", body)
    print(f"{kind.capitalize()}={r['name']} MaxGPUs={r['max_gpus']} MaxPending={r['max_pending']} "
          f"MaxJobs={r['max_jobs']}" + (f" Shares={r['shares']}" if "shares" in r else ""))


@show.command("accounts")
def show_accounts():
    """Accounts and user limits in force (config plus live changes); 0 = no limit."""
    reply = call("hcontrol", "accounts", {})
    for a in reply["accounts"]:
        if a["kind"] == "account":
            users = ",".join(a["users"]) or ("(users no account lists)" if a["name"] == "default" else "(none)")
            print(f"Account={a['name']} Shares={a['shares']} MaxGPUs={a['max_gpus']} MaxPending={a['max_pending']} "
                  f"MaxJobs={a['max_jobs']} Users={users}")
        elif a["kind"] == "class":  # [limits.classes]: per user, running jobs of that priority
            print(f"Priority={a['name']} MaxGPUsPerUser={a['max_gpus']}")
        else:
            print(f"User={a['name']} MaxGPUs={a['max_gpus']} MaxPending={a['max_pending']} MaxJobs={a['max_jobs']}")


@show.command("qos")
@click.argument("name", required=False)
def show_qos(name):
    """The QOS sbatch --qos may name ([[qos]] in the controller config): class, limits, who may use it."""
    reply = call("hcontrol", "qos", {})
    rows = [q for q in reply["qos"] if name is None or q["name"] == name]
    if name and not rows:
        fail("hcontrol", f"QOS {name} not found")
    for q in rows:
        allowed = [f"{k}={','.join(q[f'allowed_{k.lower()}'])}" for k in ("Users", "Accounts", "Groups")
                   if q[f"allowed_{k.lower()}"] is not None]
        print(f"QOS={q['name']}{' (default)' if q['name'] == reply['default'] else ''} Priority={q['priority']} "
              f"MaxWall={format_limit(q['max_time'])} MaxTRESPerUser=gres/gpu={q['max_gpus_per_user']} "
              f"MaxJobsPerUser={q['max_jobs_per_user']} " + (" ".join(allowed) or "Allowed=all")
              + (f" Description={q['description']}" if q["description"] else ""))


@show.command("scheduler")
@click.argument("job_ids", nargs=-1, type=int)
def show_scheduler(job_ids):
    """What the scheduler learned of job sizes from the jobs that ended, and where JOB_IDS stand in
    its order and why."""
    r = call("hcontrol", "scheduler", {"job_ids": list(job_ids)})
    print(f"Policy={r['policy']} Order={r['order']} RestartCost={r['restart_cost']:g} "
          f"LearnedFrom={r['learned_from']} ended jobs")
    if r["keys"]:
        print_table(["SIZES OF", "JOBS", "MEDIAN", "P90"],
                    [[k["key"], f"{k['samples']:.0f}", format_duration(int(k["median_s"])),
                      format_duration(int(k["p90_s"]))] for k in r["keys"]])
    else:
        print("No job has ended yet: the order is by attained service until some do.")
    for j in r["jobs"]:
        print(f"Job {j['job_id']}: {j['text']}")
        if j.get("learned") and j.get("order") != "gittins":
            print(f"  learned: {j['learned']['text']}")


@show.command("node")
@click.argument("name", required=False)
def show_node(name):
    reply = call("hcontrol", "nodes", {})
    nodes = [n for n in reply["nodes"] if name is None or n["name"] == name]
    if name and not nodes:
        fail("hcontrol", f"Node {name} not found")
    for n in nodes:
        print(f"NodeName={n['name']} Arch=x86_64 State={node_state(n).upper()} Partitions={','.join(n['partitions'])}")
        print(f"   CPUTot={n['cpus']} CPUAlloc={n['cpus_alloc']} RealMemory={n['mem_mb']}")
        features = ",".join(n.get("features") or ()) or "(null)"
        print(f"   AvailableFeatures={features} ActiveFeatures={features}")
        print(f"   Gres=gpu:{n['gpus_total']} GresUsed=gpu:{n['gpus_alloc']} GpuBackend={n['gpu_backend'] or '-'}")
        if n.get("isolation"):  # fractional GPUs: how shares are enforced, and how many cards take them
            print(f"   Isolation={n['isolation']} SharedGpus={n.get('gpus_shared', 0)}")
        reason = n["reason"] or (reply["links"].get(n["name"]) if not n["responding"] else None)
        print(f"   Address={n['address']} Reason={reason or 'None'}")


@main.group()
def node():
    """Admins: add a node to the cluster or remove one (next to [[nodes]] in controller.toml)."""


@node.command("add")
@click.argument("name")
@click.option("--address", required=True, help="host the controller reaches the node's sshd at")
@click.option("--port", type=click.IntRange(1, 65535), default=22, show_default=True, help="its sshd port")
@click.option("--user", help="SSH user [default: [ssh] user of the controller]")
@click.option("--partitions", help="comma-separated [default: every partition]")
@click.option("--agent-socket", help="the agent's socket on the node [default: /run/hai/agent.sock]")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=15.0, show_default=True,
              help="seconds to wait for the agent to answer (0: do not wait)")
def node_add(name, address, port, user, partitions, agent_socket, wait_s):
    """Register node NAME; the controller connects at once and reads its GPUs from the agent."""
    body = {"name": name, "address": address, "port": port, "user": user, "agent_socket": agent_socket,
            "partitions": [p for p in partitions.split(",") if p] if partitions is not None else None}
    call("hcontrol", "node_add", body)
    deadline = time.monotonic() + wait_s
    while True:
        reply = call("hcontrol", "nodes", {})
        n = next((x for x in reply["nodes"] if x["name"] == name), None)
        if n is not None and n["responding"]:
            print(f"Node {name} added: {n['gpus_total']} GPUs ({n['gpu_backend']}), {n['cpus']} CPUs, "
                  f"{n['mem_mb']} MiB, partitions {','.join(n['partitions'])}")
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    error = reply["links"].get(name)
    print(f"Node {name} added, not responding yet" + (f": {error}" if error else "")
          + f" (hcontrol show node {name})")


@node.command("remove")
@click.argument("name")
@click.option("--force", is_flag=True, help="drain it and requeue what runs there (checkpointed), then remove it")
def node_remove(name, force):
    """Remove node NAME (refused while jobs run there, unless --force)."""
    reply = call("hcontrol", "node_remove", {"name": name, "force": force})
    if reply["removed"]:
        print(f"Node {name} removed")
    else:
        print(f"Node {name} draining: job(s) {', '.join(map(str, reply['jobs']))} run there "
              f"({', '.join(map(str, reply['preempted'])) or 'none'} told to checkpoint and requeue); "
              f"it is removed when they have left")
