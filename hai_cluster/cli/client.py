"""A small synchronous client for the controller socket. Imports nothing heavy: the CLI must
start fast (no asyncio, SQLAlchemy or asyncssh here). It uses the C `_socket` module: `socket`
pulls in enum and selectors, a third of hsubmit's import time, for nothing a client needs."""
from __future__ import annotations

import _socket
import sys

from ..paths import client_socket
from ..protocol import messages
from ..protocol.framing import FrameDecoder, ProtocolError, frame


class ClientError(Exception):
    """A request failed: the controller said no, or could not be reached."""


class ReplyLost(ClientError):
    """The request went out (or may have) and no answer came back: the controller may have done it."""


class Unreachable(ClientError):
    """No connection: the request was not sent."""


class ControllerClient:
    def __init__(self, path: str | None = None, timeout: float = 60.0, wire=None) -> None:
        """`wire`: the payload codec, a module with packb and unpackb; msgpack's C extension by
        default (protocol/codec.py), which decodes big replies fast. hsubmit passes minipack."""
        self.path = path or client_socket()
        self.timeout = timeout
        if wire is None:
            from ..protocol import codec as wire
        self._wire = wire
        self._sock: _socket.socket | None = None
        self._decoder = FrameDecoder(wire.unpackb)
        self._next_id = 1

    def _connect(self) -> _socket.socket:
        if self._sock is None:
            sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            try:
                # A blocking connect waits in the kernel while the controller's accept queue is
                # full (for at most SO_SNDTIMEO), as hsubmit's C client does; a non-blocking one
                # fails at once with EAGAIN, which is what another user's connect loop caused.
                sec = int(self.timeout)
                sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDTIMEO,
                                sec.to_bytes(8, sys.byteorder) + int((self.timeout - sec) * 1e6).to_bytes(8, sys.byteorder))
                sock.connect(self.path)
                sock.settimeout(self.timeout)
            except OSError as exc:
                sock.close()
                raise Unreachable(f"cannot reach the controller at {self.path}: {exc.strerror or exc} "
                                  "(is hai-controller running? HAI_CONTROLLER names its socket)") from None
            self._sock = sock
        return self._sock

    def call(self, method: str, body: object = None) -> object:
        sock = self._connect()
        rid = self._next_id
        self._next_id += 1
        try:
            sock.sendall(frame(self._wire.packb(messages.request(rid, method, body))))
            while True:
                data = sock.recv(65536)
                if not data:
                    raise ReplyLost("the controller closed the connection")
                for raw in self._decoder.feed(data):
                    msg = messages.parse_message(raw)
                    if isinstance(msg, messages.Response) and msg.id == rid:
                        if not msg.ok:
                            raise ClientError(msg.error)
                        return msg.body
        except TimeoutError:  # what a socket timeout raises
            raise ReplyLost(f"no answer from the controller within {self.timeout:.0f} s") from None
        except ProtocolError as exc:
            raise ClientError(f"bad reply from the controller: {exc}") from None
        except OSError as exc:
            raise ReplyLost(f"connection to the controller failed: {exc}") from None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            self._decoder = FrameDecoder(self._wire.unpackb)  # what the old connection left half-read is not for the next
            self._next_id = 1  # request ids are per connection
