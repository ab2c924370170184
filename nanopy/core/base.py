"""The Sans-I/O contract between protocol cores and the engine.

A protocol core is a plain object holding one socket's message-level protocol
state. It performs no I/O, reads no clock and takes no locks; the engine calls it
under the socket's lock and carries out the actions it emits.

Inputs (engine -> core):
    ``add_pipe``, ``withdraw_pipe``, ``remove_pipe``, ``requeue``, ``pipe_credit``,
    ``messages_received``, ``timer_fired``, and the user operations ``send``/``recv``
    (which raise :class:`WouldBlock` when they cannot complete now).
Queries: ``can_send()``, ``can_recv()`` -- the engine wakes waiters when they turn true.
Outputs: after *any* input the engine drains ``core.actions`` (a list of tuples):

    (TRANSMIT, pid, payload)    write ``payload`` (header + body) on pipe ``pid``;
                                costs one credit of that pipe
    (CLOSE_PIPE, pid, reason)   the peer broke the protocol (or is surplus): drop it
    (RESUME_READ, pid)          the pipe's inbound queue drained: read from it again
    (ARM_TIMER, key, delay)     call ``timer_fired(key)`` after ``delay`` seconds
    (CANCEL_TIMER, key)         forget that timer
    (READY, key)                request/survey ``key`` changed state: wake its caller
    (READY_CALLER, caller)      a classic call of ``caller`` (a thread or task, see
                                nanopy.core.callers) can go on: wake exactly that caller

Optional fast paths (each equivalent to the per-message inputs): ``send_lane`` +
``take_sole``, ``fan_lane`` + ``take_all`` (several credits taken at once, given
back with ``pipe_credit``) and ``body_queue`` (``FairQueue.take_run``: several
bodies of a sole ready pipe), used by the engine's lanes and runs.

Flow control is by credits: a pipe added with ``credit`` n may be handed n
TRANSMITs; the engine returns credits with ``pipe_credit`` as data leaves.
``messages_received`` returns False when that pipe's inbound queue is full; the
engine then stops reading it until RESUME_READ.

Reusable parts: :class:`FairQueue`, :class:`LoadBalancer` (nanopy/core/queues.py; the
actions are defined in nanopy/core/actions.py, both re-exported here), and the building-block
cores at the end of this module (:class:`LoadBalancing`, :class:`Distributing`,
:class:`FairQueuing`, :class:`BodyQueuing`) that own one side's pipe bookkeeping.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar

from .actions import (
    ARM_TIMER,
    CANCEL_TIMER,
    CLOSE_PIPE,
    READY,
    READY_CALLER,
    RESUME_READ,
    TRANSMIT,
    Action,
    ActionKind,
)
from .drops import DEAD_PIPE, NO_PEER, QUEUE_FULL, UNROUTABLE, new_drop_counts
from .errors import ProtocolError, WouldBlock
from .message import Message
from .queues import FairQueue, LoadBalancer


class PipeInfo:
    """What a core knows about one pipe."""

    __slots__ = ("dropped", "id", "recv_priority", "send_priority", "token")

    def __init__(self, pid: int, token: Any, send_priority: int, recv_priority: int) -> None:
        self.id = pid
        self.token = token  # opaque to the core: put into Message.pipe
        self.send_priority = send_priority
        self.recv_priority = recv_priority
        self.dropped = 0  # this pipe's share of the core's drops (sock.pipes())


class Core:
    """Base class of protocol cores. Subclasses set the identity attributes.

    Attributes:
        protocol_id, peer_id: SP protocol numbers (docs/wire.md section 2).
        name, peer_name: protocol names (also the WebSocket subprotocol stems).
        can_send_ok, can_recv_ok: whether the protocol sends/receives at all.
    """

    protocol_id: ClassVar[int]
    peer_id: ClassVar[int]
    name: ClassVar[str]
    peer_name: ClassVar[str]
    sends: ClassVar[bool] = True
    receives: ClassVar[bool] = True
    #: True if ``pipe_credit`` only records credit (no actions, nothing but
    #: ``can_send`` changes): the engine may then fold returned credit into the
    #: next input instead of a round of its own. None: decided from the class
    #: (the building blocks' own ``pipe_credit`` qualifies).
    credit_only: ClassVar[bool | None] = None
    #: True if a classic ``recv`` waits for something of its own caller (a REQ's
    #: reply): the core then wakes it with ``(READY_CALLER, caller)``, and the
    #: engine keys receive waiters by caller instead of waking the longest waiting.
    per_caller_recv: ClassVar[bool] = False
    #: values of the ``overflow`` option this protocol honours (PUB/SUB add more)
    overflow_modes: ClassVar[tuple[str, ...]] = ("drop",)
    #: The fair queue of bodies when a receive is a plain ordered pop with no state
    #: of its own (``recv_body`` is ``body_queue.pop``): the engine may then take
    #: several at once (:meth:`FairQueue.take_run`). None for every other core.
    body_queue: FairQueue | None = None
    #: ``messages_received(pid, payloads)`` and the pop of the body it queued, in
    #: one step, for a receiver waiting on an idle socket (``FairQueue.hand_over``):
    #: the body, or None when that would not be exactly the same (the caller then
    #: feeds the core as usual). Set only by cores whose ``messages_received`` is a
    #: plain push into ``body_queue``; None for every other core.
    hand_over: Callable[[int, list[bytes]], bytes | None] | None = None
    #: True if, with one pipe, ``send`` only spends a credit of it and transmits the
    #: body as it is: the engine may then take several credits at once
    #: (:meth:`take_sole`) and spend them on sends that skip the core.
    send_lane = False
    #: True if ``send`` sends every body to every pipe with credit and nothing
    #: else (PUB): the engine may then take the same credit of every pipe at once
    #: (:meth:`take_all`) for a burst of sends that skip the core.
    fan_lane = False
    #: True while payloads taken back from a dead pipe (``requeue``) wait for send
    #: credit: the engine then hands returned credit to the core at once.
    holding = False

    def __init__(self, options: Any, raw: bool = False) -> None:
        self.options = options
        self.raw = raw
        self.actions: list[Action] = []
        self.pipes: dict[int, PipeInfo] = {}
        self.closed = False
        # Counted by cores, reported in stats(): messages dropped, by reason
        # (nanopy.core.drops; the engine side counts into the same dict under the lock).
        self.drops = new_drop_counts()
        self.protocol_errors = 0
        # Gone pipes whose received messages are still queued (see retire_pipe).
        self._retired: list[int] = []

    @property
    def dropped(self) -> int:
        """Messages dropped for any reason (the sum of ``drops``)."""
        return sum(self.drops.values())

    @dropped.setter
    def dropped(self, value: int) -> None:
        raise AttributeError(
            f"{type(self).__name__}.dropped is the sum of drops by reason: count a drop with "
            "self.count_drop(reason, n, pid), reason one of nanopy.core.drops.DROP_REASONS"
        )

    def count_drop(self, reason: str, n: int = 1, pid: int | None = None) -> None:
        """Count ``n`` messages dropped for ``reason`` (a name of nanopy.core.drops),
        on pipe ``pid`` when they belong to one."""
        self.drops[reason] += n
        if pid is not None:
            info = self.pipes.get(pid)
            if info is not None:
                info.dropped += n

    def queued(self, pid: int | None = None) -> int:
        """Messages received and not taken yet (of pipe ``pid``, or all)."""
        return 0

    # -- pipes -----------------------------------------------------------------
    def add_pipe(self, pipe: PipeInfo, credit: int) -> None:
        self.pipes[pipe.id] = pipe

    def remove_pipe(self, pid: int) -> None:
        self.pipes.pop(pid, None)

    def retire_pipe(self, pid: int, fq: FairQueue) -> None:
        """Remove ``pid`` but keep what it already delivered to ``fq`` readable.

        A sender that writes and disconnects (close with linger, process exit)
        must not lose messages the receiver already has. The PipeInfo stays in
        ``self.pipes`` (for ``Message.pipe``) until its queue has drained.
        """
        for old in [p for p in self._retired if not fq.holds(p)]:
            self._retired.remove(old)
            self.pipes.pop(old, None)
        if fq.retire(pid):
            self._retired.append(pid)
        else:
            self.pipes.pop(pid, None)

    def pipe_credit(self, pid: int, n: int) -> None:
        """``n`` more messages may be transmitted on ``pid``."""

    def withdraw_pipe(self, pid: int, pending: bool = False) -> None:
        """Pipe ``pid`` was found dead (or is closing): transmit nothing more on it.
        ``remove_pipe`` follows once its tasks have ended. ``pending``: what it never
        wrote is not known yet (a write was under way) and comes with
        ``requeue(payloads, pid)``. The default does nothing (a TRANSMIT for the
        pipe still comes back through ``requeue``)."""

    def requeue(self, payloads: list[bytes], pid: int | None = None) -> int:
        """Payloads a dead pipe never wrote, in order: a core that may send them
        elsewhere takes them and returns how many. ``pid``: the pipe they were
        queued on (``withdraw_pipe`` came first): they go ahead of anything
        requeued without a pid -- payloads a withdrawn pipe refused later.
        The default takes none: they are lost with the pipe (as in nanomsg), and
        counted as ``dead_pipe`` drops."""
        self.count_drop(DEAD_PIPE, len(payloads))
        return 0

    def messages_received(self, pid: int, payloads: list[bytes]) -> bool:
        raise NotImplementedError

    def timer_fired(self, key: Any) -> None:
        """A timer armed with ARM_TIMER expired."""

    def take_sole(self, limit: int) -> tuple[int, int] | None:
        """Up to ``limit`` send credits of the only pipe at once (``send_lane``
        cores): ``(pid, n)``, as if ``n`` sends had each taken one; None when
        there are several pipes or no credit. ``pipe_credit`` gives them back."""
        return None

    def take_all(self, limit: int, least: int) -> tuple[list[int], int] | None:
        """``n`` credits of every pipe at once (``fan_lane`` cores), ``least <= n <=
        limit``: ``(pids, n)``, as if ``n`` sends had each gone to all of them; None
        when some pipe has fewer than ``least``. ``pipe_credit`` gives them back."""
        return None

    # -- user operations -------------------------------------------------------
    def send(self, body: bytes, header: bytes = b"") -> None:
        raise ProtocolError(f"{self.name} sockets cannot send")

    def recv(self) -> Message:
        raise ProtocolError(f"{self.name} sockets cannot receive")

    def recv_body(self) -> bytes:
        """Like :meth:`recv` but only the body (cores may skip building a Message)."""
        return self.recv().body

    def can_send(self) -> bool:
        return False

    def batch_room(self) -> int | None:
        """How many sends one batch round may hand this core before a pipe would
        drop what it could take if the sends came one by one (``Socket.send_batch``);
        None: no bound (the core raises WouldBlock when it is full)."""
        return None

    def can_recv(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True

    # -- helpers for subclasses -------------------------------------------------
    def protocol_violation(self, pid: int, reason: str) -> None:
        """Close ``pid`` for breaking the protocol (counted in stats)."""
        self.protocol_errors += 1
        self.actions.append((CLOSE_PIPE, pid, reason))


# -- building blocks for cores ---------------------------------------------------------
# Cooperative mixins that own the per-pipe bookkeeping of one side of a protocol.
# A core lists the ones it needs, send side first and a queuing one last, e.g.
# ``class Bus0(Distributing, FairQueuing)``; each add_pipe/withdraw_pipe/remove_pipe calls super()
# so all of them see every pipe. Hot paths (send, recv, messages_received,
# pipe_credit) are single methods here, never chains.


class LoadBalancing(Core):
    """Send side: each message goes to one pipe, picked by a :class:`LoadBalancer` (``_lb``).

    ``send`` transmits the body as is and raises WouldBlock with no credit anywhere;
    cores with a header override it.
    """

    #: a dead pipe's unwritten payloads go to the other pipes (``requeue``): any pipe
    #: may carry any message (PUSH, raw REQ), not replies bound to one pipe
    requeues: ClassVar[bool] = False

    def __init__(self, options: Any, raw: bool = False) -> None:
        super().__init__(options, raw)
        self._lb = LoadBalancer()
        if type(self).send is LoadBalancing.send:
            self.send_lane = True
            self.take_sole = self._lb.take_sole  # type: ignore[method-assign]
        self._held: deque[bytes] = deque()  # requeued payloads waiting for credit
        self._awaited: set[int] = set()  # withdrawn pipes whose unwritten payloads are not known yet

    def add_pipe(self, pipe: PipeInfo, credit: int) -> None:
        super().add_pipe(pipe, credit)
        self._lb.add(pipe.id, pipe.send_priority, credit)
        if self.holding:
            self._send_held()

    # -- requeue: a dead pipe's unwritten payloads go first, on the other pipes --------
    # While some wait for credit (or for a dead pipe to say what it never wrote),
    # ``send`` and ``pipe_credit`` are replaced on the instance (nothing is added to
    # their usual path): a new message waits behind them, and returned credit sends them.
    def withdraw_pipe(self, pid: int, pending: bool = False) -> None:
        super().withdraw_pipe(pid, pending)
        self._lb.remove(pid)
        if pending and self.requeues and not self.closed:
            self._awaited.add(pid)  # nothing requeued goes out before its payloads
            self._send_held()

    def requeue(self, payloads: list[bytes], pid: int | None = None) -> int:
        if not self.requeues or self.closed:
            return super().requeue(payloads, pid)
        if pid is None:
            self._held.extend(payloads)
        else:
            # Older than whatever the pipe refused since it was withdrawn.
            self._awaited.discard(pid)
            self._held.extendleft(reversed(payloads))
        self._send_held()
        return len(payloads)

    def _send_held(self) -> None:
        held = self._held
        if not self._awaited:
            take = self._lb.take
            actions = self.actions
            while held:
                pid = take()
                if pid is None:
                    break
                actions.append((TRANSMIT, pid, held.popleft()))
        holding = bool(held or self._awaited)
        if holding and not self.holding:
            self.send = self._send_after_held  # type: ignore[method-assign]
            self.pipe_credit = self._credit_to_held  # type: ignore[method-assign]
        elif not holding and self.holding:
            del self.send, self.pipe_credit
        self.holding = holding

    def _send_after_held(self, body: bytes, header: bytes = b"") -> None:
        self._send_held()
        if self.holding:
            raise WouldBlock
        type(self).send(self, body, header)

    def _credit_to_held(self, pid: int, n: int) -> None:
        type(self).pipe_credit(self, pid, n)
        self._send_held()

    def remove_pipe(self, pid: int) -> None:
        super().remove_pipe(pid)
        self._lb.remove(pid)

    def pipe_credit(self, pid: int, n: int) -> None:
        self._lb.give(pid, n)

    def send(self, body: bytes, header: bytes = b"") -> None:
        pid = self._lb.take()
        if pid is None:
            raise WouldBlock
        self.actions.append((TRANSMIT, pid, body))

    def can_send(self) -> bool:
        return bool(self._lb) and not self._awaited

    def send_to(self, pid: int, payload: bytes) -> None:
        """Transmit on pipe ``pid``, or drop (counted) if it is gone or out of credit."""
        if self._lb.take_pipe(pid):
            self.actions.append((TRANSMIT, pid, payload))
        else:
            self.count_drop(QUEUE_FULL if pid in self._lb else UNROUTABLE, 1, pid)


class Distributing(Core):
    """Send side: every message goes to every pipe with credit (nanomsg ``dist``).

    A pipe without credit misses the message; sending never waits. ``_credit``
    maps pipe id to credit.
    """

    def __init__(self, options: Any, raw: bool = False) -> None:
        super().__init__(options, raw)
        self._credit: dict[int, int] = {}

    def add_pipe(self, pipe: PipeInfo, credit: int) -> None:
        super().add_pipe(pipe, credit)
        self._credit[pipe.id] = credit

    def withdraw_pipe(self, pid: int, pending: bool = False) -> None:
        super().withdraw_pipe(pid, pending)
        self._credit.pop(pid, None)  # (a dead pipe misses nothing: it is no longer counted)

    def remove_pipe(self, pid: int) -> None:
        super().remove_pipe(pid)
        self._credit.pop(pid, None)

    def pipe_credit(self, pid: int, n: int) -> None:
        if pid in self._credit:
            self._credit[pid] += n

    def distribute(self, payload: bytes, skip: int | None = None) -> int:
        """Transmit ``payload`` on every pipe with credit but ``skip``; return how
        many missed it. Misses count as drops (``queue_full``), and a payload with
        no pipe at all as one ``no_peer`` drop."""
        credit = self._credit
        if not credit:
            self.count_drop(NO_PEER)
            return 0
        append = self.actions.append
        missed = 0
        for pid, c in credit.items():
            if pid == skip:
                continue
            if c > 0:
                credit[pid] = c - 1
                append((TRANSMIT, pid, payload))
            else:
                missed += 1
                self.count_drop(QUEUE_FULL, 1, pid)
        return missed

    def can_send(self) -> bool:
        return True

    def batch_room(self) -> int | None:
        # The least credit of a pipe that has some: a round of more would make that
        # pipe drop messages it takes once its writes return credit. (Pipes without
        # credit drop now, as for send(); with none, every message drops.)
        room = [c for c in self._credit.values() if c > 0]
        return min(room) if room else None


class FairQueuing(Core):
    """Receive side: :class:`Message` objects queued per pipe in a :class:`FairQueue` (``_fq``).

    A gone pipe's unread messages stay readable (:meth:`Core.retire_pipe`): what
    arrived before a sender closed is delivered. Subclasses fill the queue in
    ``messages_received``; list this mixin last among a core's bases.
    """

    queue_class: ClassVar[type[FairQueue]] = FairQueue

    def __init__(self, options: Any, raw: bool = False) -> None:
        super().__init__(options, raw)
        self._fq = self.queue_class(self.actions, options)

    def add_pipe(self, pipe: PipeInfo, credit: int) -> None:
        super().add_pipe(pipe, credit)
        self._fq.add(pipe.id, pipe.recv_priority)

    def remove_pipe(self, pid: int) -> None:
        # Core's part too: the PipeInfo stays while its messages are unread.
        self.retire_pipe(pid, self._fq)

    def recv(self) -> Message:
        msg: Message = self._fq.pop()
        return msg

    def can_recv(self) -> bool:
        return bool(self._fq)

    def queued(self, pid: int | None = None) -> int:
        return self._fq.queued(pid)


class BodyQueuing(FairQueuing):
    """Receive side for headerless protocols: raw payloads are queued as they came.

    A :class:`Message` is built only when the user asks for one (``recv_body``
    skips it). Messages from a gone pipe stay readable, as in :class:`FairQueuing`.
    """

    def __init__(self, options: Any, raw: bool = False) -> None:
        super().__init__(options, raw)
        # The queued item is the body: receiving one is the fair queue's pop
        # itself, one call less on every receive (unless a subclass has its own).
        if type(self).recv_body is BodyQueuing.recv_body and type(self).recv is BodyQueuing.recv:
            self.recv_body = self._fq.pop  # type: ignore[method-assign]
            self.body_queue = self._fq
            fq_class = type(self._fq)
            if (
                type(self).messages_received is BodyQueuing.messages_received
                and fq_class.push is FairQueue.push
                and fq_class.overfilled is FairQueue.overfilled
            ):  # (a core that filters, or a queue that trims, feeds the long way)
                self.hand_over = self._fq.hand_over

    def messages_received(self, pid: int, payloads: list[bytes]) -> bool:
        return self._fq.push(pid, payloads)

    def recv(self) -> Message:
        body = self._fq.pop()
        return Message(body, self.pipes[self._fq.last_pid].token)

    def recv_body(self) -> bytes:
        body: bytes = self._fq.pop()
        return body


__all__ = [
    "ARM_TIMER",
    "CANCEL_TIMER",
    "CLOSE_PIPE",
    "READY",
    "READY_CALLER",
    "RESUME_READ",
    "TRANSMIT",
    "Action",
    "ActionKind",
    "BodyQueuing",
    "Core",
    "Distributing",
    "FairQueue",
    "FairQueuing",
    "LoadBalancer",
    "LoadBalancing",
    "PipeInfo",
]
