"""Pipe endings: what a dead pipe never wrote goes back ahead of any later send.

Owns: the round that ends a pipe (``pipe_ending``), the hand-back of payloads a
closed pipe refused (``hand_back``), the requeue count (the round's
``requeued``: ``stats().messages_requeued``) and the drain used while requeued
payloads move (``_drain_requeued``).

The moment a pipe is known dead -- its reader or writer failed, its dead-peer
watch fired, or it is being closed -- one round (under the socket lock):

1. gives unspent lane credit back to the core, then withdraws the pipe from it
   (``Core.withdraw_pipe``): no new send is given to it;
2. closes it (``PipeHandle.withdraw``): a ``transmit`` decided before this round
   but carried out after it is refused, and its payload handed back
   (``hand_back``), behind what the pipe held;
3. takes what it never wrote -- what a failed write left, the whole messages of
   a chunk's unwritten rest, its queue -- and gives it to the core
   (``Core.requeue(payloads, pid)``), in order, ahead of anything sent later;
   with ``resend_unacked``, the messages its kernel held that the peer never
   acknowledged go first (nanopy/pipe/resend.py; ``resent``:
   ``stats().messages_resent``).

If a write is under way at that moment (the writer task inside ``write_all``,
a thread's non-blocking write), what it will leave is not known yet: the core
then holds every send and every requeued payload until the pipe's removal
brings the rest (``SocketDriver.remove_pipe``) -- a few engine steps.

While requeued payloads move, each TRANSMIT a round yields is queued on its
pipe inside that round (``PipeHandle.queue_batch``, under the socket lock), not
carried out after it: a send decided in a later round can never reach that pipe
first. This drain replaces the usual one only until the core holds nothing, so
the usual paths pay nothing per message.

May call: the core's ``withdraw_pipe``/``requeue`` inside a round, the pipes'
``withdraw``/``refuse_sends``/``queue_batch`` (``PipeHandle``, nanopy/_seam.py: the
pipe changes its own state), the lanes' ``revoke_lane``/``revoke_for``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic

from .._seam import PipeT
from ..core.base import TRANSMIT
from .round import Round

if TYPE_CHECKING:
    from ..core.base import Action
    from .lanes import SendLanes


class PipeEndings(Generic[PipeT]):
    """Ending pipes and requeueing (see the module docstring). Its counts
    (``requeued``, ``resent``) are the round's, with the other stats."""

    def __init__(self, driver: Round[PipeT], lanes: SendLanes[PipeT]) -> None:
        self.round = driver  # the lock, the core, the counters and the round's calls
        self.lanes = lanes  # their credit goes back to the core before a pipe leaves it

    def pipe_ending(self, pipe: PipeT) -> None:
        """``pipe`` is dead or closing (any thread, holding neither the socket's
        lock nor the pipe's; each of its loops reports it, the first does the work)."""
        if not pipe.withdrawn:
            self.round.feed(self.end_pipe, pipe, check_open=False)

    def end_pipe(self, pipe: PipeT) -> None:
        """The round of :meth:`pipe_ending` (lock held); also for a pipe closed
        before it was added (``add_pipe``)."""
        r = self.round
        if pipe.withdrawn:
            return
        if r.closed or r.pipes.get(pipe.pid) is not pipe:
            # The socket is closing (its pipes' leftovers are counted at removal), or
            # the pipe is not added yet: add_pipe ends it at once.
            pipe.refuse_sends()
            return
        self.lanes.revoke_for(pipe.pid)  # (its lane credit back into the core first)
        core = r.core
        # Closed to sends; what it never wrote (the unacknowledged first, to resend),
        # or None: a write is under way, its rest comes at removal.
        unwritten = pipe.withdraw(core.options.resend_unacked)
        core.withdraw_pipe(pipe.pid, unwritten is None)
        if unwritten is not None:
            self.take_back(unwritten[0], pipe.pid, unwritten[1])
        else:
            self._moving(0)  # (nothing yet: the core holds sends meanwhile)

    def hand_back(self, payloads: list[bytes]) -> None:
        """Payloads whose TRANSMIT found its pipe closed or gone (a round before
        the pipe ended chose it): back to the core, behind what that pipe never
        wrote. A core that does not requeue counts them as ``dead_pipe`` drops."""
        r = self.round
        r.feed(self.take_back, payloads, None, check_open=False)

    def take_back(self, payloads: list[bytes], pid: int | None, resent: int = 0) -> int:
        """Give ``payloads`` (of pipe ``pid``, or handed back; the first ``resent``
        of them had reached its kernel) to the core (lock held); returns how many
        it took."""
        r = self.round
        taken = r.core.requeue(payloads, pid)
        resent = min(resent, taken)
        r.resent += resent
        r.requeued += taken - resent
        self._moving(taken)
        return taken

    def _moving(self, taken: int) -> None:
        """While requeued payloads move (``taken`` now, or some held by the core),
        rounds queue TRANSMITs at once and returned credit reaches the core at once."""
        r = self.round
        holding = r.core.holding
        if taken or holding:
            if "_drain" not in vars(r):  # (the round's own drain, shadowed on the instance)
                r._drain = self._drain_requeued  # type: ignore[method-assign]
            if holding:
                # Lane sends skip the core: they must not pass what it holds, and
                # the lane's credit may send it now.
                self.lanes.revoke_lane()
                if r._lazy_credit:
                    r._lazy_credit = False
                    r._relazy = True

    def _drain_requeued(self) -> list[Action] | None:
        """``_drain`` while requeued payloads move (lock held): TRANSMITs are queued
        on their pipes now, in order (see the module docstring)."""
        r = self.round
        core = r.core
        actions = core.actions
        kept: list[Action] = []
        while actions:
            out = actions.copy()
            actions.clear()
            refused = self._queue_transmits(out, kept)
            if refused:
                self.take_back(refused, None)  # (a pipe withdrawn since: not chosen again)
        actions.extend(kept)
        if not core.holding:
            del r._drain  # the usual drain again
            if r._relazy:
                r._relazy = False
                r._lazy_credit = True
        return Round._drain(r)

    def _queue_transmits(self, out: list[Action], kept: list[Action]) -> list[bytes]:
        """Queue the TRANSMITs of ``out`` on their pipes, a run per pipe (lock
        held); other actions go to ``kept``. Returns the payloads of pipes gone
        or withdrawn."""
        r = self.round
        refused: list[bytes] = []
        pipes = r.pipes
        i, n = 0, len(out)
        while i < n:
            action = out[i]
            if action[0] is not TRANSMIT:
                kept.append(action)
                i += 1
                continue
            pid = action[1]
            j = i + 1
            while j < n and out[j][0] is TRANSMIT and out[j][1] == pid:
                j += 1
            batch = [a[2] for a in out[i:j]]
            pipe = pipes.get(pid)
            if pipe is None or pipe.withdrawn:
                refused += batch
            else:
                pipe.queue_batch(batch, True)  # (not closed: only end_pipe closes a live pipe)
            i = j
        return refused
