"""Device access for a run's cgroup: the GPU device nodes of the cards a job was not given are
refused to every process in it (what Slurm's ConstrainDevices does), so a plain-process job, or an
ssh session adopted into it, cannot open another job's GPU even with CUDA_VISIBLE_DEVICES unset.
Container runtimes (runc, podman) do this themselves from their spec; bubblewrap binds only the
rank's nodes and gets this too.

- cgroup v2 has no devices file: a BPF_PROG_TYPE_CGROUP_DEVICE program decides. It is assembled
  here (a handful of instructions: "char device M:m in the deny list -> refuse, else allow") and
  attached with BPF_F_ALLOW_MULTI, so a runtime may still attach its own below it (every program
  on the path must allow an access).
- cgroup v1: one "c M:m rwm" line per node into devices.deny (the default rule stays "allow all").

The program lives as long as the cgroup: nothing to clean up. Only the agent (root) calls this.
"""
from __future__ import annotations

import ctypes
import os
import re
import stat
import struct
from typing import Iterable

# linux/bpf.h
SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine, 321)
BPF_PROG_LOAD, BPF_PROG_ATTACH = 5, 8
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_MULTI = 2
BPF_DEVCG_DEV_CHAR = 2
ATTR_SIZE = 128  # union bpf_attr, zero-padded: the kernel checks the tail it does not know is zero

GPU_NODE = re.compile(r"nvidia(\d{1,4})")

_libc = ctypes.CDLL(None, use_errno=True)

Node = tuple[int, int]  # (major, minor)


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


LDX_W, AND_K, JNE_K, MOV_K, EXIT = 0x61, 0x57, 0x55, 0xB7, 0x95


def deny_program(deny: Iterable[Node]) -> bytes:
    """The program: ctx is struct bpf_cgroup_dev_ctx {u32 access_type (access << 16 | type);
    u32 major; u32 minor}. Returns 0 (refuse) for a char device in `deny`, 1 otherwise."""
    deny = sorted(set(deny))
    body = [_insn(LDX_W, 2, 1, 0), _insn(AND_K, 2, imm=0xFFFF),
            _insn(LDX_W, 3, 1, 4), _insn(LDX_W, 4, 1, 8),
            _insn(JNE_K, 2, off=4 * len(deny), imm=BPF_DEVCG_DEV_CHAR)]  # not a char device: allow
    for major, minor in deny:
        body += [_insn(JNE_K, 3, off=3, imm=major), _insn(JNE_K, 4, off=2, imm=minor),
                 _insn(MOV_K, 0, imm=0), _insn(EXIT)]
    body += [_insn(MOV_K, 0, imm=1), _insn(EXIT)]
    return b"".join(body)


def _bpf(cmd: int, attr: bytes) -> int:
    buf = ctypes.create_string_buffer(attr, ATTR_SIZE)
    r = _libc.syscall(SYS_BPF, cmd, buf, ATTR_SIZE)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"bpf({cmd}): {os.strerror(e)}")
    return r


def load(deny: Iterable[Node]) -> int:
    """The loaded program's fd."""
    code = deny_program(deny)
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    attr = struct.pack("<IIQQ", BPF_PROG_TYPE_CGROUP_DEVICE, len(code) // 8,
                       ctypes.addressof(insns), ctypes.addressof(license_))
    return _bpf(BPF_PROG_LOAD, attr)


def attach_v2(cgroup_dir: str, deny: Iterable[Node]) -> None:
    prog = load(deny)
    try:
        cg = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            _bpf(BPF_PROG_ATTACH, struct.pack("<IIII", cg, prog, BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI))
        finally:
            os.close(cg)
    finally:
        os.close(prog)  # the cgroup holds its own reference


def deny_v1(cgroup_dir: str, deny: Iterable[Node]) -> None:
    fd = os.open(os.path.join(cgroup_dir, "devices.deny"), os.O_WRONLY | os.O_NOFOLLOW)
    try:
        for major, minor in sorted(set(deny)):
            os.write(fd, f"c {major}:{minor} rwm".encode())  # one rule per write
    finally:
        os.close(fd)


def v2_usable() -> bool:
    """Whether this kernel loads a device program for us (no BPF, a seccomp filter: no)."""
    try:
        os.close(load([]))
    except OSError:
        return False
    return True


def gpu_nodes(device_dir: str) -> dict[int, Node]:
    """{card index: (major, minor)} of the nvidiaN character devices in device_dir (lstat: a link
    there is not a device node)."""
    out: dict[int, Node] = {}
    try:
        names = os.listdir(device_dir)
    except OSError:
        return out
    for name in names:
        m = GPU_NODE.fullmatch(name)
        if not m:
            continue
        try:
            st = os.lstat(os.path.join(device_dir, name))
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            out[int(m[1])] = (os.major(st.st_rdev), os.minor(st.st_rdev))
    return out


def others(device_dir: str, cards: Iterable[int]) -> list[Node]:
    """The device numbers of this node's GPUs that are not among `cards`."""
    keep = set(cards)
    return sorted(n for i, n in gpu_nodes(device_dir).items() if i not in keep)
