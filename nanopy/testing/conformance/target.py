"""What the kit checks (a :class:`Target`) and how one rule runs (a :class:`Check`).

Every wait is bounded: a step gets ``timeout`` seconds (``Check.within``), what
must be prompt (a cancellation, a close) gets :data:`PROMPT`; a step that runs out
fails the rule it belongs to, naming what did not finish.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn

import trio

from ... import protocols
from ...transports import Connection, Listener, PipeContext, Transport
from .rules import ConformanceError, NotApplicable, Rule

#: seconds a cancelled call or a close may take (ws and TLS say goodbye within 0.5 s each)
PROMPT = 2.0
#: seconds a cleanup close may take before the kit abandons it
CLEANUP = 2.0

_FILE_SCHEMES = {"ipc", "zmtp+ipc"}  # an address is a file path
_PATH_SCHEMES = {"ws", "wss"}  # host:port plus a resource path
_counter = iter(range(1 << 62))


def local_url(scheme: str, tag: str = "t") -> str:
    """A fresh address to bind for ``scheme`` on this host only.

    ``ipc``-like schemes get a new file in the temporary directory, ``inproc`` a
    process-unique name, ``ws``/``wss`` port 0 with a path, every other scheme
    ``scheme://127.0.0.1:0`` (port 0: the bound endpoint's ``url`` has the real port).

    Args:
        scheme: a registered transport scheme.
        tag: a word put into file and inproc names (to tell tests apart).

    Returns:
        The URL.
    """
    n = next(_counter)
    if scheme in _FILE_SCHEMES:
        return f"{scheme}://{tempfile.gettempdir()}/np-{os.getpid()}-{tag}-{n}.ipc"
    if scheme == "inproc":
        return f"inproc://{tag}-{os.getpid()}-{n}"
    if scheme in _PATH_SCHEMES:
        return f"{scheme}://127.0.0.1:0/{tag}"
    return f"{scheme}://127.0.0.1:0"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a process that needs a
    fixed port before it starts; prefer binding port 0 where the code allows)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, what: str = "the condition") -> None:
    """Poll ``predicate`` until it is true; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout:g} s")
        time.sleep(0.005)


@dataclass
class Target:
    """The transport under check and how to reach it.

    Attributes:
        scheme: the registered scheme.
        transport: its :class:`Transport`.
        url: the first address each step binds (``Check.new_url``).
        bind_options, connect_options: endpoint options (an ``ssl_context``...).
        timeout: seconds one step may take.
        buffer_limit: bytes a transport may take for a peer that reads nothing
            before the kit calls it unbounded (rule T10).
        fixed_url: ``url`` was given: each step binds it first (a second listener
            of the same step gets a fresh :func:`local_url`).
    """

    scheme: str
    transport: Transport
    url: str
    bind_options: dict[str, Any]
    connect_options: dict[str, Any]
    timeout: float
    buffer_limit: int
    fixed_url: bool = False
    _block: bytes = field(default=b"", repr=False)

    def context(self, *, dialer: bool, protocol: str = "pair", recv_max_size: int = 1 << 20,
                **options: Any) -> PipeContext:
        """A :class:`PipeContext` as a ``protocol`` socket would give (dead-peer
        detection off unless ``options`` turn it on)."""
        core = protocols.get(protocol)
        endpoint = self.connect_options if dialer else self.bind_options
        return PipeContext(
            protocol_id=core.protocol_id, peer_id=core.peer_id,
            protocol_name=core.name, peer_name=core.peer_name,
            recv_max_size=recv_max_size, handshake_timeout=self.timeout,
            options={"tcp_nodelay": True, "dead_peer_timeout": None, "connect_timeout": self.timeout,
                     **endpoint, **options},
        )

    def block(self) -> bytes:
        """1 MiB of random bytes (made once): payloads no transport can compress."""
        if not self._block:
            self._block = os.urandom(1 << 20)
        return self._block

    def payload(self, index: int, size: int) -> bytes:
        """A ``size``-byte payload that starts with ``index`` (payloads tell apart)."""
        head = index.to_bytes(4, "big")
        if size <= 4:
            return head[:size]
        block = self.block()
        body = (block * (size // len(block) + 1))[: size - 4] if size - 4 > len(block) else block[: size - 4]
        return head + body


class Check:
    """One rule being checked on one target: its failures, bounds and cleanups."""

    def __init__(self, target: Target, rule: Rule) -> None:
        self.target = target
        self.rule = rule
        self.timeout = target.timeout
        self._closing: list[Connection | Listener] = []
        self._fixed_left = target.fixed_url

    def new_url(self, tag: str = "kit") -> str:
        """An address to bind: a given ``url`` for the step's first listener, else a
        fresh :func:`local_url`."""
        if self._fixed_left:
            self._fixed_left = False
            return self.target.url
        return local_url(self.target.scheme, tag)

    # -- verdicts ------------------------------------------------------------------
    def fail(self, detail: str) -> NoReturn:
        """Fail the rule."""
        raise ConformanceError(self.rule, self.target.scheme, detail)

    def expect(self, condition: object, detail: str) -> None:
        """Fail the rule with ``detail`` unless ``condition``."""
        if not condition:
            self.fail(detail)

    @staticmethod
    def skip(reason: str) -> NoReturn:
        """The rule does not apply (reported in ``Report.skipped``)."""
        raise NotApplicable(reason)

    @contextmanager
    def within(self, seconds: float, what: str) -> Iterator[None]:
        """Bound a step of a trio run; running out fails the rule naming ``what``."""
        try:
            with trio.fail_after(seconds):
                yield
        except trio.TooSlowError:
            self.fail(f"{what}: not done within {seconds:g} s")

    def wait_for(self, predicate: Callable[[], object], what: str, timeout: float | None = None) -> None:
        """Poll ``predicate`` (socket-level checks); running out fails the rule."""
        try:
            wait_for(predicate, self.timeout if timeout is None else timeout, what)
        except AssertionError as exc:
            self.fail(str(exc))

    # -- running -----------------------------------------------------------------------
    def run(self, afn: Callable[[Check], Awaitable[None]]) -> None:
        """Run ``afn(self)`` in a trio run of its own, bounded, then close what it opened."""

        async def main() -> None:
            try:
                with self.within(self.timeout * 6, "the whole check"):
                    await afn(self)
            finally:
                await self._cleanup()

        try:
            trio.run(main)
        except BaseExceptionGroup as group:
            raise _first_verdict(group) from None

    def closing(self, opened: Connection | Listener) -> None:
        """Close ``opened`` when the check ends (quietly: rule T13 judges aclose)."""
        self._closing.append(opened)

    async def _cleanup(self) -> None:
        """Close everything at once (a ws close waits for its peer's CLOSE: both ends
        closing together answer each other)."""
        opened, self._closing = self._closing, []
        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP):
            async with trio.open_nursery() as nursery:
                for each in opened:
                    nursery.start_soon(_close_quietly, each)


async def _close_quietly(opened: Connection | Listener) -> None:
    try:
        await opened.aclose()
    except Exception:  # noqa: BLE001, S110 - cleanup; T13 judges aclose itself
        pass


def _first_verdict(group: BaseExceptionGroup[Any]) -> BaseException:
    """The verdict inside a nursery's exception group (a failure before a skip
    before anything else)."""
    flat: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            flat.append(exc)

    walk(group)
    for kind in (ConformanceError, NotApplicable):
        for exc in flat:
            if isinstance(exc, kind):
                return exc
    return flat[0] if flat else group
