"""PAIR v1 sockets: hop-count header, monogamy, raw hop counting."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from conftest import bind_url, wait_until

import nanopy
from nanopy.testing import connect_pair, wait_pipes

MakeSocket = Callable[..., nanopy.Socket]


@pytest.mark.parametrize("transport", ["tcp", "ipc", "inproc"])
def test_pair1_both_ways(make_socket: MakeSocket, transport: str) -> None:
    a = make_socket("pair1", recv_timeout=5)
    b = make_socket("pair1", recv_timeout=5)
    connect_pair(a, b, bind_url(transport))
    a.send(b"to b")
    assert b.recv() == b"to b"
    b.send(b"to a")
    msg = a.recv_msg()
    assert (msg.body, msg.header) == (b"to a", b"")


def test_pair1_wire_hop_count(make_socket: MakeSocket) -> None:
    cooked = make_socket("pair1")
    raw = make_socket("pair1", raw=True, recv_timeout=5)
    connect_pair(raw, cooked, bind_url("tcp"))
    cooked.send(b"x")
    msg = raw.recv_msg()
    assert msg.header == struct.pack(">I", 1)  # a direct send carries hop count 1


def test_pair1_monogamous(make_socket: MakeSocket) -> None:
    a = make_socket("pair1")
    b = make_socket("pair1")
    c = make_socket("pair1")
    ep = a.bind(bind_url("tcp"))
    b.connect(ep.url)
    wait_pipes(a)
    c.connect(ep.url)
    wait_until(lambda: a.stats().disconnects >= 1, what="second peer refused")
    assert len(a.pipes) == 1


def test_pair1_drops_too_many_hops(make_socket: MakeSocket) -> None:
    raw = make_socket("pair1", raw=True)
    dst = make_socket("pair1", recv_timeout=5, max_ttl=3)
    connect_pair(dst, raw, bind_url("inproc"))
    raw.send_msg(nanopy.Message(b"far", header=struct.pack(">I", 3)))  # arrives with 4
    raw.send_msg(nanopy.Message(b"near", header=struct.pack(">I", 2)))  # arrives with 3
    assert dst.recv() == b"near"
    assert dst.stats().messages_dropped == 1
    with pytest.raises(nanopy.ProtocolError):
        raw.send_msg(nanopy.Message(b"bad", header=struct.pack(">I", 0x1FF)))
