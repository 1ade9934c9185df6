"""One node's tasks of a step (job/tasks.py) with real processes: whole lines, ends, signals."""
from __future__ import annotations

import asyncio
import os
import signal

from hai_cluster.job.tasks import MAX_LINE, NodeTasks, describe_end, descendants


def run_tasks(argv, count=2, cwd="/tmp", signal_after=None):
    out: list[tuple[int, str, bytes]] = []
    ends: dict[int, tuple] = {}

    async def on_output(procid, stream, data):
        out.append((procid, stream, data))
        await asyncio.sleep(0.001)  # a slow reader: the task waits, nothing is lost

    async def on_exit(procid, code, sig):
        ends[procid] = (code, sig)

    async def go():
        tasks = NodeTasks(on_output, on_exit)
        envs = [(i, {**os.environ, "SLURM_PROCID": str(i)}) for i in range(count)]
        await tasks.start(argv, cwd, envs)
        if signal_after is not None:
            await asyncio.sleep(signal_after)
            assert tasks.signal(signal.SIGTERM) == count
        await tasks.wait()
    asyncio.run(go())
    return out, ends


def test_output_comes_in_whole_lines_and_every_byte_arrives():
    script = ("import sys\nfor i in range(3000):\n    sys.stdout.write('%d-' % i); sys.stdout.write('x' * 50 + '\\n')\n"
              "sys.stdout.write('no newline at the end')\n")
    out, ends = run_tasks(["python3", "-u", "-c", script])
    assert ends == {0: (0, None), 1: (0, None)}
    for procid in (0, 1):
        chunks = [d for p, s, d in out if p == procid and s == "out"]
        assert all(c.endswith(b"\n") for c in chunks[:-1])  # each piece ends at a line's end
        text = b"".join(chunks).decode()
        assert text == "".join(f"{i}-{'x' * 50}\n" for i in range(3000)) + "no newline at the end"


def test_a_line_longer_than_the_limit_comes_in_pieces():
    out, _ = run_tasks(["python3", "-c", f"print('y' * {3 * MAX_LINE})"], count=1)
    pieces = [d for _, s, d in out if s == "out"]
    assert max(len(p) for p in pieces) <= MAX_LINE + 64 * 1024 and b"".join(pieces) == b"y" * (3 * MAX_LINE) + b"\n"


def test_ends_exit_codes_signals_and_stderr():
    out, ends = run_tasks(["bash", "-c", 'echo oops >&2; [ "$SLURM_PROCID" = 1 ] && kill -9 $$; exit 3'])
    assert ends == {0: (3, None), 1: (None, 9)}
    assert sorted((p, d) for p, s, d in out if s == "err") == [(0, b"oops\n"), (1, b"oops\n")]
    assert describe_end("n1", 0, 3, None) == "n1: task 0: Exited with exit code 3"
    assert describe_end("n2", 1, None, 9) == "n2: task 1: Killed"
    assert describe_end("n2", 1, 0, None) is None


def test_a_missing_command_and_a_missing_directory_say_what_slurmstepd_says(tmp_path):
    out, ends = run_tasks(["no-such-command-here"], count=1)
    assert ends == {0: (2, None)}
    assert out == [(0, "err", b"slurmstepd: error: execve(): no-such-command-here: No such file or directory\n")]
    out, ends = run_tasks(["pwd"], count=1, cwd=str(tmp_path / "gone"))
    assert ends == {0: (0, None)}
    assert (0, "out", b"/tmp\n") in out and out[0][2].startswith(b"slurmstepd: error: couldn't chdir to")


def test_a_signal_reaches_every_task_and_task_pid_is_its_own():
    out, ends = run_tasks(["bash", "-c", 'echo "$SLURM_TASK_PID $$"; exec sleep 30'], signal_after=0.5)
    assert ends == {0: (None, 15), 1: (None, 15)}
    for _, _, data in out:
        a, b = data.split()
        assert a == b


def test_stdin_reaches_the_tasks_that_read_it_and_its_end_closes_theirs():
    out: list[tuple[int, str, bytes]] = []

    async def go():
        async def on_output(procid, stream, data):
            out.append((procid, stream, data))

        async def on_exit(procid, code, sig):
            pass
        tasks = NodeTasks(on_output, on_exit)
        envs = [(i, {**os.environ, "SLURM_PROCID": str(i)}) for i in range(3)]
        await tasks.start(["bash", "-c", 'echo "$SLURM_PROCID:$(wc -c)"'], "/tmp", envs, stdin=[0, 2])
        assert await tasks.write_input(None, b"x" * 200_000, False) == 2  # more than a pipe holds: it waits
        assert await tasks.write_input(2, b"yy", True) == 1
        assert await tasks.write_input(0, b"", True) == 1
        await tasks.wait()
        assert await tasks.write_input(None, b"late", True) == 0  # ended: nothing to reach
    asyncio.run(go())
    assert sorted(d for _, _, d in out) == [b"0:200000\n", b"1:0\n", b"2:200002\n"]  # task 1: /dev/null


def test_a_task_on_a_terminal_gets_its_keys_size_and_signals_as_it_comes():
    out: list[bytes] = []
    ends = {}

    async def go():
        async def on_output(procid, stream, data):
            out.append(data)

        async def on_exit(procid, code, sig):
            ends[procid] = (code, sig)
        tasks = NodeTasks(on_output, on_exit)
        env = {**os.environ, "PS1": "P$ ", "TERM": "dumb"}
        await tasks.start(["bash", "--norc", "--noprofile", "-i"], "/tmp", [(0, env)], pty=0, size=(24, 80))

        async def shown(text: bytes, timeout: float = 10.0):
            for _ in range(int(timeout / 0.05)):
                if text in b"".join(out):
                    return
                await asyncio.sleep(0.05)
            raise AssertionError(f"{text!r} not shown: {b''.join(out)!r}")
        await shown(b"P$ ")

        async def sleeping(timeout: float = 10.0):
            for _ in range(int(timeout / 0.05)):
                for pid in descendants(tasks.procs[0].pid):
                    try:
                        with open(f"/proc/{pid}/cmdline", "rb") as f:
                            if f.read() == b"sleep\x0030\x00":
                                return
                    except OSError:
                        pass
                await asyncio.sleep(0.05)
            raise AssertionError(f"no sleep 30 under the shell: {b''.join(out)!r}")
        await tasks.write_input(0, b"tty -s && stty size\r", False)
        await shown(b"24 80\r\n")  # not line-buffered: the prompt came without a newline
        assert tasks.resize(40, 120)
        await tasks.write_input(0, b"stty size\r", False)
        await shown(b"40 120\r\n")
        await tasks.write_input(0, b"sleep 30; echo slept\r", False)
        await sleeping()  # a loaded machine may start it late: Ctrl-C before it would go to the shell
        await tasks.write_input(0, b"\x03", False)  # Ctrl-C: the foreground sleep, not the shell
        await tasks.write_input(0, b"echo rc=$?\r", False)
        await shown(b"rc=130")
        assert b"\nslept" not in b"".join(out)  # (its echo as typed aside)
        await tasks.write_input(0, b"sleep 30\r", False)
        await asyncio.sleep(0.5)
        tasks.hang_up()  # the job stops: the terminal's session is hung up
        await asyncio.wait_for(tasks.wait(), 10)
    asyncio.run(go())
    assert ends == {0: (None, signal.SIGHUP)}
