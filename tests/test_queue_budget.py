"""The queue budget per pipe (issue 36; docs/performance.md, "Queue budget per pipe").

* ``kernel_send_buffer`` / ``kernel_recv_buffer`` reach SO_SNDBUF / SO_RCVBUF of
  dialed and accepted sockets of the tcp-based transports;
* a publisher whose subscriber never reads stops at the documented bound: what
  its own pipe holds (``send_buffer``), what both kernels hold (their buffers)
  and what the subscriber's pipe holds (``recv_buffer`` plus one read).

Loopback only; the one timeout below only ends the publisher's last send, it
does not order anything.
"""

from __future__ import annotations

import socket

import pytest

import nanopy
from nanopy.testing import wait_pipes

pytestmark = pytest.mark.timeout(60)

KERNEL = 64 * 1024


def _kernel_sockets(sock: nanopy.Socket) -> list[socket.socket]:
    return [d.conn.kernel_socket() for d in sock._driver.pipe_drivers()]  # type: ignore[attr-defined]


def test_kernel_buffer_options_validate() -> None:
    with nanopy.Socket("pair") as sock:
        sock.kernel_send_buffer = 4096
        assert sock.kernel_send_buffer == 4096
        with pytest.raises(ValueError, match="kernel_recv_buffer"):
            sock.kernel_recv_buffer = -1
        with pytest.raises(TypeError, match="kernel_send_buffer"):
            sock.kernel_send_buffer = 1.5  # type: ignore[assignment]


@pytest.mark.parametrize("scheme", ["tcp", "ws", "zmtp+tcp"])
def test_dialed_and_accepted_sockets_get_the_kernel_buffers(scheme: str) -> None:
    opts = {"kernel_send_buffer": KERNEL, "kernel_recv_buffer": 2 * KERNEL}
    with nanopy.Socket("pair", **opts) as a, nanopy.Socket("pair", **opts) as b:
        b.connect(a.bind(f"{scheme}://127.0.0.1:0").url)
        wait_pipes(a)
        wait_pipes(b)
        for ks in _kernel_sockets(a) + _kernel_sockets(b):
            # (Linux doubles what it is given, for its own bookkeeping)
            assert KERNEL <= ks.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) <= 2 * KERNEL
            assert 2 * KERNEL <= ks.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) <= 4 * KERNEL
