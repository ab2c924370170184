"""The nanopy exception hierarchy (see docs/api.md)."""

from __future__ import annotations


class NanopyError(Exception):
    """Base class of every error nanopy raises on purpose."""


class Timeout(NanopyError, TimeoutError):
    """An operation did not complete within its timeout (``timeout=0``: at once).

    Attributes:
        sent: from ``send_batch``/``asend_batch``, how many of the batch's messages
            went (the first ``sent``, in order) before it timed out; None elsewhere.
    """

    sent: int | None = None


class Closed(NanopyError):
    """The socket (or endpoint) is closed, or was created before ``os.fork()``."""


class AddressError(NanopyError, ValueError):
    """A URL is malformed or names a scheme no transport is registered for."""


class AddressInUse(NanopyError, OSError):
    """``bind`` found the address already taken by a live listener."""


class ProtocolError(NanopyError):
    """The operation is not valid for this protocol or in its current state."""


class MessageTooLarge(NanopyError):
    """A message exceeds ``recv_max_size`` (the pipe that carried it is closed)."""


def too_large(size: int | str, limit: int, what: str = "message") -> MessageTooLarge:
    """The error for a peer's ``what`` over ``recv_max_size`` (every transport raises
    this one): it says the size seen (``size``: bytes, or text such as "over 1048576"),
    the limit and the option that lifts it, so the pipe's WARNING line does too."""
    seen = f"a {size}-byte {what}" if isinstance(size, int) else f"a {what} of {size} bytes"
    return MessageTooLarge(
        f"peer sent {seen}; recv_max_size is {limit} (set the socket's recv_max_size "
        "higher, or to 0 for no limit, to accept such messages)"
    )


class WouldBlock(Exception):
    """Internal signal from a protocol core: the operation cannot complete now."""


class RemoteProtocolError(NanopyError):
    """A peer broke the wire protocol; only that peer's pipe is closed."""


class AuthenticationFailed(RemoteProtocolError):
    """A handshake's security check refused the peer: a CURVE key not in
    ``curve_clients`` or a box that does not open, PLAIN credentials ``plain_auth``
    refused, a TLS certificate that failed verification.

    Raised inside the engine (a plug-in transport raises it too): the connection is
    closed, logged as a protocol error and counted in ``stats().auth_failures``.
    """


class Refused(AuthenticationFailed):
    """A bind's gate (``authorize=``, ``allow=``/``deny=``) refused the peer.

    Raised inside the engine only: the connection is closed (a ZMTP peer first gets
    an ERROR command with the reason), logged once per peer host and interval, and
    counted in ``stats().auth_failures`` and ``handshake_failures``.
    """
