"""Devices: forward messages between two raw sockets (nanomsg's ``nn_device``).

A device is two pumps, ``a -> b`` and ``b -> a`` (only the directions the two
protocols can carry), each receiving a message with its header from one raw
socket and sending it with that header on the other. Headers do the routing:
raw REP/RESPONDENT push the incoming pipe id onto the backtrace and pop it on the
way back, raw PAIR1 adds a hop, raw BUS skips the pipe a message came from.
Loops are broken by ``max_ttl`` (REQ/REP, SURVEY, PAIR1), never by the device.

ZeroMQ peers: raw PAIR, PUSH, PULL, PUB and SUB sockets may have ``zmtp+``
endpoints, and a multipart message crosses the device with its frames. An SP
pipe carries one frame per message, so a pump from a socket with a ``zmtp+``
endpoint into a socket with an SP endpoint could only join frames or fail on
the first multipart message: the device refuses that when it is built, and,
while it runs, a ``bind``/``connect`` that would make it so is refused too.

The pumps are tasks: ``adevice`` runs them in the caller's trio or asyncio loop;
``device`` runs them in nanopy's engine loop and blocks the calling thread. Beside
the pumps, one watcher per socket waits for that socket to close: a pump blocked
receiving from one socket never notices the *other* closing (a SUB -> PUB
forwarder has no reverse pump at all), so the watcher ends the device. Then every
pump is cancelled (losslessly: a cancelled receive takes nothing) and the call
returns.
"""

from __future__ import annotations

import threading
from typing import Any

import trio

from ..core.errors import AddressError, Closed, ProtocolError
from ..transports._registry import carries_multipart
from .socket import Socket


def _check(a: Socket, b: Socket) -> list[tuple[Socket, Socket]]:
    for s in (a, b):
        if not isinstance(s, Socket):
            raise TypeError(f"device() takes nanopy sockets, not {type(s).__name__}")
        if not s.raw:
            raise ValueError(
                f"device() needs raw sockets: create {s.name!r} with nanopy.Socket({s.protocol!r}, raw=True)"
            )
    ca, cb = a._core, b._core
    if ca.protocol_id != cb.peer_id or cb.protocol_id != ca.peer_id:
        raise ValueError(
            f"device(): {ca.name} and {cb.name} sockets cannot be joined; use peers "
            f"(e.g. raw rep with raw req, raw bus with raw bus)"
        )
    if a is b:
        pumps = [(a, a)]
    else:
        pumps = []
        if ca.receives and cb.sends:
            pumps.append((a, b))
        if cb.receives and ca.sends:
            pumps.append((b, a))
    problem = _frames_lost(pumps)
    if problem:
        raise ProtocolError(f"device(): {problem}")
    return pumps


def _is_zmtp(url: str) -> bool:
    return carries_multipart(url)


def _frames_lost(pumps: list[tuple[Socket, Socket]], adding: tuple[Socket, str] | None = None) -> str:
    """Why a pump would meet multipart messages it cannot send ('' if none would),
    counting ``adding`` (a socket and the URL it is about to bind or connect)."""

    def urls(sock: Socket) -> list[str]:
        found = [ep.url for ep in sock._host.endpoints]
        if adding is not None and adding[0] is sock:
            found.append(adding[1])
        return found

    for src, dst in pumps:
        zmtp_in = next((u for u in urls(src) if _is_zmtp(u)), None)
        sp_out = next((u for u in urls(dst) if not _is_zmtp(u)), None)
        if zmtp_in is not None and sp_out is not None:
            return (
                f"{src.name!r} receives ZeroMQ multipart messages on {zmtp_in} and {dst.name!r} "
                f"would forward them to {sp_out}, an SP pipe that carries one frame per message "
                "(frames would be lost); give the device zmtp+ endpoints on both sides, or SP "
                "endpoints only"
            )
    return ""


