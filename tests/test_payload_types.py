"""Protocol cores work with every payload type a transport could hand them (issue 10, defect 1).

The transport -> core contract is ``bytes`` (docs/transports.md), but a core must
not crash or misbehave on a ``bytearray`` or ``memoryview``: a SUB whose radix
match raised ``TypeError: unhashable type: 'bytearray'`` on one-byte topics lost
every message. Two Sans-I/O cores are wired back to back here, every payload
converted to the type under test on its way, for every protocol pair, with
empty, one-byte and multi-byte bodies and topics.
"""

from __future__ import annotations

from typing import Any

import pytest

from nanopy.core.base import ARM_TIMER, CANCEL_TIMER, READY, READY_CALLER, TRANSMIT, PipeInfo
from nanopy.core.errors import WouldBlock
from nanopy.core.options import new_options
from nanopy.protocols._registry import protocols

PAYLOAD_TYPES = [bytes, bytearray, memoryview]
BODIES = [b"", b"a", b"ab", b"multi-byte body \x00\xff" * 20]
TOPICS = [b"", b"a", b"ab"]


def _core(name: str) -> Any:
    core = protocols.get(name)(new_options(name))
    core.add_pipe(PipeInfo(1, f"pipe-of-{name}", 8, 8), 64)
    return core


def _ferry(src: Any, dst: Any, kind: type) -> None:
    """Carry src's TRANSMITs to dst as ``kind`` payloads (what a transport would do)."""
    payloads = [kind(a[2]) for a in src.actions if a[0] == TRANSMIT]
    src.actions.clear()
    if payloads:
        dst.messages_received(1, payloads)
    # READY, READY_CALLER: a request's caller is woken
    allowed = (TRANSMIT, ARM_TIMER, CANCEL_TIMER, READY, READY_CALLER)
    assert not any(a[0] not in allowed for a in dst.actions), dst.actions


def _recv_all(core: Any) -> list[bytes]:
    out = []
    while True:
        try:
            out.append(bytes(core.recv_body()))
        except WouldBlock:
            return out


@pytest.mark.parametrize("kind", PAYLOAD_TYPES, ids=lambda k: k.__name__)
@pytest.mark.parametrize(
    ("sender", "receiver"), [("push", "pull"), ("pair", "pair"), ("pair1", "pair1"), ("bus", "bus")]
)
def test_one_way_cores_take_every_payload_type(sender: str, receiver: str, kind: type) -> None:
    a, b = _core(sender), _core(receiver)
    for body in BODIES:
        a.send(body)
    _ferry(a, b, kind)
    assert _recv_all(b) == BODIES
    assert b.protocol_errors == 0


@pytest.mark.parametrize("kind", PAYLOAD_TYPES, ids=lambda k: k.__name__)
@pytest.mark.parametrize(("asker", "answerer"), [("req", "rep"), ("surveyor", "respondent")])
def test_request_cores_take_every_payload_type(asker: str, answerer: str, kind: type) -> None:
    a, b = _core(asker), _core(answerer)
    for body in BODIES:
        a.send(body)
        _ferry(a, b, kind)
        assert bytes(b.recv().body) == body
        b.send(body[::-1])
        _ferry(b, a, kind)
        assert bytes(a.recv().body) == body[::-1]
    assert a.protocol_errors == b.protocol_errors == 0


@pytest.mark.parametrize("kind", PAYLOAD_TYPES, ids=lambda k: k.__name__)
@pytest.mark.parametrize("topic", TOPICS, ids=["empty", "one-byte", "two-byte"])
def test_sub_core_matches_every_payload_type(topic: bytes, kind: type) -> None:
    pub, sub = _core("pub"), _core("sub")
    sub.subscribe(topic)
    sent = [b"", b"a", b"ab", b"abc", b"b", b"ba", b"\xff"]
    for body in sent:
        pub.send(body)
    _ferry(pub, sub, kind)
    assert _recv_all(sub) == [m for m in sent if m.startswith(topic)]


@pytest.mark.parametrize("kind", [bytearray, memoryview], ids=lambda k: k.__name__)
def test_subscribing_with_a_buffer_stores_an_immutable_topic(kind: type) -> None:
    sub = _core("sub")
    topic = bytearray(b"a")
    sub.subscribe(kind(topic))
    topic[0] = ord("z")  # the caller reuses its buffer
    pub = _core("pub")
    pub.send(b"abc")
    pub.send(b"zed")
    _ferry(pub, sub, bytes)
    assert _recv_all(sub) == [b"abc"]
