"""Snapshots for ``Socket.stats()``, ``Socket.pipes()`` and ``Pipe.stats()``.

They read counters the driver and the pipes keep per round, per write and per
read (never per message): taking a snapshot costs a few lock rounds, and
nothing is counted for it on the hot paths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.message import Pipe
from ..core.stats import PipeStats, SocketStats

if TYPE_CHECKING:
    from ..pipe.driver import PipeDriver
    from .socket import Socket


class PipeList(list[Pipe]):
    """The live pipes of a socket (``sock.pipes``); call it for a snapshot of each.

    ``sock.pipes`` stays the list of :class:`Pipe` objects it always was;
    ``sock.pipes()`` returns one :class:`PipeStats` per pipe.
    """

    def __call__(self) -> list[PipeStats]:
        """One snapshot per live pipe.

        Returns:
            A :class:`PipeStats` for each pipe in this list, in order.
        """
        return [pipe.stats() for pipe in self]


def _traffic(sent: tuple[int, int], received: tuple[int, int]) -> dict[str, int]:
    """The traffic fields both snapshots carry, from (messages, bytes) pairs."""
    return {
        "messages_sent": sent[0],
        "messages_received": received[0],
        "bytes_sent": sent[1],
        "bytes_received": received[1],
    }


def pipe_stats(driver: PipeDriver) -> PipeStats:
    """The snapshot of one pipe (its driver keeps the counts; the core its queue and drops)."""
    pipe = driver.pipe
    ep = pipe.endpoint
    dropped, queued_in, rx_msgs, rx_bytes = driver.sock.pipe_view(driver)
    received = rx_msgs, rx_bytes
    sent = driver.sent_counts()
    url = str(getattr(ep, "url", ""))
    return PipeStats(
        id=pipe.id,
        remote_address=pipe.remote_address,
        transport=url.partition("://")[0],
        url=url,
        dialed=bool(getattr(ep, "dialer", False)),
        priority=int(getattr(ep, "priority", 8)),
        recv_priority=int(getattr(ep, "recv_priority", 8)),
        queued_out=0 if driver.closed else driver.queued_out(),
        queued_in=queued_in,
        **_traffic(sent, received),
        dropped=dropped,
        connected_since=pipe.connected_at,
    )


def socket_stats(sock: Socket) -> SocketStats:
    """The snapshot of one socket's counters."""
    driver = sock._driver
    counts = sock._host.counts
    received = driver.received_counts()
    sent = driver.sent_counts()
    with driver.lock:
        core = driver.core
        drops = dict(core.drops)
        queued_in = core.queued()
        protocol_errors = core.protocol_errors
        pipes = len(driver.pipes)
    dropped = sum(drops.values())
    return SocketStats(
        **_traffic(sent, received),
        messages_dropped=dropped,
        pipes=pipes,
        connects=counts.connects,
        disconnects=counts.disconnects,
        reconnect_attempts=counts.reconnects,
        protocol_errors=counts.protocol_errors + protocol_errors,
        messages_too_large=counts.too_large,
        dropped=dropped,
        drops=drops,
        queued_in=queued_in,
        queued_out=driver.queued_out(),
        messages_requeued=driver.requeued,
        messages_resent=driver.resent,
        **counts.losses.as_dict(),
        dial_failures=counts.dial_failures,
        handshake_failures=counts.handshake_failures,
        auth_failures=counts.auth_failures,
        reconnects=counts.reconnected,
    )


Pipe._snapshot = pipe_stats  # (the user-visible Pipe is a core value type: see its docstring)
