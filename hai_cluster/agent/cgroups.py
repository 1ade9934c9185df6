"""A cgroup per job run: limits (memory, CPUs, process count), membership, OOM detection, freeze
and kill of everything the job started, wherever it went (setsid, double fork, containers).

Layout: the run's cgroup is `<hierarchy>/<parent>/<job>.<attempt>` (parent: agent config plus the
node name and a hash of the spool, so two agents on one machine never collide) in each hierarchy
it needs:
- cgroup v2 (the unified mount), whenever it is mounted: membership, cgroup.kill, cgroup.freeze,
  and every limit whose controller v2 has (pure v2 hosts: all of them);
- cgroup v1, for each controller v2 lacks (hybrid hosts: memory, cpu and pids), and the v1 freezer
  when v2 has no cgroup.kill (then a kill is freeze, SIGKILL each member, thaw: nothing can fork
  in between).
A controller is attached to one hierarchy at a time, so "v2 if v2 has it, else v1" is the whole
policy. `detect` runs once at agent start; the shepherd builds each run's cgroup from its result.

Where the tree hangs: under systemd (the unit's Delegate=yes) in the agent's own cgroup, as
systemd's delegation rules ask: the agent moves itself into `<own>/agent` (a cgroup with
controllers enabled for its children may hold no process) and the runs go to
`<own>/jobs/<node>-<hash>/`; nothing above `<own>` is written. Without systemd, `/hai/...` below
the root (the agent then enables the controllers from the root down). After a restart with
KillMode=process, systemd before v254 (no DelegateSubgroup=) cannot put the new agent back into
its cgroup, an inner node by then, and puts it higher up: the agent finds its cgroup again from
the spool's record and moves back in.
Light imports only: the shepherd imports this module on every job start.
"""
from __future__ import annotations

import errno
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

log = logging.getLogger(__name__)

LIMITS = ("memory", "cpu", "pids")
FEATURES = (*LIMITS, "kill", "freeze", "devices")
CPU_PERIOD = 100_000  # microseconds; quota = CPUs x period
LIMIT_SLACK = 1 << 20  # a usage this close to the limit reached it (charges come in batches of pages)
MIB = 1024 * 1024
FREEZE_WAIT = 1.0  # seconds a freeze may take before we go on anyway


