"""Fault tier: consumers that read slowly or never, with memory sampled.

A raw TCP peer completes the SP handshake and then never reads. The sending
socket must stay within its per-pipe buffers (PUB drops for that pipe, PUSH
routes around it, REP drops replies it cannot write), keep serving a healthy
peer in order, and its RSS must not grow with the volume sent.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import pytest
from faults import assert_in_order_no_duplicates, frame, raw_sp_client, rss_bytes, tagged, untag

import nanopy
from nanopy.testing import wait_pipes

pytestmark = [pytest.mark.fault, pytest.mark.usefixtures("no_nanopy_errors")]

MakeSocket = Callable[..., nanopy.Socket]
SIZE = 4096
COUNT = 40_000  # 160 MiB through the sender
RSS_BOUND = 64 << 20


def _stuck_peer(url: str, protocol_id: int) -> socket.socket:
    sock = raw_sp_client(url, protocol_id)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and never read
    return sock


def test_pub_with_a_never_reading_sub_stays_bounded(make_socket: MakeSocket) -> None:
    pub = make_socket("pub", send_buffer=256)
    url = pub.bind("tcp://127.0.0.1:0").url
    stuck = _stuck_peer(url, 0x21)
    good = make_socket("sub", recv_buffer=256)
    good.subscribe(b"")
    good.connect(url)
    wait_pipes(pub, 2)
    seqs, growth = _send_while_reading(pub, good)
    assert len(seqs) > COUNT // 10, "the healthy subscriber was starved"
    assert growth < RSS_BOUND, f"RSS grew {growth >> 20} MiB"
    assert pub.stats().messages_dropped > 0  # the stuck pipe missed messages (PUB may drop)
    stuck.close()


def _send_while_reading(sender: nanopy.Socket, reader_sock: nanopy.Socket) -> tuple[list[int], int]:
    """Send COUNT tagged messages while a thread reads ``reader_sock``.

    Returns the sequence numbers read (checked: in order, no duplicates) and the
    peak RSS growth seen while sending.
    """
    seqs: list[int] = []
    reader = threading.Thread(target=_read_until_quiet, args=(reader_sock, seqs), daemon=True)
    reader.start()
    base = peak = rss_bytes()
    for seq in range(COUNT):
        sender.send(tagged(seq, SIZE))
        if seq % 2000 == 0:
            peak = max(peak, rss_bytes())
    peak = max(peak, rss_bytes())
    reader.join(30)
    assert not reader.is_alive()
    assert_in_order_no_duplicates(seqs)
    return seqs, peak - base


def _read_until_quiet(sock: nanopy.Socket, out: list[int]) -> None:
    while True:
        try:
            out.append(untag(sock.recv(timeout=2)))
        except nanopy.Timeout:
            return


def test_push_routes_around_a_never_reading_pull(make_socket: MakeSocket) -> None:
    push = make_socket("push", send_buffer=64, send_timeout=10)
    url = push.bind("tcp://127.0.0.1:0").url
    stuck = _stuck_peer(url, 0x51)
    good = make_socket("pull", recv_timeout=10)
    good.connect(url)
    wait_pipes(push, 2)
    seqs, growth = _send_while_reading(push, good)
    # The stuck pipe holds at most its buffer plus what the kernel took; the rest
    # reached the healthy peer.
    assert len(seqs) > COUNT - 2000
    assert growth < RSS_BOUND, f"RSS grew {growth >> 20} MiB"
    stuck.close()


def test_rep_with_a_client_that_never_reads_replies(make_socket: MakeSocket) -> None:
    rep = make_socket("rep", send_buffer=64)
    url = rep.bind("tcp://127.0.0.1:0").url
    stuck = _stuck_peer(url, 0x30)
    wait_pipes(rep)
    body = b"q" * SIZE
    base = rss_bytes()
    peak = base

    def ask() -> None:
        try:
            for n in range(COUNT // 4):
                stuck.sendall(frame((0x80000000 | n).to_bytes(4, "big") + body))
        except OSError:
            pass

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    served = 0
    while served < COUNT // 4:
        try:
            msg = rep.recv_msg(timeout=2)
        except nanopy.Timeout:
            break
        msg.reply(body)  # never blocks: a reply that cannot be written is dropped
        served += 1
        if served % 1000 == 0:
            peak = max(peak, rss_bytes())
    assert served == COUNT // 4
    assert peak - base < RSS_BOUND, f"RSS grew {(peak - base) >> 20} MiB"
    assert rep.stats().messages_dropped > 0
    stuck.close()
    asker.join(10)
