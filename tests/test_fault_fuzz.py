"""Fault tier: hypothesis-generated SP payloads after a correct handshake, every protocol.

A raw TCP peer completes the handshake with the right protocol id, then sends
generated messages: random bytes, and stacks of 32-bit words with and without the
end bit (backtraces, hop counts, request and survey ids). Whatever it sends, the
socket must go on: a healthy peer next to it still talks to it, nothing inside
nanopy logs an ERROR, and at most the hostile pipe is closed.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator

import pytest
from conftest import wait_until
from faults import frame, raw_sp_client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nanopy
from nanopy.testing import wait_no_pipes, wait_pipes

pytestmark = [pytest.mark.fault, pytest.mark.usefixtures("no_nanopy_errors")]

# our protocol -> the healthy peer's protocol
PEERS = {
    "pull": "push", "push": "pull", "sub": "pub", "pub": "sub", "req": "rep", "rep": "req",
    "surveyor": "respondent", "respondent": "surveyor", "pair": "pair", "pair1": "pair1", "bus": "bus",
}
OPTS = {"recv_timeout": 5, "send_timeout": 5}
SINGLE_PEER = ("pair", "pair1")

word = st.integers(0, 0xFFFFFFFF).map(lambda n: n.to_bytes(4, "big"))
end_word = st.integers(0x80000000, 0xFFFFFFFF).map(lambda n: n.to_bytes(4, "big"))
payload = st.one_of(
    st.binary(max_size=40),
    st.tuples(st.lists(word, max_size=6), st.binary(max_size=16)).map(lambda t: b"".join(t[0]) + t[1]),
    st.tuples(st.lists(word, max_size=3), end_word, st.binary(max_size=16)).map(lambda t: b"".join(t[0]) + t[1] + t[2]),
    st.tuples(st.sampled_from([b"\x00\x00\x00", b"\x00\x00\x01", b"\x01\x00\x00"]), st.integers(0, 255),
              st.binary(max_size=16)).map(lambda t: t[0] + bytes([t[1]]) + t[2]),
)
markers = (b"marker-%d" % n for n in itertools.count())


@pytest.fixture(params=sorted(PEERS))
def pair_under_test(request: pytest.FixtureRequest) -> Iterator[tuple[nanopy.Socket, nanopy.Socket, str]]:
    ours = nanopy.Socket(request.param, resend_interval=0.2, **OPTS) if request.param == "req" \
        else nanopy.Socket(request.param, **OPTS)
    healthy = nanopy.Socket(PEERS[request.param], **OPTS)
    for s in (ours, healthy):
        if s.protocol == "sub":
            s.subscribe(b"")
    url = ours.bind("tcp://127.0.0.1:0").url
    if ours.protocol not in SINGLE_PEER:  # PAIR: the hostile peer must be the one peer
        healthy.connect(url)
        wait_pipes(ours)
        wait_pipes(healthy)
    if healthy.protocol in ("rep", "respondent"):
        threading.Thread(target=_echo, args=(healthy,), daemon=True).start()
    try:
        yield ours, healthy, url
    finally:
        healthy.close(linger=0)
        ours.close(linger=0)


def _echo(sock: nanopy.Socket) -> None:
    while True:
        try:
            msg = sock.recv_msg(timeout=None)
        except nanopy.Closed:
            return
        msg.reply(msg.body)


def _probe(ours: nanopy.Socket, healthy: nanopy.Socket) -> None:
    """``ours`` still works with its healthy peer (whatever the hostile one left queued)."""
    marker = next(markers)
    name = ours.protocol
    if name in ("pull", "sub", "pair", "pair1", "bus"):
        healthy.send(marker)
        _recv_until(ours, marker)
    elif name in ("rep", "respondent"):
        healthy.send(marker)
        msg = _recv_until(ours, marker)
        msg.reply(b"re:" + marker)
        assert healthy.recv() == b"re:" + marker
    elif name in ("req", "surveyor"):
        ours.send(marker)
        assert ours.recv() == marker  # the hostile peer's "replies" never match
    else:  # push, pub: the message may go to (or be dropped for) the hostile pipe: retry
        for _ in range(50):
            ours.send(marker)
            try:
                _recv_until(healthy, marker, timeout=0.1)
                return
            except nanopy.Timeout:
                continue
        pytest.fail(f"{name}: the healthy peer never got a message")


def _recv_until(sock: nanopy.Socket, marker: bytes, timeout: float = 5) -> nanopy.Message:
    while True:
        msg = sock.recv_msg(timeout=timeout)
        if msg.body == marker:
            return msg


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads=st.lists(payload, min_size=1, max_size=5))
def test_generated_payloads_after_a_correct_handshake(
    pair_under_test: tuple[nanopy.Socket, nanopy.Socket, str], payloads: list[bytes]
) -> None:
    ours, healthy, url = pair_under_test
    connects = ours.stats().connects
    hostile = raw_sp_client(url, ours._core.peer_id)
    try:
        try:
            hostile.sendall(b"".join(frame(p) for p in payloads))
        except OSError:
            pass  # closed on us already: allowed
        # Our side finishes its handshake a moment after the hostile's: until its pipe
        # is up, "no pipes" below would hold before it came and went (PAIR would
        # then refuse the healthy peer in its place).
        wait_until(lambda: ours.stats().connects > connects, what="the hostile pipe added")
        if ours.protocol not in SINGLE_PEER:
            _probe(ours, healthy)
    finally:
        hostile.close()  # FIN: what it sent is still read
    if ours.protocol in SINGLE_PEER:  # the hostile peer is gone: the next one is served
        wait_no_pipes(ours)
        ep = healthy.connect(url)
        wait_pipes(ours)
        wait_pipes(healthy)
        _probe(ours, healthy)
        ep.close()
        wait_no_pipes(ours)
    else:
        assert healthy.stats().pipes == 1  # the healthy pipe was never the one closed
