"""ZeroMQ interoperability: nanopy sockets as ZMTP 3.1 peers of libzmq sockets.

Use the ``zmtp+tcp://`` and ``zmtp+ipc://`` schemes with the ordinary sockets
(see ``docs/zmtp.md``)::

    pull = nanopy.Socket("pull", bind="zmtp+tcp://127.0.0.1:5555")  # a pyzmq PUSH connects

Module contents: :class:`Multipart` (a message of several frames),
:func:`curve_keypair` and :func:`public_key` (CURVE keys as Z85 text; they need
the optional PyNaCl: ``pip install 'nanopy[curve]'``).
"""

from __future__ import annotations

from ...core.message import Multipart as Multipart
from ._curve import curve_keypair as curve_keypair
from ._curve import public_key as public_key

__all__ = ["Multipart", "curve_keypair", "public_key"]

Multipart.__module__ = __name__  # shown as nanopy.zmtp.Multipart
