"""A pipe's writer task: the engine side of :class:`~nanopy.pipe.driver.PipeDriver`'s writes.

The driver's sending threads write straight to the channel when they can
(``transmit``, ``flush_queued``); ``write_loop`` writes everything else: what a
burst leaves in the outbox (after waiting the burst out: ``wait_out_burst``), the
rest of a chunk a non-blocking write could not finish, and a control frame. It is
the pipe's one task that awaits a write (``write_all``), so it is the one that
blocks on a peer reading nothing; its write is watched by the liveness part.

Interface: ``write_loop(pipe)``, run as one of the pipe's tasks (``PipeDriver.run``),
and ``payload_bytes``, the framing arithmetic it shares with the driver's direct
writes. It reads and writes the pipe's write-side fields (``Outbox``) only under
the pipe's lock, as the driver's own methods do, and sleeps on
``pipe._writer_event``, which the driver's ``_kick_writer`` sets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from .._seam import CALLER_BATCH_MAX, MAX_HOLD, wait_out_burst
from .liveness import unwritten, write_shortfall

if TYPE_CHECKING:
    from .driver import PipeDriver

#: the outbox size at which a sending thread looks at writing it (see driver.py)
CALLER_BATCH = 64


async def write_loop(pipe: PipeDriver) -> None:
    """The pipe's writer task (engine thread): write what sends left queued --
    a chunk's rest, the control frame, the outbox -- whenever no sending thread
    holds the channel; woken through ``pipe._writer_event`` (``_kick_writer``)."""
    channel = pipe.channel
    liveness = pipe.liveness
    lingering = False  # a burst is under way: let the sender write its own batches
    # How long a lingering writer waits (wait_out_burst): while the burst goes on, so
    # the sender keeps writing full batches itself and is never interrupted by a
    # partial flush; a full batch, a chunk's rest or a control frame goes at once.
    # (Read without the lock: a stale view never holds a payload past MAX_HOLD.)
    linger = (
        # Sends so far: ``appended`` counts those off the send lane, a lane send
        # spends one ``lane_credit`` instead, or counts in ``lane_kept`` (a grant
        # moves it too: one more sleep at most, within ``due``).
        lambda: pipe.appended - pipe.lane_credit + pipe.lane_kept,
        lambda: pipe.first_at + MAX_HOLD if pipe.outbox else None,
        pipe.now,
        lambda: pipe.tail is not None or pipe.control is not None or len(pipe.outbox) >= CALLER_BATCH_MAX,
    )
    while True:
        if lingering:
            await wait_out_burst(*linger)
        with pipe.lock:
            # (a shut write window holds the outbox: see Outbox.window_moved)
            waiting = not pipe.outbox or pipe.shut
            if pipe.writing or pipe.closed or (pipe.tail is None and pipe.control is None and waiting):
                idle = not pipe.writing
                event = pipe._writer_event = trio.Event()
            else:
                event = None
                tail_bytes = pipe.tail_bytes
                tail, credit, control, batch = pipe.claim_write()
                cut = bool(pipe.outbox)  # (a write takes at most write_step messages)
        if event is not None:
            if idle:
                pipe.notify_idle()
            await event.wait()
            lingering = True
            continue
        stage = 0
        piece: Any = tail  # what is being written (for the sent log, if it fails)
        sent_log = pipe.sent_log
        liveness.write_started()  # (the window guard watches this write)
        try:
            # A chunk's rest first (it may end in the middle of a frame), then
            # the control frame, then the payloads.
            if tail is not None:
                await channel.write_all(tail)
                pipe.wrote(credit, tail_bytes)
                if sent_log is not None:
                    sent_log.advance(len(tail))
            stage, piece = 1, None
            if control is not None:
                piece = channel.control_chunk(control)
                await channel.write_all(piece)
                if sent_log is not None:
                    sent_log.advance(len(piece))
            stage, piece = 2, None
            if batch:
                piece = chunk = channel.frame(batch)
                size = payload_bytes(batch, chunk, pipe.frame_prefix)
                pipe.note_write(len(batch), size)
                with pipe.lock:  # (its payload bytes count as sent now: see Outbox)
                    pipe.tx_bytes += size
                    pipe.in_write_bytes += size
                await channel.write_all(chunk)
                pipe.wrote(len(batch), size)
                if sent_log is not None:
                    sent_log.wrote(batch, len(chunk), len(chunk))
        except BaseException:
            if sent_log is not None:
                pipe.resend.note_failed_write(piece, batch if stage == 2 else None)
            # The connection failed under the write: what never reached the
            # kernel may still go out on another pipe (PipeHost.run_pipe hands
            # ``orphans`` to SocketDriver.remove_pipe).
            if tail is not None and stage == 0:
                pipe.orphans += unwritten(channel, pipe._tail_batch, write_shortfall(channel))
            if batch:
                pipe.orphans += batch if stage < 2 else unwritten(channel, batch, write_shortfall(channel))
            raise
        finally:
            liveness.write_ended()
            pipe.end_write()
        credit += len(batch)
        if credit:
            pipe.sock.credit(pipe.pid, credit)
        # Keep lingering only for small flushes; a full outbox means the
        # sender outruns the socket, so write again at once (as after a cut batch).
        lingering = not cut and len(batch) < CALLER_BATCH


def payload_bytes(batch: list[bytes], chunk: Any, prefix: int) -> int:
    """The payload bytes of ``batch``, framed as ``chunk``: from the chunk's length
    when every frame adds ``prefix`` bytes (SP over a stream), else summed."""
    if prefix >= 0:
        return len(chunk) - prefix * len(batch)
    return len(batch[0]) if len(batch) == 1 else sum(map(len, batch))
