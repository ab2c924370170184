"""Pipe endings: what a dead pipe never wrote goes back ahead of any later send.

Owns: the round that ends a pipe (``pipe_ending``), the hand-back of payloads a
closed pipe refused (``hand_back``), the requeue count (``requeued``:
``stats().messages_requeued``) and the drain used while requeued payloads move
(``_drain_requeued``).

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
pipe changes its own state), the lanes' ``_revoke_lane``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._seam import PipeT
from ..core.base import TRANSMIT
from .lanes import SendLanes

if TYPE_CHECKING:
    from ..core.base import Action


class PipeEndings(SendLanes[PipeT]):
    """Ending pipes and requeueing (see the module docstring)."""

    requeued: int  # messages the core took back from ending pipes (never written)
    resent: int  # ... and those it took back that the peer's kernel had not acknowledged

    def pipe_ending(self, pipe: PipeT) -> None:
        """``pipe`` is dead or closing (any thread, holding neither the socket's
        lock nor the pipe's; each of its loops reports it, the first does the work)."""
        if not pipe.withdrawn:
            self.feed(self._end_pipe, pipe, check_open=False)

    def _end_pipe(self, pipe: PipeT) -> None:
        """The round of :meth:`pipe_ending` (lock held); also for a pipe closed
        before it was added (``add_pipe``)."""
        if pipe.withdrawn:
            return
        if self.closed or self.pipes.get(pipe.pid) is not pipe:
            # The socket is closing (its pipes' leftovers are counted at removal), or
            # the pipe is not added yet: add_pipe ends it at once.
            pipe.refuse_sends()
            return
        if self.lane is pipe or self._fan_pipes:
            self._revoke_lane()  # (its lane credit back into the core first)
        core = self.core
        # Closed to sends; what it never wrote (the unacknowledged first, to resend),
        # or None: a write is under way, its rest comes at removal.
        unwritten = pipe.withdraw(core.options.resend_unacked)
        core.withdraw_pipe(pipe.pid, unwritten is None)
        if unwritten is not None:
            self._take_back(unwritten[0], pipe.pid, unwritten[1])
        else:
            self._moving(0)  # (nothing yet: the core holds sends meanwhile)

    def hand_back(self, payloads: list[bytes]) -> None:
        """Payloads whose TRANSMIT found its pipe closed or gone (a round before
        the pipe ended chose it): back to the core, behind what that pipe never
        wrote. A core that does not requeue counts them as ``dead_pipe`` drops."""
        self.feed(self._take_back, payloads, None, check_open=False)

    def _take_back(self, payloads: list[bytes], pid: int | None, resent: int = 0) -> int:
        """Give ``payloads`` (of pipe ``pid``, or handed back; the first ``resent``
        of them had reached its kernel) to the core (lock held); returns how many
        it took."""
        taken = self.core.requeue(payloads, pid)
        resent = min(resent, taken)
        self.resent += resent
        self.requeued += taken - resent
        self._moving(taken)
        return taken

    def _moving(self, taken: int) -> None:
        """While requeued payloads move (``taken`` now, or some held by the core),
        rounds queue TRANSMITs at once and returned credit reaches the core at once."""
        holding = self.core.holding
        if taken or holding:
            if "_drain" not in vars(self):
                self._drain = self._drain_requeued  # type: ignore[method-assign]
            if holding:
                # Lane sends skip the core: they must not pass what it holds, and
                # the lane's credit may send it now.
                self._revoke_lane()
                if self._lazy_credit:
                    self._lazy_credit = False
                    self._relazy = True

    def _drain_requeued(self) -> list[Action] | None:
        """``_drain`` while requeued payloads move (lock held): TRANSMITs are queued
        on their pipes now, in order (see the module docstring)."""
        core = self.core
        actions = core.actions
        kept: list[Action] = []
        while actions:
            out = actions.copy()
            actions.clear()
            refused = self._queue_transmits(out, kept)
            if refused:
                self._take_back(refused, None)  # (a pipe withdrawn since: not chosen again)
        actions.extend(kept)
        if not core.holding:
            del self._drain  # the usual drain again
            if self._relazy:
                self._relazy = False
                self._lazy_credit = True
        return super()._drain()

    def _queue_transmits(self, out: list[Action], kept: list[Action]) -> list[bytes]:
        """Queue the TRANSMITs of ``out`` on their pipes, a run per pipe (lock
        held); other actions go to ``kept``. Returns the payloads of pipes gone
        or withdrawn."""
        refused: list[bytes] = []
        pipes = self.pipes
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
                pipe.queue_batch(batch, True)  # (not closed: only _end_pipe closes a live pipe)
            i = j
        return refused
