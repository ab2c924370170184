"""The platform layer: the few operations nanopy needs that each operating system does its own way.

Two backends offer the same functions (:class:`~nanopy.platform._common.Backend`):

* ``linux`` (nanopy/platform/linux.py): eventfd and epoll, Linux's TCP options
  (TCP_USER_TIMEOUT, TCP_KEEPIDLE/INTVL/CNT) and counters (SIOCOUTQ, TCP_INFO),
  the interface ioctls, /proc. The default on Linux.
* ``portable`` (nanopy/platform/portable.py): a socketpair wake, ``selectors``,
  the keepalive options each system has, ``ifaddr`` for interfaces, and "unknown"
  where the standard library cannot tell. The default everywhere else.

``NANOPY_BACKEND=portable`` (or ``linux``) in the environment picks one when nanopy
is imported, for debugging and so that Linux can run the suite on each (docs/contributing.md).
The names below are the chosen backend's own functions, bound at import: a call
through this module costs what a call to the backend does.

This layer imports nothing else of nanopy; every other layer may import it.
"""

from __future__ import annotations

import os
import sys

from ._common import Backend, Capabilities, Ipv4Interface, ReadyWait, Waker, broadcast_of

#: the backends, by the name ``NANOPY_BACKEND`` takes
BACKENDS = ("linux", "portable")


class BackendError(ValueError):
    """``NANOPY_BACKEND`` names no backend, or one this system cannot run."""


def load(name: str) -> Backend:
    """The backend called ``name`` (tests load both; nanopy uses the one chosen at import)."""
    if name == "linux":
        if not sys.platform.startswith("linux"):
            raise BackendError(f"NANOPY_BACKEND=linux: the linux backend needs Linux, not {sys.platform}; "
                               "unset NANOPY_BACKEND or set it to 'portable'")
        from . import linux

        return linux
    if name == "portable":
        from . import portable

        return portable
    raise BackendError(f"NANOPY_BACKEND={name!r}: choose one of {', '.join(BACKENDS)} (or unset it for the default)")


def default_name() -> str:
    """The backend nanopy uses here: ``NANOPY_BACKEND`` if set, else linux on Linux, portable elsewhere."""
    asked = os.environ.get("NANOPY_BACKEND", "").strip().lower()
    if asked:
        return asked
    return "linux" if sys.platform.startswith("linux") else "portable"


backend: Backend = load(default_name())

NAME = backend.NAME
CAPABILITIES = backend.CAPABILITIES
UNIX_PATH_MAX = backend.UNIX_PATH_MAX
new_waker = backend.new_waker
ready_wait = backend.ready_wait
reuse_listen_address = backend.reuse_listen_address
share_datagram_port = backend.share_datagram_port
set_keepalive = backend.set_keepalive
set_user_timeout = backend.set_user_timeout
user_timeout = backend.user_timeout
unacked_bytes = backend.unacked_bytes
unread_bytes = backend.unread_bytes
send_window_state = backend.send_window_state
send_buffer_ceiling = backend.send_buffer_ceiling
ipv4_interfaces = backend.ipv4_interfaces
ipv6_link_interfaces = backend.ipv6_link_interfaces
register_at_fork = backend.register_at_fork
lock_file = backend.lock_file
fsync_directory = backend.fsync_directory
user_tag = backend.user_tag
is_unix_socket = backend.is_unix_socket

__all__ = [
    "BACKENDS", "Backend", "BackendError", "CAPABILITIES", "Capabilities", "Ipv4Interface", "NAME", "ReadyWait",
    "UNIX_PATH_MAX", "Waker", "backend", "broadcast_of", "default_name", "fsync_directory", "ipv4_interfaces",
    "ipv6_link_interfaces", "is_unix_socket", "load", "lock_file", "new_waker", "ready_wait", "register_at_fork",
    "reuse_listen_address", "send_buffer_ceiling", "send_window_state", "set_keepalive", "set_user_timeout",
    "share_datagram_port", "unacked_bytes", "unread_bytes", "user_tag", "user_timeout",
]
