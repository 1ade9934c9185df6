import pytest

from .agent_helpers import AgentProcess, Sandbox, need_root


@pytest.fixture(scope="module")
def agent():
    """A real hai-agent process on a sandboxed spool and socket, shared by a test module."""
    need_root()
    box = Sandbox()
    proc = AgentProcess(box).start()
    yield proc
    proc.stop()
    box.cleanup()


@pytest.fixture
def box():
    """A fresh sandbox (spool, socket, test user's directories) for one test's own agent."""
    need_root()
    b = Sandbox()
    yield b
    b.cleanup()
