"""A child process that hosts one pynng socket at a time for tests/peers.py's :func:`pynng_peer`.

NNG can abort its process while closing a ws pipe (issue 22); here that takes down
only this child. The parent sends pickled commands on stdin, one frame each (4-byte
big-endian length, then the pickle), and reads one reply frame per command on the
descriptor that was stdout -- stdout itself goes to stderr so a stray print cannot
corrupt a reply. Replies: ``("ok", value)`` or ``("err", exception class name, text, NNG errno or None)``.

Commands: ``("open", kind, options)``, ``("call", name, args, kwargs)``,
``("get", name)``, ``("set", name, value)``, ``("pipes",)``, ``("close",)``, and for
the containment test ``("abort",)`` (abort now) and ``("abort_on_close",)``.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
from typing import Any, BinaryIO

import pynng


def read_frame(stream: BinaryIO) -> Any:
    head = stream.read(4)
    if len(head) < 4:
        return None  # the parent went away
    (size,) = struct.unpack(">I", head)
    return pickle.loads(stream.read(size))


def write_frame(stream: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def tls_config(spec: dict[str, Any]) -> Any:
    """A ``pynng.TLSConfig`` from a picklable dict; constant names are looked up on the class."""
    spec = dict(spec)
    mode = getattr(pynng.TLSConfig, spec.pop("mode"))
    if isinstance(spec.get("auth_mode"), str):
        spec["auth_mode"] = getattr(pynng.TLSConfig, spec["auth_mode"])
    return pynng.TLSConfig(mode, **spec)


def plain(value: Any) -> Any:
    """What goes back to the parent: a received Message as its bytes, tagged; a
    Dialer, Listener or other NNG handle as None (it cannot leave this process)."""
    if isinstance(value, pynng.Message):
        return ("message", value.bytes)
    if value is None or isinstance(value, (bytes, str, int, float)):
        return value
    return None


class Host:
    def __init__(self) -> None:
        self.sock: Any = None
        self.abort_on_close = False

    def run(self, cmd: tuple[Any, ...]) -> Any:
        op = cmd[0]
        if op == "open":
            options = dict(cmd[2])
            if "tls_config" in options:
                options["tls_config"] = tls_config(options["tls_config"])
            self.sock = getattr(pynng, cmd[1])(**options)
            return None
        if op == "call":
            return plain(getattr(self.sock, cmd[1])(*cmd[2], **cmd[3]))
        if op == "get":
            return getattr(self.sock, cmd[1])
        if op == "set":
            setattr(self.sock, cmd[1], cmd[2])
            return None
        if op == "pipes":  # none once the test closed the socket itself
            return [] if self.sock is None else [(p.id, local_address(p)) for p in self.sock.pipes]
        if op == "close":  # the test's own close, then close_pynng_last's: the second is a no-op
            if self.abort_on_close:
                os.abort()
            sock, self.sock = self.sock, None
            if sock is not None:
                sock.close()
            return None
        if op == "abort":
            os.abort()
        if op == "abort_on_close":
            self.abort_on_close = True
            return None
        raise ValueError(f"unknown command {op!r}")


def local_address(pipe: Any) -> str | None:
    try:
        return str(pipe.local_address)
    except Exception:  # a pipe NNG is tearing down
        return None


def main() -> None:
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    commands = sys.stdin.buffer
    host = Host()
    while (cmd := read_frame(commands)) is not None:
        try:
            reply: tuple[Any, ...] = ("ok", host.run(cmd))
        except Exception as exc:
            reply = ("err", type(exc).__name__, str(exc), getattr(exc, "errno", None))
        write_frame(replies, reply)


if __name__ == "__main__":
    main()
