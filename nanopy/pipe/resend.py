"""A pipe's messages its peer never acknowledged: sent again, or counted lost.

:class:`Resend` is a part of :class:`~nanopy.pipe.driver.PipeDriver`, reached as
``pipe.resend``. The pipe's writer keeps its :class:`~nanopy.pipe.sent_log.SentLog`
(``PipeDriver.sent_log``, made for TCP pipes of PUSH and raw REQ by
``sent_log_for``: the writer is its only writer); :class:`Resend` owns what becomes
of the unacknowledged messages when the pipe ends (``take_unacked``, ``settle``,
``due``, the counts ``resent_late``, ``lost_messages``, ``unacked``) and the notes a
failed write leaves in the log (``note_failed_write``). It sees its pipe only as a
:class:`ResendOwner`.

When the pipe ends while its socket stays open, the kernel's unacknowledged
byte count (nanopy.platform's ``unacked_bytes``: SIOCOUTQ on Linux) names the
messages the peer may not have: with ``resend_unacked`` they go back to the
socket ahead of what the pipe never wrote (nanopy/driver/endings.py: at once, or
at the pipe's removal if a write was under way); without it they are counted
(``lost_messages``: ``stats().lost_unacked_messages`` and ``dead_pipe`` drops),
measured as the pipe's tasks stop, when the kernel has had the longest to hear
the peer's last acknowledgements.

May call: the connection's kernel socket (``kernel_unacked``), nanopy.platform
(``unacked_bytes``, ``send_buffer_ceiling``); nothing of the socket. Where the
platform cannot count unacknowledged bytes no log is kept (``sent_log_for``).
"""

from __future__ import annotations

import socket
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from .. import platform
from ..transports._base import ChannelConnection, CountsUnwritten, KernelSocketBacked
from ..transports._stream import unacked_bytes
from .liveness import kernel_unacked
from .outbox import WRITE_CHUNK_BYTES
from .sent_log import SentLog, frame_sizes

if TYPE_CHECKING:
    from ..transports._base import Connection

#: Linux's usual send buffer ceiling (net.ipv4.tcp_wmem), where the platform does not say
DEFAULT_WMEM_MAX = 4 << 20


class ResendOwner(Protocol):
    """What :class:`Resend` reads of its pipe (``PipeDriver``)."""

    @property
    def conn(self) -> Connection:
        """The pipe's connection (its kernel socket counts what is unacknowledged)."""
        ...

    @property
    def channel(self) -> Any:
        """The pipe's channel (it frames a payload, to size it)."""
        ...

    @property
    def frame_prefix(self) -> int:
        """The framing's bytes per payload (-1: not fixed)."""
        ...

    @property
    def sent_log(self) -> SentLog | None:
        """The pipe's recent writes (None: not kept)."""
        ...

    @property
    def withdrawn(self) -> bool:
        """The socket took the pipe out of its load balancing."""
        ...


class Resend:
    """What becomes of a :class:`~nanopy.pipe.driver.PipeDriver`'s unacknowledged
    messages (see the module docstring)."""

    def __init__(self, owner: ResendOwner) -> None:
        self.owner = owner
        #: the log was spent (taken to send again, or counted lost): it settles nothing more
        self.spent = False
        #: the socket resends this pipe's unacknowledged messages once its write under
        #: way ends (``mark_due``: the pipe lock held, by the round that withdrew it)
        self.due = False
        #: messages taken by ``settle`` to be sent again at the pipe's removal
        self.resent_late = 0
        #: messages lost unacknowledged (resend_unacked off), counted at removal
        self.lost_messages = 0
        #: the unacknowledged messages were sent again: the kernel's bytes are no loss
        self.unacked_resent = False
        #: bytes the kernel held unacknowledged as the pipe's tasks stopped (None: unknown)
        self.unacked: int | None = None

    def mark_due(self) -> None:
        """The socket withdrew the pipe during a write (pipe lock held): resend its
        unacknowledged messages once that write ends (``settle``)."""
        self.due = True

    def take_unacked_now(self) -> list[bytes]:
        """``take_unacked`` as the kernel counts now (the pipe lock held, no write
        under way): its count only falls as acknowledgements come, so this may
        send again a message the peer has (counted as possibly twice)."""
        return self.take_unacked(kernel_unacked(self.owner.conn))

    def take_unacked(self, unacked: int | None) -> list[bytes]:
        """The messages the peer's kernel has not acknowledged, oldest first, to
        send again; the log is spent (the pipe writes no more)."""
        owner = self.owner
        log = owner.sent_log
        if log is None or self.spent:
            return []
        self.spent = True
        self.unacked_resent = True
        return log.unacked(unacked, frame_sizes(owner.channel, owner.frame_prefix))

    def settle(self, orphans: list[bytes], unacked: int | None) -> list[bytes]:
        """As the pipe's tasks stop (its unwritten ``orphans`` taken, ``unacked``
        read; the pipe lock held): the payloads to hand back, in order. A resend due
        waits no more; otherwise what the kernel held is counted lost -- if the pipe
        ended while its socket stays open (a closing socket's kernel still delivers it)."""
        self.unacked = unacked
        if self.due:
            resend = self.take_unacked(unacked)
            self.resent_late = len(resend)
            return resend + orphans
        owner = self.owner
        log = owner.sent_log
        if log is not None and not self.spent and owner.withdrawn:
            self.spent = True
            self.lost_messages = len(log.unacked(unacked, frame_sizes(owner.channel, owner.frame_prefix)))
        return orphans

    def note_failed_write(self, piece: Any, batch: list[bytes] | None) -> None:
        """A write of ``piece`` (a chunk of ``batch``, or a chunk's rest or a control
        frame when ``batch`` is None) failed: what the kernel took of it, where the
        channel knows; otherwise all of it, in doubt."""
        log = self.owner.sent_log
        if log is None or piece is None:
            return
        n = len(piece)
        channel = self.owner.channel
        left = channel.unwritten_bytes() if isinstance(channel, CountsUnwritten) else None
        taken = n if left is None else n - int(left)
        if batch is None:
            log.advance(taken)
        else:
            log.wrote(batch, n, taken)
        if left is None:
            log.doubt(n)


def sent_log_for(conn: Any) -> SentLog | None:
    """A log for a connection whose kernel counts what its peer has not acknowledged:
    a channel over a TCP socket (tcp, tls+tcp, ws, wss, zmtp+tcp). None for the
    others: over ipc and inproc a message the channel took is already in the
    peer's receive queue, so nothing is ever unacknowledged; a plug-in without a
    kernel socket cannot say."""
    if not isinstance(conn, ChannelConnection) or not isinstance(conn, KernelSocketBacked):
        return None
    sock = conn.kernel_socket()
    if getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6):
        return None
    if unacked_bytes(sock) is None:
        return None  # (the platform cannot count them: see Capabilities.unacked_bytes)
    try:
        sndbuf = int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
    except (OSError, AttributeError):
        sndbuf = 0
    limit = max(sndbuf, _wmem_max()) + 2 * WRITE_CHUNK_BYTES
    return SentLog(partial(unacked_bytes, sock), limit, conn.unacked_slack)


_wmem: list[int] = []


def _wmem_max() -> int:
    """The largest send buffer the kernel's autotuning grows a TCP socket to (read once)."""
    if not _wmem:
        ceiling = platform.send_buffer_ceiling()
        _wmem.append(DEFAULT_WMEM_MAX if ceiling is None else ceiling)
    return _wmem[0]
