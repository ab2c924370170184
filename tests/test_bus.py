"""BUS sockets: mesh delivery to direct peers only, raw origin header, one-socket device."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from conftest import bind_url

import nanopy
from nanopy.testing import wait_pipes

MakeSocket = Callable[..., nanopy.Socket]


@pytest.mark.parametrize("transport", ["tcp", "ipc", "inproc"])
def test_bus_mesh(make_socket: MakeSocket, transport: str) -> None:
    # a is connected to b and c; b and c are not connected to each other.
    a = make_socket("bus", recv_timeout=5)
    b = make_socket("bus", recv_timeout=5)
    c = make_socket("bus", recv_timeout=5)
    ep = a.bind(bind_url(transport))
    b.connect(ep.url)
    c.connect(ep.url)
    wait_pipes(a, 2)
    wait_pipes(b)
    wait_pipes(c)
    a.send(b"from a")
    assert b.recv() == b"from a" and c.recv() == b"from a"
    b.send(b"from b")
    assert a.recv() == b"from b"
    # Cooked BUS does not forward: c is not b's peer. A forward by a would reach c
    # before a's own next message on the same pipe, so the sentinel comes first.
    a.send(b"sentinel")
    assert c.recv() == b"sentinel" and b.recv() == b"sentinel"
    with pytest.raises(nanopy.Timeout):
        b.recv(timeout=0)  # nor does a message come back to its sender


def test_bus_send_without_peers_never_blocks(make_socket: MakeSocket) -> None:
    bus = make_socket("bus")
    bus.send(b"into the void", timeout=0)
    assert bus.stats().messages_sent == 1


def test_raw_bus_device_relays_without_echo(make_socket: MakeSocket) -> None:
    hub = make_socket("bus", raw=True)
    ep = hub.bind(bind_url("tcp"))
    peers = [make_socket("bus", recv_timeout=5, connect=ep.url) for _ in range(3)]
    wait_pipes(hub, 3)
    for p in peers:
        wait_pipes(p)
    t = threading.Thread(target=nanopy.device, args=(hub, hub), daemon=True)
    t.start()
    peers[0].send(b"hello mesh")
    assert peers[1].recv() == b"hello mesh"
    assert peers[2].recv() == b"hello mesh"
    # No echo to the sender: an echo would reach peers[0] before the device relays
    # the next message, so the sentinel from peers[1] is the first thing it gets.
    peers[1].send(b"sentinel")
    assert peers[0].recv() == b"sentinel" and peers[2].recv() == b"sentinel"
    hub.close()
    t.join(5)
    assert not t.is_alive()
