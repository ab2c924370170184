"""Why a message was dropped: the one name per reason ``stats().drops`` counts.

Every place nanopy discards a message counts it under exactly one of these
reasons, so ``stats().dropped == sum(stats().drops.values())`` always holds and
an operator can tell a slow subscriber from a dead peer. Cores count with
``Core.count_drop`` (or inline on a hot path); the engine side counts with
``SocketDriver.count_drop``. docs/metrics.md has the table for users.
"""

from __future__ import annotations

#: a pipe's queue was full: PUB skipped a subscriber, BUS or SURVEYOR a peer, a
#: SUB's overflow mode discarded the oldest (or the arriving) message, a reply
#: found its requester's queue full, a SURVEYOR held ``recv_buffer`` answers already
QUEUE_FULL = "queue_full"
#: sent with nobody to send it to (PUB, BUS, SURVEYOR with no pipe)
NO_PEER = "no_peer"
#: larger than ``recv_max_size`` (its pipe was closed)
TOO_LARGE = "too_large"
#: crossed more devices than ``max_ttl`` (a loop guard: REP, RESPONDENT, PAIR1)
TTL_EXCEEDED = "ttl_exceeded"
#: a reply whose requester's pipe is gone
UNROUTABLE = "unroutable"
#: a SUB's message that matched none of its subscriptions
UNSUBSCRIBED = "unsubscribed"
#: lost with a pipe found dead: handed to it but not written, or in flight
DEAD_PIPE = "dead_pipe"
#: a reply or survey answer nobody waits for any more: its request was cancelled,
#: timed out or already answered, its survey passed its deadline or was replaced
CANCELLED = "cancelled"
#: from a peer that broke the protocol (a malformed header, data sent to PUSH):
#: discarded with the rest of what it sent, and its pipe closed
PROTOCOL_ERROR = "protocol_error"
#: a ZeroMQ message without the envelope its socket type needs (a REQ's reply or a
#: REP's request without the empty delimiter frame): discarded as libzmq discards
#: it, and the pipe goes on
MALFORMED = "malformed"

#: every reason, in the order tables list them
DROP_REASONS: tuple[str, ...] = (
    QUEUE_FULL, NO_PEER, TOO_LARGE, TTL_EXCEEDED, UNROUTABLE, UNSUBSCRIBED, DEAD_PIPE, CANCELLED, PROTOCOL_ERROR,
    MALFORMED,
)


def new_drop_counts() -> dict[str, int]:
    """A count of zero for every reason (a dict whose keys never change)."""
    return dict.fromkeys(DROP_REASONS, 0)
