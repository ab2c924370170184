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
from nanopy.transports._stream import RECV_SIZE
from nanopy.transports.tcp import NOTSENT_LOWAT

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
    opts = {"kernel_send_buffer": KERNEL, "kernel_recv_buffer": 2 * KERNEL, "kernel_unsent_max": KERNEL // 2}
    with nanopy.Socket("pair", **opts) as a, nanopy.Socket("pair", **opts) as b:
        b.connect(a.bind(f"{scheme}://127.0.0.1:0").url)
        wait_pipes(a)
        wait_pipes(b)
        for ks in _kernel_sockets(a) + _kernel_sockets(b):
            # (Linux doubles what it is given, for its own bookkeeping)
            assert KERNEL <= ks.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) <= 2 * KERNEL
            assert 2 * KERNEL <= ks.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) <= 4 * KERNEL
            if NOTSENT_LOWAT is not None:
                assert ks.getsockopt(socket.IPPROTO_TCP, NOTSENT_LOWAT) == KERNEL // 2


def test_the_unsent_bound_is_on_by_default_and_0_lifts_it() -> None:
    if NOTSENT_LOWAT is None:
        pytest.skip("this system has no TCP_NOTSENT_LOWAT")
    for unsent, want in ((None, 128 * 1024), (0, None)):
        opts = {} if unsent is None else {"kernel_unsent_max": unsent}
        with nanopy.Socket("pair", **opts) as a, nanopy.Socket("pair", **opts) as b:
            b.connect(a.bind("tcp://127.0.0.1:0").url)
            wait_pipes(a)
            wait_pipes(b)
            for ks in _kernel_sockets(a) + _kernel_sockets(b):
                got = ks.getsockopt(socket.IPPROTO_TCP, NOTSENT_LOWAT)
                # (left unset, the socket reports the system's tcp_notsent_lowat: no limit by default)
                assert got == want if want is not None else got != 128 * 1024


def _stalled_burst(size: int, **options: int) -> tuple[int, nanopy.Socket, nanopy.Socket, int]:
    """A lossless PUB -> SUB over tcp whose SUB never reads: how many sends went
    through before one found no room (the last send gives up after its
    ``send_timeout``: a bound on the wait, not an ordering), and the SUB's
    SO_RCVBUF as the kernel has tuned it by then."""
    pub = nanopy.Socket("pub", overflow="block", send_timeout=0.5, **options)
    sub = nanopy.Socket("sub", overflow="block", **options)
    sub.subscribe(b"")
    sub.connect(pub.bind("tcp://127.0.0.1:0").url)
    wait_pipes(pub)
    wait_pipes(sub)
    # the subscription is in place once a message arrives (SUB filters, PUB sends to all)
    pub.send(b"probe")
    assert sub.recv(timeout=10) == b"probe"
    body = b"x" * size
    sent = 0
    try:
        while True:
            pub.send(body)
            sent += 1
    except nanopy.Timeout:
        pass
    rcvbuf = _kernel_sockets(sub)[0].getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    return sent, pub, sub, rcvbuf


def _documented_bound(size: int, send_buffer: int, recv_buffer: int, unsent: int, rcvbuf: int) -> int:
    """The budget of docs/performance.md, "Queue budget per pipe", in messages of ``size``."""
    read = RECV_SIZE // size + 1  # one read past the SUB's mark
    kernel = (unsent + 64 * 1024) // size + rcvbuf // size  # (+ one skb past the low-water mark)
    return send_buffer + kernel + recv_buffer + read


@pytest.mark.parametrize(("size", "options"), [
    (1024, {}),
    (1024, {"kernel_recv_buffer": KERNEL}),
    (64, {"kernel_recv_buffer": KERNEL, "send_buffer": 64, "recv_buffer": 64}),
    (16384, {"kernel_unsent_max": 32 * 1024}),
])
def test_a_stalled_subscriber_stops_the_publisher_at_the_documented_budget(size: int, options: dict[str, int]) -> None:
    sent, pub, sub, rcvbuf = _stalled_burst(size, **options)
    with pub, sub:
        send_buffer, recv_buffer = pub.send_buffer, sub.recv_buffer
        pub_held, sub_held = pub.stats().queued_out, sub.stats().queued_in
    # each of nanopy's layers holds at most what it is documented to hold
    assert pub_held <= send_buffer
    assert sub_held <= recv_buffer + RECV_SIZE // size + 1
    # and the whole burst in flight stops at the sum (the PUB's own window at least went out)
    bound = _documented_bound(size, send_buffer, recv_buffer, pub.kernel_unsent_max, rcvbuf)
    assert send_buffer <= sent <= bound, (sent, bound)
