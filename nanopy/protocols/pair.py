"""PAIR v0: exactly one peer, no header.

Theory of operation: the first pipe is *the* peer; any further pipe is refused by
closing it (as nanomsg's ``excl`` and NNG's pair0 do) while the first one lives.
Sending needs credit on that pipe; received messages queue per pipe.
"""

from __future__ import annotations

from ..core.base import BodyQueuing, LoadBalancing
from ._common import SinglePeer


class Pair0(SinglePeer, LoadBalancing, BodyQueuing):
    protocol_id = 0x10
    peer_id = 0x10
    name = "pair"
    peer_name = "pair"

    # SinglePeer: one peer, the rest closed. LoadBalancing.send: the body, on the
    # peer's pipe, WouldBlock without credit. BodyQueuing: payloads queued as they
    # came (only the peer's pipe has a queue); the old peer's stay readable.
