"""The transport plug-in interface.

A transport turns a URL into connections that carry whole SP messages. It owns
its wire details: the SP connection header (or WebSocket subprotocol), framing,
and the receive size limit. The engine owns everything else: reconnecting,
timeouts, flow control, the protocol.

To add a scheme, subclass :class:`Transport` and expose an instance through the
``nanopy.transports`` entry-point group (or call :func:`nanopy.transports.register`).
See ``docs/transports.md`` for a worked example.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PipeContext:
    """What a transport needs to know about the socket it serves.

    Attributes:
        protocol_id, peer_id: SP protocol numbers for the connection header.
        protocol_name, peer_name: protocol names (WebSocket subprotocols).
        recv_max_size: largest payload to accept (0 = unlimited); larger ->
            raise :class:`nanopy.MessageTooLarge` from ``receive``.
        options: socket and endpoint options (``tcp_nodelay``, ``ssl_context``, ...).
        handshake_timeout: seconds the engine allows ``handshake``; a transport
            that does part of the handshake before ``accept`` returns (the ws port
            server reads TLS and the upgrade request to route by path) keeps the
            whole within it.
    """

    protocol_id: int
    peer_id: int
    protocol_name: str
    peer_name: str
    recv_max_size: int = 1 << 20
    options: Mapping[str, Any] = field(default_factory=dict)
    handshake_timeout: float = 10.0


class Connection(abc.ABC):
    """One transport connection carrying SP messages (a pipe's I/O half).

    The engine calls ``handshake`` once (under ``handshake_timeout``), then runs
    one task in ``receive`` and one in ``send``; it never calls either of them
    from two tasks at once.

    Errors: raise :class:`nanopy.RemoteProtocolError` or
    :class:`nanopy.MessageTooLarge` for a misbehaving peer (the pipe is closed and
    counted in ``stats().protocol_errors``); ``EOFError`` or ``OSError`` for a
    connection that went away.
    """

    #: text form of the peer's address, for Pipe.remote_address
    remote_address: str = ""
    #: True while bytes accepted by ``try_send`` still wait to be written; the
    #: engine then calls ``send([])`` to flush them.
    has_pending: bool = False
    #: If True, messages taken by ``try_send`` are not counted as sent until the
    #: connection calls ``release_credit(n)`` (in-memory transports use this to
    #: pass the receiver's back-pressure on).
    manages_credit: bool = False
    release_credit: Callable[[int], None] = staticmethod(lambda n: None)

    async def handshake(self) -> None:
        """Complete the SP handshake (header exchange, HTTP upgrade, TLS...)."""

    @abc.abstractmethod
    async def send(self, payloads: list[bytes]) -> None:
        """Write every payload (after anything ``try_send`` left pending)."""

    @abc.abstractmethod
    async def receive(self) -> list[bytes]:
        """Return one or more complete payloads (parse as many as are buffered).

        Payloads are ``bytes`` -- exactly ``bytes``, never a ``bytearray`` or
        ``memoryview`` (the payload-type contract between transports and protocol
        cores: cores hash, slice and keep payloads). The engine converts a batch
        that breaks the contract, at a cost; built-in transports never do.
        """

    def try_send(self, payload: bytes) -> bool:
        """Optional fast path, callable from any thread while no ``send`` runs.

        Take ``payload`` without blocking and return True, or return False
        (the engine then queues it for ``send``). The default never takes.
        """
        return False

    def try_send_batch(self, payloads: list[bytes]) -> bool:
        """Optional fast path for a batch: like :meth:`try_send`, all or nothing.

        True means every payload is taken (written, or the rest left pending with
        ``has_pending`` set). The default never takes.
        """
        return False

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close the connection; idempotent; must not raise."""


class Listener(abc.ABC):
    """A bound listening endpoint."""

    #: the bound URL with wildcards resolved (e.g. the real port for port 0)
    url: str

    @abc.abstractmethod
    async def accept(self) -> Connection:
        """Wait for the next incoming connection (before its handshake)."""

    def update_context(self, ctx: PipeContext) -> None:
        """Socket options changed (e.g. ``recv_max_size``): use ``ctx`` for
        connections accepted from now on. The default keeps the bind-time context."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop listening and release the address; idempotent."""


class Transport(abc.ABC):
    """A URL scheme's factory of listeners and connections."""

    #: URL schemes this transport serves (e.g. ``("tcp",)``)
    schemes: tuple[str, ...] = ()

    def check_url(self, url: str) -> None:
        """Raise :class:`nanopy.AddressError` if ``url`` is malformed (called at once by bind/connect)."""

    def check_dial_url(self, url: str) -> None:
        """As :meth:`check_url`, for ``connect`` (e.g. a wildcard host or port 0 is bind-only)."""
        self.check_url(url)

    @abc.abstractmethod
    async def listen(self, url: str, ctx: PipeContext) -> Listener:
        """Bind ``url``; raise :class:`nanopy.AddressInUse` if it is taken."""

    @abc.abstractmethod
    async def dial(self, url: str, ctx: PipeContext) -> Connection:
        """Connect to ``url`` (before the handshake); raise ``OSError`` on failure."""
