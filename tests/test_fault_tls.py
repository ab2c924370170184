"""Fault tier: hostile TLS peers beside a good one (plaintext SP, garbage, unknown CA, stalls)."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable

import pytest
from conftest import wait_until
from faults import sp_header
from tls_certs import tls_files

import nanopy
from nanopy.testing import wait_pipes

pytestmark = [pytest.mark.fault, pytest.mark.usefixtures("no_nanopy_errors")]

MakeSocket = Callable[..., nanopy.Socket]
URLS = {"tls+tcp": "tls+tcp://127.0.0.1:0", "wss": "wss://127.0.0.1:0/hostile"}


@pytest.mark.parametrize("scheme", sorted(URLS))
def test_hostile_tls_clients_beside_a_good_one(make_socket: MakeSocket, scheme: str) -> None:
    t = tls_files()
    pull = make_socket("pull", handshake_timeout=0.5, recv_timeout=10)
    url = pull.bind(URLS[scheme], ssl_context=t.server_ctx).url
    port = int(url.split(":")[2].split("/")[0])
    hostile = []
    plain = socket.create_connection(("127.0.0.1", port), timeout=5)
    plain.sendall(sp_header(0x50))  # plaintext SP where TLS is expected
    hostile.append(plain)
    garbage = socket.create_connection(("127.0.0.1", port), timeout=5)
    garbage.sendall(b"\x16\x03\x01\xff\xff" + b"\x00" * 100)  # a TLS record header that lies
    hostile.append(garbage)
    hostile.append(socket.create_connection(("127.0.0.1", port), timeout=5))  # says nothing
    stranger = make_socket("push")  # trusts no one's CA but the system's
    stranger.connect(url.replace("127.0.0.1", "localhost"), ssl_context=ssl.create_default_context())
    good = make_socket("push")
    good.connect(url.replace("127.0.0.1", "localhost"), ssl_context=t.client_ctx)
    wait_pipes(pull)
    for n in range(20):
        good.send(b"good %d" % n)
    assert [pull.recv() for _ in range(20)] == [b"good %d" % n for n in range(20)]
    assert stranger.stats().pipes == 0
    wait_until(lambda: stranger.stats().protocol_errors >= 1, what="the unknown CA refused")
    for s in hostile:
        s.close()
    assert pull.stats().pipes == 1