def parse_mounts(text: str) -> tuple[str | None, dict[str, str]]:
    """(cgroup2 mount point, {v1 controller: mount point}) from /proc/self/mounts."""
    v2, v1 = None, {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        point = parts[1].replace("\\040", " ")
        if parts[2] == "cgroup2" and v2 is None:
            v2 = point
        elif parts[2] == "cgroup":
            for opt in parts[3].split(","):
                if opt in (*LIMITS, "freezer", "devices") and opt not in v1:
                    v1[opt] = point
    return v2, v1


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _tree(d: str) -> list[str]:
    """d and the cgroups below it, parents first (none below unless a runtime made them). A
    cgroup directory links 2 + its subdirectories (kernfs, v1 and v2): one stat answers for the
    usual run, which has none, without listing its dozens of control files (the shepherd asks
    at every wakeup)."""
    out = [d]
    try:
        if os.stat(d).st_nlink <= 2:
            return out
    except OSError:
        return out
    for top, dirs, _ in os.walk(d):
        out += [os.path.join(top, x) for x in sorted(dirs)]
    return out


def _keyed(path: str, key: str) -> int:
    """The value of `key` in a flat keyed file (memory.events, memory.oom_control); 0 if absent."""
    try:
        for line in _read(path).splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    except (OSError, ValueError):
        pass
    return 0


@dataclass(frozen=True)
class Capabilities:
    """What this node's cgroups can do for a run: each feature -> "v2" | "v1" (absent: not at all)."""
    parent: str  # relative to each hierarchy's root
    v2: str | None = None
    v1: Mapping[str, str] = field(default_factory=dict)  # controller -> mount point, those used
    features: Mapping[str, str] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        return bool(self.features)

    def summary(self) -> dict[str, str | None]:
        return {f: self.features.get(f) for f in FEATURES}

    def to_wire(self) -> dict:
        return {"parent": self.parent, "v2": self.v2, "v1": dict(self.v1), "features": dict(self.features)}

    @classmethod
    def from_wire(cls, d: Any) -> "Capabilities":
        return cls(parent=d["parent"], v2=d["v2"], v1=dict(d["v1"]), features=dict(d["features"]))


def _enable_v2(root: str, parent: str, wanted: list[str], top: str = "") -> list[str]:
    """Enable controllers in cgroup.subtree_control from `top` (relative to the root; "" = the root
    itself) down to `parent`; the ones that made it all the way. (A cgroup with processes in it
    cannot delegate: those fail here.)"""
    ok = list(wanted)
    d = os.path.join(root, top) if top else root
    below = parent[len(top):].strip("/") if top else parent
    for part in ["", *below.split("/")]:
        d = os.path.join(d, part) if part else d
        for c in list(ok):
            try:
                if c not in _read(os.path.join(d, "cgroup.subtree_control")).split():
                    _write(os.path.join(d, "cgroup.subtree_control"), f"+{c}")
            except OSError as exc:
                log.warning("cgroup v2: cannot enable %s in %s: %s", c, d, exc)
                ok.remove(c)
    return ok


def detect(parent: str, mounts: str | None = None, top: str = "") -> Capabilities:
    """Create the parent cgroups and find out what each hierarchy offers. Never raises: a node
    without usable cgroups still runs jobs, without limits. `top`: the cgroup, above `parent`, from
    which the agent may write (its delegated cgroup; "" = the root)."""
    parent, top = parent.strip("/"), top.strip("/")
    if mounts is None:
        try:
            mounts = _read("/proc/self/mounts")
        except OSError:
            mounts = ""
    v2, v1_all = parse_mounts(mounts)
    features: dict[str, str] = {}
    v1: dict[str, str] = {}
    if v2 is not None:
        base = os.path.join(v2, parent)
        try:
            os.makedirs(base, exist_ok=True)
            available = _read(os.path.join(v2, top, "cgroup.controllers")).split()
        except OSError as exc:
            log.warning("cgroup v2 at %s is not usable: %s", v2, exc)
            v2 = None
        else:
            for c in _enable_v2(v2, parent, [c for c in LIMITS if c in available], top):
                features[c] = "v2"
            for f in ("kill", "freeze"):
                if os.path.exists(os.path.join(base, f"cgroup.{f}")):
                    features[f] = "v2"
            from . import devcgroup  # ctypes: only where a cgroup is made
            if devcgroup.v2_usable():  # no controller file: a BPF program per cgroup
                features["devices"] = "v2"
    for c in (*LIMITS, "freezer", "devices"):
        feature = "freeze" if c == "freezer" else c
        if feature in features or c not in v1_all:
            continue
        try:
            os.makedirs(os.path.join(v1_all[c], parent), exist_ok=True)
        except OSError as exc:
            log.warning("cgroup v1 %s at %s is not usable: %s", c, v1_all[c], exc)
            continue
        v1[c] = v1_all[c]
        features[feature] = "v1"
    if (v2 or v1) and "kill" not in features:
        features["kill"] = "v1"  # SIGKILL to every member (after a freeze where there is a freezer)
    return Capabilities(parent=parent, v2=v2, v1=v1, features=features)


class RunCgroup:
    """The cgroups of one run. `dirs` maps "v2" or a v1 controller to the run's directory there."""

    def __init__(self, caps: Capabilities, name: str) -> None:
        self.caps = caps
        self.name = name
        self.dirs: dict[str, str] = {}
        if caps.v2:
            self.dirs["v2"] = os.path.join(caps.v2, caps.parent, name)
        for c, mount in caps.v1.items():
            self.dirs[c] = os.path.join(mount, caps.parent, name)
        self.mem_mb: int | None = None

    @property
    def path(self) -> str:
        """The path relative to every hierarchy's root (what runc calls cgroupsPath)."""
        return "/" + "/".join(p for p in (self.caps.parent, self.name) if p)

    def _dir(self, feature: str) -> str | None:
        kind = self.caps.features.get(feature)
        if kind == "v2":
            return self.dirs.get("v2")
        if kind == "v1":
            return self.dirs.get("freezer" if feature == "freeze" else feature)
        return None

    def record(self) -> dict:
        return {"caps": self.caps.to_wire(), "name": self.name, "mem_mb": self.mem_mb}

    @classmethod
    def from_record(cls, d: Mapping) -> "RunCgroup":
        cg = cls(Capabilities.from_wire(d["caps"]), d["name"])
        cg.mem_mb = d.get("mem_mb")
        return cg

    # -- setup --

    def create(self, mem_mb: int | None, cpus: int | None, pids: int | None) -> None:
        """Make the directories (clearing a stale one left by a crash) and write the limits."""
        for d in self.dirs.values():
            if os.path.isdir(d):
                log.warning("removing a stale cgroup %s", d)
                self.kill()
                self.remove()
            os.mkdir(d)
        self.mem_mb = mem_mb
        if mem_mb is not None and (d := self._dir("memory")):
            limit = str(mem_mb * MIB)
            if self.caps.features["memory"] == "v2":
                _write(f"{d}/memory.max", limit)
                self._try(f"{d}/memory.swap.max", "0")  # swap would let a job overrun its --mem
                self._try(f"{d}/memory.oom.group", "1")  # an OOM kill ends all of the job
            else:
                _write(f"{d}/memory.limit_in_bytes", limit)
                self._try(f"{d}/memory.memsw.limit_in_bytes", limit)
        if cpus is not None and (d := self._dir("cpu")):
            if self.caps.features["cpu"] == "v2":
                _write(f"{d}/cpu.max", f"{cpus * CPU_PERIOD} {CPU_PERIOD}")
            else:
                _write(f"{d}/cpu.cfs_period_us", str(CPU_PERIOD))
                _write(f"{d}/cpu.cfs_quota_us", str(cpus * CPU_PERIOD))
        if pids and (d := self._dir("pids")):
            _write(f"{d}/pids.max", str(pids))

    def restrict_devices(self, deny: Iterable[tuple[int, int]]) -> bool:
        """Refuse the run these character devices (devcgroup). False where this node cannot."""
        deny = list(deny)
        d = self._dir("devices")
        if not deny or d is None:
            return bool(d)
        from . import devcgroup
        if self.caps.features["devices"] == "v2":
            devcgroup.attach_v2(d, deny)
        else:
            devcgroup.deny_v1(d, deny)
        return True

    @staticmethod
    def _try(path: str, value: str) -> None:
        try:
            _write(path, value)
        except OSError:  # no swap accounting, an old kernel: the limit itself still holds
            pass

    def procs_files(self) -> list[str]:
        """The files a process writes "0" into to join every cgroup of the run."""
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    # -- state --

    def _tracking(self) -> str | None:
        return self.dirs.get("v2") or next(iter(self.dirs.values()), None)

    def members(self) -> list[int]:
        d = self._tracking()
        if d is None:
            return []
        out = []
        for sub in _tree(d):  # a runtime may put the job below (podman: <run>/libpod-<id>)
            try:
                out += [int(p) for p in _read(os.path.join(sub, "cgroup.procs")).split()]
            except (OSError, ValueError):
                pass
        return out

    def usage(self) -> tuple[float | None, int | None]:
        """(CPU seconds, peak memory bytes) of everything the run ran, exited processes included:
        v2's cpu.stat usage_usec (there with or without the cpu controller) and memory.peak (v1:
        memory.max_usage_in_bytes): what the cgroup was charged, page cache included, which is what
        --mem limits. None for what this node cannot tell."""
        cpu = mem = None
        if (d := self.dirs.get("v2")) is not None:
            usec = _keyed(f"{d}/cpu.stat", "usage_usec")
            cpu = usec / 1e6 if usec or os.path.exists(f"{d}/cpu.stat") else None
        if (d := self._dir("memory")) is not None:
            name = "memory.peak" if self.caps.features["memory"] == "v2" else "memory.max_usage_in_bytes"
            try:
                mem = int(_read(f"{d}/{name}").split()[0])
            except (OSError, ValueError, IndexError):  # memory.peak: kernels from 5.19 on
                mem = None
        return cpu, mem

    def oom_notifier(self) -> int | None:
        """v1: an eventfd the kernel makes readable when this cgroup runs out of memory (a limit
        reached here or above). v1 counts an OOM kill only in the victim's own cgroup, and the
        cgroup a container runtime made below this one goes, its count with it, when the
        container ends: often before the next look (a shell that outlives its OOM-killed child
        ends the container within the shepherd's one-second wake-up). v2 needs none: its
        memory.events here counts kills below too, and stays. None where there is nothing to
        watch or the kernel refuses."""
        d = self._dir("memory")
        if d is None or self.caps.features["memory"] != "v1" or not self.mem_mb:
            return None  # without a limit of its own, an event could only be an ancestor's OOM
        efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        try:
            ofd = os.open(f"{d}/memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
            try:  # the kernel keeps the eventfd, not this fd
                _write(f"{d}/cgroup.event_control", f"{efd} {ofd}")
            finally:
                os.close(ofd)
        except OSError as exc:
            log.warning("cannot watch %s for OOM events: %s", d, exc)
            os.close(efd)
            return None
        return efd

    def limit_reached(self) -> bool:
        """v1: this cgroup's usage peaked at its own limit (max_usage_in_bytes, memory or memsw),
        so an OOM event is its own, not one of a limit above it (which notifies every cgroup
        below, whose peaks stay under their limits). Not memory.failcnt: this kernel (6.18)
        leaves it 0."""
        d = self._dir("memory")
        if d is None:
            return False
        for kind in ("memory", "memory.memsw"):
            try:
                limit = int(_read(f"{d}/{kind}.limit_in_bytes"))
                peak = int(_read(f"{d}/{kind}.max_usage_in_bytes"))
            except (OSError, ValueError):
                continue
            if peak >= limit - LIMIT_SLACK:
                return True
        return False

    def oom_kills(self) -> int:
        d = self._dir("memory")
        if d is None:
            return 0
        if self.caps.features["memory"] == "v2":
            return _keyed(f"{d}/memory.events", "oom_kill")
        # v1 counts a kill only in the victim's own cgroup, not in its ancestors (v2 does)
        return sum(_keyed(f"{sub}/memory.oom_control", "oom_kill") for sub in _tree(d))

    # -- actions --

    def freeze(self, frozen: bool = True) -> bool:
        d = self._dir("freeze")
        if d is None:
            return False
        try:
            if self.caps.features["freeze"] == "v2":
                _write(f"{d}/cgroup.freeze", "1" if frozen else "0")
            else:
                _write(f"{d}/freezer.state", "FROZEN" if frozen else "THAWED")
        except OSError as exc:
            log.warning("cannot %s %s: %s", "freeze" if frozen else "thaw", d, exc)
            return False
        if frozen:  # the write only starts it; a process in uninterruptible sleep may take a while
            deadline = time.monotonic() + FREEZE_WAIT
            while not self._frozen(d) and time.monotonic() < deadline:
                time.sleep(0.005)
        return True

    def _frozen(self, d: str) -> bool:
        try:
            if self.caps.features["freeze"] == "v2":
                return _keyed(f"{d}/cgroup.events", "frozen") == 1
            return _read(f"{d}/freezer.state").strip() == "FROZEN"
        except OSError:
            return True

    def kill(self) -> None:
        """SIGKILL every process of the run, including those that left its process group."""
        d = self._dir("kill")
        if d is not None and self.caps.features["kill"] == "v2":
            try:
                _write(f"{d}/cgroup.kill", "1")
                return
            except OSError as exc:
                log.warning("cgroup.kill in %s failed: %s", d, exc)
        frozen = self.freeze(True)  # frozen processes cannot fork while we go through the list
        try:
            for _ in range(3):  # without a freezer, a fork may race a pass: go round again
                pids = self.members()
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                if frozen or not pids:
                    break
        finally:
            if frozen:
                self.freeze(False)  # SIGKILLed processes die once thawed

    def remove(self, timeout: float = 5.0) -> None:
        """rmdir every directory; busy ones are retried while their last processes exit."""
        deadline = time.monotonic() + timeout
        for d in [sub for top in self.dirs.values() for sub in reversed(_tree(top))]:  # children first
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        log.warning("cannot remove cgroup %s: %s", d, exc)
                        break
                    self.kill()
                    time.sleep(0.05)


def agent_cgroup(node: str, spool: str) -> str:
    """The agent's own level in the cgroup tree: its node name, and a hash of its spool, so that
    two agents on one machine (test clusters, concurrent test runs) never share run cgroups."""
    import hashlib
    return f"{node}-{hashlib.sha256(os.path.realpath(spool).encode()).hexdigest()[:8]}"


# ---- the agent's own place in the tree -----------------------------------------------------
AGENT_LEAF = "agent"  # the agent's own cgroup below its delegated one
BASE_RECORD = "cgroup-base"  # in the spool: the delegated cgroup, for a restart put elsewhere


def own_v2(text: str | None = None) -> str | None:
    """This process's cgroup v2 path (the "0::" line of /proc/self/cgroup), relative to the
    hierarchy's root ("" for the root); None without one."""
    if text is None:
        try:
            text = _read("/proc/self/cgroup")
        except OSError:
            return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip().strip("/")
    return None


def systemd_service() -> bool:
    """The agent is the process systemd started for a service (SYSTEMD_EXEC_PID, systemd >= 248,
    names it: a daemon a service's process forked is not): its cgroup is the unit's, delegated to
    it by the unit's Delegate=yes."""
    return (os.environ.get("SYSTEMD_EXEC_PID") == str(os.getpid()) and "INVOCATION_ID" in os.environ
            and os.path.isdir("/run/systemd/system"))


def _within(path: str, ancestor: str) -> bool:
    return not ancestor or path == ancestor or path.startswith(ancestor + "/")


def adopt_delegated(v2: str, spool: str, own: str | None = None) -> str | None:
    """Settle the agent in its delegated cgroup: find it (its own, or, when a restart left the
    agent higher up, the one the spool recorded), move the agent into `<it>/agent`, record it.
    Returns it (relative to the v2 root), or None when the agent has no cgroup of its own to use."""
    own = own_v2() if own is None else own
    if own is None:
        return None
    if own.rsplit("/", 1)[-1] == AGENT_LEAF:  # moved there by an earlier start (or DelegateSubgroup=agent)
        own = own.rsplit("/", 1)[0] if "/" in own else ""
    record = os.path.join(spool, BASE_RECORD)
    try:
        recorded = _read(record).strip().strip("/")
    except OSError:
        recorded = ""
    base = own
    if recorded and recorded != own and _within(recorded, own) and os.path.isdir(os.path.join(v2, recorded)):
        log.info("cgroups: back into %s, recorded by the agent's previous start (this one began in /%s)",
                 recorded, own)
        base = recorded
    if not base:
        log.warning("cgroups: the agent runs in the root cgroup: no delegated cgroup to use")
        return None
    leaf = os.path.join(v2, base, AGENT_LEAF)
    try:
        os.makedirs(leaf, exist_ok=True)
        _write(os.path.join(leaf, "cgroup.procs"), str(os.getpid()))
    except OSError as exc:
        log.warning("cgroups: cannot move the agent into %s: %s", leaf, exc)
        return None
    if recorded != base:
        from .spool import write_bytes_atomic
        os.makedirs(spool, 0o711, exist_ok=True)  # as RunTable.setup makes it, a moment later
        write_bytes_atomic(record, (base + "\n").encode())
    return base