class _EndpointGuard:
    """While a device runs, refuses a bind/connect of its sockets that would make
    a pump lose frames (see the module docstring)."""

    def __init__(self, pumps: list[tuple[Socket, Socket]]) -> None:
        self.pumps = pumps
        self.sockets = list({id(s): s for pair in pumps for s in pair}.values())

    def check(self, sock: Socket, url: str) -> None:
        problem = _frames_lost(self.pumps, (sock, url))
        if problem:
            raise AddressError(f"{url} would break a running device: {problem}")

    def __enter__(self) -> None:
        for sock in self.sockets:
            sock._host.endpoint_checks = (*sock._host.endpoint_checks, self.check)

    def __exit__(self, *exc: object) -> None:
        for sock in self.sockets:
            sock._host.endpoint_checks = tuple(c for c in sock._host.endpoint_checks if c != self.check)


async def _pump(src: Socket, dst: Socket) -> None:
    """Forward src -> dst until either socket closes."""
    try:
        while True:
            msg = await src.arecv_msg(timeout=None)
            await dst.asend_msg(msg, timeout=None)
    except Closed:
        return


async def _watch(sock: Socket) -> None:
    """Return once ``sock`` closes."""
    try:
        await sock._await_closed()
    except Closed:
        return


def _parts(pumps: list[tuple[Socket, Socket]]) -> list[tuple[Any, ...]]:
    """The device's tasks as (async function, args...): its pumps and a close watcher per socket."""
    sockets = {id(s): s for pair in pumps for s in pair}
    return [(_pump, src, dst) for src, dst in pumps] + [(_watch, s) for s in sockets.values()]


async def _run_trio(pumps: list[tuple[Socket, Socket]]) -> None:
    async with trio.open_nursery() as nursery:

        async def one(fn: Any, *args: Any) -> None:
            await fn(*args)
            nursery.cancel_scope.cancel()  # one side closed: the device is over

        for part in _parts(pumps):
            nursery.start_soon(one, *part)


async def _run_asyncio(pumps: list[tuple[Socket, Socket]]) -> None:
    import asyncio

    tasks = [asyncio.ensure_future(fn(*args)) for fn, *args in _parts(pumps)]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()  # re-raise an unexpected error
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def adevice(a: Socket, b: Socket) -> None:
    """Forward between raw sockets ``a`` and ``b`` in the current trio or asyncio loop.

    Returns within moments of either socket closing, whichever direction is
    blocked. Pass the same socket twice for a one-socket
    device (e.g. a raw BUS relaying between its own peers).

    Args:
        a: a raw socket.
        b: a raw socket of the peer protocol (or ``a`` itself).

    Raises:
        ValueError: a socket is not raw, or the two protocols are not peers.
        ProtocolError: a pump would take multipart messages from a ``zmtp+``
            endpoint to an SP endpoint (see the module docstring).
    """
    pumps = _check(a, b)
    import sniffio

    with _EndpointGuard(pumps):
        if sniffio.current_async_library() == "trio":
            await _run_trio(pumps)
        else:
            await _run_asyncio(pumps)


def device(a: Socket, b: Socket) -> None:
    """Forward between raw sockets ``a`` and ``b``, blocking until either closes.

    Args:
        a: a raw socket.
        b: a raw socket of the peer protocol (or ``a`` itself).

    Example: a tcp front end for REP servers on ipc::

        front = nanopy.Socket("rep", raw=True, bind="tcp://0.0.0.0:5555")
        back = nanopy.Socket("req", raw=True, bind="ipc:///tmp/workers.ipc")
        nanopy.device(front, back)

    The forwarding runs in nanopy's engine loop; the calling thread only waits
    (Ctrl-C stops the device and propagates).

    Raises:
        ValueError: a socket is not raw, or the two protocols are not peers.
        ProtocolError: a pump would take multipart messages from a ``zmtp+``
            endpoint to an SP endpoint (see the module docstring).
    """
    pumps = _check(a, b)
    engine = a._engine
    if engine.in_engine_thread():
        raise RuntimeError("device() would block the nanopy engine; use adevice() there")
    finished = threading.Event()
    scope = trio.CancelScope()
    failure: list[BaseException] = []

    async def runner() -> None:
        try:
            with scope:
                await _run_trio(pumps)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            failure.append(exc)
        finally:
            finished.set()

    with _EndpointGuard(pumps):
        engine.spawn(runner)
        try:
            finished.wait()
        except BaseException:
            engine.call_soon(scope.cancel)
            raise
    if failure:
        raise failure[0]


__all__ = ["adevice", "device"]
