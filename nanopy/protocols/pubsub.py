"""PUB/SUB (pubsub v0): no header; PUB sends everything, each SUB filters locally.

Theory of operation:

* **PUB** copies every message to every pipe that has send credit (nanomsg
  ``dist``). By default (``overflow="drop"``) it never blocks: a pipe without credit
  -- its peer reads too slowly and its queue is full -- misses that message, and
  the miss is counted in ``dropped`` (``stats().messages_dropped``). With no
  pipe at all the message goes nowhere, silently, as in nanomsg and NNG.
  Anything a SUB sends to a PUB is discarded (NNG does the same).
* **SUB** never sends: subscriptions are local and never reach the wire. Each
  received message is matched against a :class:`~nanopy.core.radix.RadixTree` of
  topics (a message is kept if any topic is a prefix of it; ``b""`` keeps all;
  no topic keeps nothing) and queued per pipe, served by receive priority.
* **A SUB that is not read never slows anyone down.** Its queue for a pipe
  holds ``recv_buffer`` messages; when a new message arrives on a full queue the
  *oldest* one is discarded (counted in the SUB's ``dropped``) and reading goes
  on. This is NNG's default (``NNG_OPT_SUB_PREFNEW``): a subscriber that catches
  up sees current data, not a backlog. Should the network itself be the
  bottleneck, the PUB's per-pipe credit runs out and the PUB drops for that pipe
  only -- other subscribers are unaffected either way.
* **Lossless, opt-in: ``overflow="block"``.** On a SUB, a pipe whose queue is
  full stops being read (as PULL does), so the transport pushes back on that
  publisher. On a PUB, ``send`` raises WouldBlock -- the socket waits, up to
  ``send_timeout`` -- until *every* subscriber pipe has credit, then sends to
  all: nothing is skipped, and the slowest subscriber sets the pace (one that
  stops reading stalls the publisher). Set it on both sides for an end-to-end
  lossless local pipeline. ``overflow="drop-newest"`` (SUB) keeps the queued
  messages and discards the arriving ones instead (NNG without PREFNEW).
  The option is read on every call, so it may change at any time.
* **Raw SUB** delivers every message unfiltered and has no subscribe/unsubscribe
  (as NNG's raw SUB): a device forwarding a feed must not lose topics that the
  subscribers behind it filter for themselves. Raw PUB is the same as cooked PUB.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ..core.base import TRANSMIT, BodyQueuing, Distributing, FairQueue, PipeInfo
from ..core.drops import NO_PEER, QUEUE_FULL, UNSUBSCRIBED
from ..core.errors import ProtocolError, WouldBlock
from ..core.message import Message
from ..core.radix import RadixTree


class Pub0(Distributing):
    """PUB: best-effort fan-out to every subscriber pipe (or lossless: overflow="block")."""

    protocol_id = 0x20
    peer_id = 0x21
    name = "pub"
    peer_name = "sub"
    receives = False
    overflow_modes = ("drop", "block")

    #: pipe_credit only records credit (the driver may fold returned credit lazily)
    credit_only = True

    def __init__(self, options: Any, raw: bool = False) -> None:
        super().__init__(options, raw)
        self._starved = 0  # pipes with no credit left: "block" waits while there are any

    def add_pipe(self, pipe: PipeInfo, credit: int) -> None:
        super().add_pipe(pipe, credit)
        if credit <= 0:
            self._starved += 1

    def withdraw_pipe(self, pid: int, pending: bool = False) -> None:
        if self._credit.get(pid, 1) <= 0:
            self._starved -= 1  # ("block" waits for live subscribers only)
        super().withdraw_pipe(pid, pending)

    def remove_pipe(self, pid: int) -> None:
        if self._credit.get(pid, 1) <= 0:
            self._starved -= 1
        super().remove_pipe(pid)

    def pipe_credit(self, pid: int, n: int) -> None:
        c = self._credit.get(pid)
        if c is not None:
            self._credit[pid] = c + n
            if c <= 0 < c + n:
                self._starved -= 1

    send_lane = True  # (one subscriber: a send spends one credit of its pipe, or drops)
    fan_lane = True  # (every subscriber with credit gets every message)

    def take_all(self, limit: int, least: int) -> tuple[list[int], int] | None:
        credit = self._credit
        if not credit:
            return None
        n = min(min(credit.values()), limit)
        if n < least:
            return None
        for pid, c in credit.items():
            credit[pid] = c - n
            if c == n:
                self._starved += 1
        return list(credit), n

    def take_sole(self, limit: int) -> tuple[int, int] | None:
        grant = self.take_all(limit, 1) if len(self._credit) == 1 else None
        return None if grant is None else (grant[0][0], grant[1])

    def messages_received(self, pid: int, payloads: list[bytes]) -> bool:
        return True  # a SUB has nothing to say; ignore it and keep reading

    def send(self, body: bytes, header: bytes = b"") -> None:
        # Distributing.distribute without a skip, inlined: PUB's hot path.
        if self._starved and self.options.overflow == "block":
            raise WouldBlock  # some subscriber pipe is full: wait until all have room
        credit = self._credit
        if not credit:
            self.drops[NO_PEER] += 1  # (no subscriber: counted, still silent to the sender)
            return
        append = self.actions.append
        for pid, c in credit.items():
            if c > 0:
                credit[pid] = c - 1
                append((TRANSMIT, pid, body))
                if c == 1:
                    self._starved += 1
            else:
                self.drops[QUEUE_FULL] += 1
                self.pipes[pid].dropped += 1

    def can_send(self) -> bool:
        return not self._starved or self.options.overflow != "block"

    def recv(self) -> Message:
        raise ProtocolError("PUB sockets cannot receive; use a SUB socket")


class _OverflowQueue(FairQueue):
    """A fair queue applying the ``overflow`` option when a pipe's queue is full.

    "drop": keep reading, discard the oldest queued messages (never pauses);
    "drop-newest": keep reading, discard what arrives; "block": pause the pipe
    (plain FairQueue back-pressure). Discards are counted in ``dropped`` (the
    SUB moves them to its ``queue_full`` drops after each push).
    """

    __slots__ = ("dropped",)

    def __init__(self, actions: list[Any], options: Any) -> None:
        super().__init__(actions, options)
        self.dropped = 0

    def overfilled(self, pid: int, q: deque[Any], arrived: int) -> bool:
        mode = self._options.overflow
        if mode == "block":
            return super().overfilled(pid, q, arrived)
        if not arrived:
            return True  # nothing arrived: nothing to discard
        limit = max(self._options.recv_buffer - self.in_run(pid), 0)  # (the run counts too)
        excess = len(q) - limit
        if mode == "drop-newest":
            excess = min(excess, arrived)  # what was queued before stays
            discard = q.pop
        else:
            discard = q.popleft
        if excess > 0:
            self.dropped += excess
            for _ in range(excess):
                discard()
            if not q:
                self.ready.deactivate(pid)
        return True


class Sub0(BodyQueuing):
    """SUB: receive the messages whose body starts with a subscribed topic."""

    protocol_id = 0x21
    peer_id = 0x20
    name = "sub"
    peer_name = "pub"
    sends = False
    queue_class = _OverflowQueue
    _fq: _OverflowQueue
    overflow_modes = ("drop", "drop-newest", "block")

    def __init__(self, options: Any, raw: bool = False) -> None:
        super().__init__(options, raw)
        self.topics = RadixTree()
        # Every message is kept (raw, or subscribed to b""): no tree walk per
        # message. Kept current by subscribe/unsubscribe.
        self._keep_all = raw

    def messages_received(self, pid: int, payloads: list[bytes]) -> bool:
        # Queue bare payloads; a Message is built only if the user asks for one.
        if self._keep_all:
            msgs = payloads
        else:
            msgs = list(filter(self.topics.match, payloads)) if self.topics else []  # (none: nothing kept)
            if len(msgs) != len(payloads):
                self.count_drop(UNSUBSCRIBED, len(payloads) - len(msgs), pid)
        fq = self._fq
        keep = fq.push(pid, msgs)
        if fq.dropped:
            self.count_drop(QUEUE_FULL, fq.dropped, pid)
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
        self._keep_all = b"" in self.topics

    def unsubscribe(self, topic: bytes) -> None:
        """Remove one subscription to ``topic``; messages already queued stay queued."""
        self._check_cooked("unsubscribe")
        try:
            self.topics.remove(topic)
        except KeyError:
            raise ValueError(f"unsubscribe({topic!r}): this SUB socket is not subscribed to that topic") from None
        self._keep_all = b"" in self.topics

    def _check_cooked(self, what: str) -> None:
        if self.raw:
            raise ProtocolError(f"raw SUB sockets receive every message; {what}() is not available")

