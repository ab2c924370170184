"""ZeroMQ interoperability: nanopy sockets as ZMTP 3.1 peers of libzmq sockets.

Use the ``zmtp+tcp://`` and ``zmtp+ipc://`` schemes with the ordinary sockets
(see ``docs/zmtp.md``)::

    pull = nanopy.Socket("pull", bind="zmtp+tcp://127.0.0.1:5555")  # a pyzmq PUSH connects

Module contents: :class:`Multipart` (a message of several frames).
"""

from __future__ import annotations

from .._message import Multipart as Multipart

__all__ = ["Multipart"]
