"""The process side of tests/peers.py's :func:`pynng_peer`: one pynng socket per process.

NNG can abort its process while closing a ws pipe (issue 22); here that takes down
only this child. peers.py starts :func:`serve` through a multiprocessing forkserver
(pynng imported once, each child a fork of it) and sends commands over a Pipe,
one reply each: ``("ok", value)`` or ``("err", class name, text, NNG errno or None)``.

Commands: ``("open", kind, options)``, ``("call", name, args, kwargs)``,
``("get", name)``, ``("set", name, value)``, ``("pipes",)``, ``("close",)``, and for
the containment test ``("abort",)`` (abort now) and ``("abort_on_close",)``.
The child ends when the parent closes its end of the Pipe.
"""

from __future__ import annotations

import os
from multiprocessing.connection import Connection
from typing import Any


def serve(conn: Connection, stderr_path: str) -> None:
    """Run commands from ``conn`` until EOF; NNG's messages (and ours) go to ``stderr_path``."""
    log = os.open(stderr_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(log, 2)
    os.dup2(log, 1)
    os.close(log)
    host = Host()
    while True:
        try:
            cmd = conn.recv()
        except EOFError:
            return
        try:
            reply: tuple[Any, ...] = ("ok", host.run(cmd))
        except Exception as exc:
            reply = ("err", type(exc).__name__, str(exc), getattr(exc, "errno", None))
        conn.send(reply)


def tls_config(spec: dict[str, Any]) -> Any:
    """A ``pynng.TLSConfig`` from a picklable dict; constant names are looked up on the class."""
    import pynng

    spec = dict(spec)
    mode = getattr(pynng.TLSConfig, spec.pop("mode"))
    if isinstance(spec.get("auth_mode"), str):
        spec["auth_mode"] = getattr(pynng.TLSConfig, spec["auth_mode"])
    return pynng.TLSConfig(mode, **spec)


def plain(value: Any) -> Any:
    """What goes back to the parent: a received Message as its bytes, tagged; a
    Dialer, Listener or other NNG handle as None (it cannot leave this process)."""
    import pynng

    if isinstance(value, pynng.Message):
        return ("message", value.bytes)
    if value is None or isinstance(value, (bytes, str, int, float)):
        return value
    return None


def local_address(pipe: Any) -> str | None:
    try:
        return str(pipe.local_address)
    except Exception:  # a pipe NNG is tearing down
        return None


class Host:
    """The one pynng socket of this process and the commands on it."""

    def __init__(self) -> None:
        self.sock: Any = None
        self.abort_on_close = False

    def run(self, cmd: tuple[Any, ...]) -> Any:
        import pynng

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
