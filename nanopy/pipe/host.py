"""What a pipe may ask of its socket: the narrow host interface.

A :class:`~nanopy.pipe.driver.PipeDriver` sees its socket's driver only through
:class:`PipeHost`: five calls and one counter. (The other way, the socket's driver
sees a pipe as a ``PipeHandle``, nanopy/_seam.py.) Everything else about the socket
(its core, lock, lanes, waiters) is none of the pipe's business; a pipe that
needs more is a design change, made here first.

May call: nothing (a typing seam).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .._seam import PipeHandle


class PipeHost(Protocol):
    """The socket as one of its pipes sees it (implemented by ``SocketDriver``)."""

    #: Messages the socket has received: a pipe that sees it move since its last
    #: send treats the next send as an answer (written at once), not a burst.
    received: int

    def deliver(self, pid: int, payloads: list[bytes], size: int = -1) -> bool:
        """Hand payloads read from pipe ``pid`` to the core (``size``: their bytes,
        if the reader knows them; -1: the socket sums them); False: stop reading."""
        ...

    def credit(self, pid: int, n: int) -> None:
        """``n`` of pipe ``pid``'s payloads were written: the core may send more."""
        ...

    def pipe_ending(self, pipe: PipeHandle) -> None:
        """``pipe`` was found dead or is closing: the socket stops sending on it and
        takes back what it never wrote, ahead of later sends (nanopy/driver/endings.py)."""
        ...

    def flush_later(self, pipe: PipeHandle | None) -> None:
        """``pipe`` queued a fan-out burst's first payload: the socket's flush round writes it."""
        ...

    def pipe_view(self, pipe: PipeHandle) -> tuple[int, int, int, int]:
        """``(dropped, queued_in, rx_msgs, rx_bytes)`` of ``pipe``, in one consistent look."""
        ...
