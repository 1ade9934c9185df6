"""Default locations, in a module that imports nothing: the CLI needs them and must start fast."""
import os

DEFAULT_CONTROLLER_SOCKET = "/run/hai/controller.sock"
DEFAULT_AGENT_SOCKET = "/run/hai/agent.sock"


def client_socket() -> str:
    """Where the CLI finds the controller: $HAI_CONTROLLER, else the default path."""
    return os.environ.get("HAI_CONTROLLER") or DEFAULT_CONTROLLER_SOCKET
