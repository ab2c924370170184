"""PUB/SUB (pubsub v0): no header; PUB sends everything, each SUB filters locally.

Theory of operation:

* **PUB** copies every message to every pipe that has send credit (nanomsg
  ``dist``). It never blocks and never raises WouldBlock: a pipe without credit
  -- its peer reads too slowly and its queue is full -- misses that message, and
  the miss is counted in ``dropped`` (``stats().messages_dropped``). With no
  pipe at all the message goes nowhere, silently, as in nanomsg and NNG.
  Anything a SUB sends to a PUB is discarded (NNG does the same).
* **SUB** never sends: subscriptions are local and never reach the wire. Each
  received message is matched against a :class:`~nanopy._radix.RadixTree` of
  topics (a message is kept if any topic is a prefix of it; ``b""`` keeps all;
  no topic keeps nothing) and queued per pipe, served by receive priority.
* **A SUB that is not read never slows anyone down.** Its queue for a pipe
  holds ``recv_buffer`` messages; when a new message arrives on a full queue the
  *oldest* one is discarded (counted in the SUB's ``dropped``) and reading goes
  on. This is NNG's default (``NNG_OPT_SUB_PREFNEW``): a subscriber that catches
  up sees current data, not a backlog. Should the network itself be the
  bottleneck, the PUB's per-pipe credit runs out and the PUB drops for that pipe
  only -- other subscribers are unaffected either way.
* **Raw SUB** delivers every message unfiltered and has no subscribe/unsubscribe
  (as NNG's raw SUB): a device forwarding a feed must not lose topics that the
  subscribers behind it filter for themselves. Raw PUB is the same as cooked PUB.
"""

from __future__ import annotations

from typing import Any

from .._core import TRANSMIT, BodyQueuing, Distributing, FairQueue
from .._errors import ProtocolError
from .._message import Message
from .._radix import RadixTree


class Pub0(Distributing):
    """PUB: best-effort fan-out to every subscriber pipe."""

    protocol_id = 0x20
    peer_id = 0x21
    name = "pub"
    peer_name = "sub"
    receives = False

    def messages_received(self, pid: int, payloads: list[bytes]) -> bool:
        return True  # a SUB has nothing to say; ignore it and keep reading

    def send(self, body: bytes, header: bytes = b"") -> None:
        # Distributing.distribute without a skip, inlined: PUB's hot path.
        credit = self._credit
        append = self.actions.append
        for pid, c in credit.items():
            if c > 0:
                credit[pid] = c - 1
                append((TRANSMIT, pid, body))
            else:
                self.dropped += 1

    def recv(self) -> Message:
        raise ProtocolError("PUB sockets cannot receive; use a SUB socket")


class _LatestQueue(FairQueue):
    """A fair queue that never pauses a pipe: a full queue drops its oldest message."""

    __slots__ = ("dropped",)

    def __init__(self, actions: list[Any], options: Any) -> None:
        super().__init__(actions, options)
        self.dropped = 0

    def push(self, pid: int, msgs: list[bytes]) -> bool:
        q = self._queues.get(pid)
        priority = self._priority.get(pid)
        if q is None or priority is None:  # unknown or departed pipe
            return False
        if msgs:
            q.extend(msgs)
            excess = len(q) - self._options.recv_buffer
            if excess > 0:
                self.dropped += excess
                for _ in range(excess):
                    q.popleft()
            self._ready.activate(pid, priority)
        return True


class Sub0(BodyQueuing):
    """SUB: receive the messages whose body starts with a subscribed topic."""

    protocol_id = 0x21
    peer_id = 0x20
    name = "sub"
    peer_name = "pub"
    sends = False
    queue_class = _LatestQueue
    _fq: _LatestQueue

    def __init__(self, options: Any, raw: bool = False) -> None:
        super().__init__(options, raw)
        self.topics = RadixTree()

    def messages_received(self, pid: int, payloads: list[bytes]) -> bool:
        # Queue bare payloads; a Message is built only if the user asks for one.
        if self.raw:
            msgs = payloads
        else:
            msgs = list(filter(self.topics.match, payloads))
        fq = self._fq
        keep = fq.push(pid, msgs)
        if fq.dropped:
            self.dropped += fq.dropped
            fq.dropped = 0
        return keep

    # recv / recv_body: BodyQueuing (a gone PUB's messages stay readable)

    def send(self, body: bytes, header: bytes = b"") -> None:
        raise ProtocolError("SUB sockets cannot send; use a PUB socket")

    # -- subscriptions (Socket.subscribe/unsubscribe call these under the lock) --------
    def subscribe(self, topic: bytes) -> None:
        """Add one subscription to ``topic`` (``b""`` matches every message)."""
        self._check_cooked("subscribe")
        self.topics.add(topic)

    def unsubscribe(self, topic: bytes) -> None:
        """Remove one subscription to ``topic``; messages already queued stay queued."""
        self._check_cooked("unsubscribe")
        try:
            self.topics.remove(topic)
        except KeyError:
            raise ValueError(f"unsubscribe({topic!r}): this SUB socket is not subscribed to that topic") from None

    def _check_cooked(self, what: str) -> None:
        if self.raw:
            raise ProtocolError(f"raw SUB sockets receive every message; {what}() is not available")

