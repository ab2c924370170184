"""The SP stream codec (nanopy/core/wire.py): connection header and u64 framing."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanopy import MessageTooLarge, RemoteProtocolError
from nanopy.core.wire import HEADER_SIZE, FrameDecoder, encode_frame, encode_frames, encode_header, parse_header

# -- connection header ---------------------------------------------------------------


def test_header_bytes_match_the_spec() -> None:
    assert encode_header(0x30) == bytes.fromhex("0053500000300000")  # REQ
    assert encode_header(0x10) == bytes.fromhex("0053500000100000")  # PAIR v0
    assert encode_header(0x50) == b"\x00SP\x00\x00\x50\x00\x00"  # PUSH
    assert len(encode_header(0x51)) == HEADER_SIZE == 8


def test_header_carries_16_bit_protocol_ids() -> None:
    assert encode_header(0xABCD)[4:6] == b"\xab\xcd"
    assert parse_header(encode_header(0xABCD), 0xABCD) == 0xABCD


def test_parse_header_accepts_the_expected_peer() -> None:
    assert parse_header(encode_header(0x51), 0x51) == 0x51


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00SP\x00\x00\x51\x00",  # short
        b"\x00SP\x00\x00\x51\x00\x00\x00",  # long
        b"GET / HT",  # an HTTP client
        b"\x01SP\x00\x00\x51\x00\x00",  # bad magic
        b"\x00SP\x01\x00\x51\x00\x00",  # version 1
        b"\x00SP\x00\x00\x51\x01\x01",  # reserved bytes set (NNG rejects, so do we)
        b"\x00SP\x00\x00\x50\x00\x00",  # a PUSH talking to a PUSH
        b"\x00SP\x00\x00\x00\x00\x00",
    ],
)
def test_parse_header_rejects(data: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        parse_header(data, 0x51)


def test_incompatible_peer_message_names_both_ids() -> None:
    with pytest.raises(RemoteProtocolError, match="0x50.*0x51"):
        parse_header(encode_header(0x50), 0x51)


# -- encoding ------------------------------------------------------------------------


def test_tcp_frame_layout() -> None:
    body = bytes.fromhex("800000016869")
    assert encode_frame(body) == bytes.fromhex("0000000000000006800000016869")
    assert encode_frame(b"") == b"\x00" * 8


def test_ipc_frame_layout() -> None:
    assert encode_frame(b"hey", ipc=True) == bytes.fromhex("010000000000000003") + b"hey"
    assert encode_frame(b"", ipc=True) == b"\x01" + b"\x00" * 8


@pytest.mark.parametrize("ipc", [False, True])
def test_encode_frames_is_the_concatenation_of_frames(ipc: bool) -> None:
    payloads = [b"", b"a", b"bc" * 100, bytes(range(256))]
    assert encode_frames(payloads, ipc) == b"".join(encode_frame(p, ipc) for p in payloads)
    assert encode_frames([], ipc) == b""


# -- decoding ------------------------------------------------------------------------


@pytest.mark.parametrize("ipc", [False, True])
def test_decoder_returns_every_complete_frame_of_a_chunk(ipc: bool) -> None:
    payloads = [b"one", b"", b"three"]
    dec = FrameDecoder(ipc)
    assert dec.feed(encode_frames(payloads, ipc)) == payloads
    assert dec.pending == 0


@pytest.mark.parametrize("ipc", [False, True])
def test_decoder_byte_by_byte(ipc: bool) -> None:
    payloads = [b"", b"x", b"hello world" * 30, b""]
    wire = encode_frames(payloads, ipc)
    dec = FrameDecoder(ipc)
    out: list[bytes] = []
    for i in range(len(wire)):
        out.extend(dec.feed(wire[i : i + 1]))
    assert out == payloads
    assert dec.pending == 0


def test_decoder_large_payload_in_pieces_and_pending_count() -> None:
    body = bytes(range(256)) * 4096  # 1 MiB
    wire = encode_frame(body) + encode_frame(b"next")
    dec = FrameDecoder(max_size=0)
    assert dec.feed(wire[:5]) == []
    assert dec.pending == 5
    assert dec.feed(wire[5:1000]) == []
    assert dec.pending == 1000 - 8  # the prefix is consumed, the payload is held
    assert dec.feed(wire[1000:-3]) == [body]
    assert dec.pending == 1  # the prefix of "next" is parsed; 1 payload byte held
    assert dec.feed(wire[-3:]) == [b"next"]
    assert dec.pending == 0


def test_decoder_chunk_ending_exactly_at_a_payload_end() -> None:
    body = b"z" * 1000
    wire = encode_frame(body) + encode_frame(b"a")
    dec = FrameDecoder()
    assert dec.feed(wire[:100]) == []
    assert dec.feed(wire[100 : 8 + 1000]) == [body]
    assert dec.feed(wire[8 + 1000 :]) == [b"a"]


@settings(max_examples=150, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=300), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=20),
    ipc=st.booleans(),
)
def test_decoder_any_chunking_yields_the_same_frames(
    payloads: list[bytes], cuts: list[int], ipc: bool
) -> None:
    dec, out = _fed_in_pieces(payloads, cuts, ipc, 300)
    assert out == payloads
    assert dec.pending == 0


def _fed_in_pieces(payloads: list[bytes], cuts: list[int], ipc: bool, limit: int) -> tuple[FrameDecoder, list[bytes]]:
    """A decoder fed ``payloads``' frames cut at ``cuts`` (taken modulo the length), and what it returned."""
    wire = encode_frames(payloads, ipc)
    points = sorted({c % (len(wire) + 1) for c in cuts} | {0, len(wire)})
    dec = FrameDecoder(ipc, max_size=limit)
    out: list[bytes] = []
    for a, b in itertools.pairwise(points):
        out.extend(dec.feed(wire[a:b]))
    return dec, out


@pytest.mark.parametrize("ipc", [False, True])
def test_decoder_limit_is_checked_before_the_payload_arrives(ipc: bool) -> None:
    dec = FrameDecoder(ipc, max_size=10)
    assert dec.feed(encode_frame(b"0123456789", ipc)) == [b"0123456789"]  # == limit is fine
    prefix = encode_frame(b"x" * 11, ipc)[: 9 if ipc else 8]
    with pytest.raises(MessageTooLarge, match="11"):
        dec.feed(prefix)  # no payload byte sent yet


def test_decoder_hostile_length_never_allocates() -> None:
    dec = FrameDecoder(max_size=1 << 20)
    with pytest.raises(MessageTooLarge):
        dec.feed(struct.pack(">Q", 2**63))
    dec = FrameDecoder(max_size=1 << 20)
    with pytest.raises(MessageTooLarge):
        dec.feed(struct.pack(">Q", 2**64 - 1) + b"abc")


def test_decoder_without_limit_waits_for_a_huge_payload() -> None:
    dec = FrameDecoder(max_size=0)
    assert dec.feed(struct.pack(">Q", 2**40) + b"abc") == []
    assert dec.pending == 3


@pytest.mark.parametrize("ipc", [False, True])
def test_decoder_delivers_complete_frames_before_a_violation(ipc: bool) -> None:
    # Good frames in the same chunk as the bad prefix are handed over first, so
    # what arrives does not depend on how TCP cut the stream; the error follows.
    dec = FrameDecoder(ipc, max_size=4)
    assert dec.error is None
    assert dec.feed(encode_frames([b"ok", b"ok2"], ipc) + encode_frame(b"too long", ipc)) == [b"ok", b"ok2"]
    assert isinstance(dec.error, MessageTooLarge)
    with pytest.raises(MessageTooLarge):
        dec.feed(b"")
    with pytest.raises(MessageTooLarge):
        dec.feed(encode_frame(b"ok", ipc))  # the stream is dead for good


def test_ipc_decoder_delivers_frames_before_a_bad_type() -> None:
    dec = FrameDecoder(ipc=True)
    good = encode_frame(b"a", ipc=True)
    assert dec.feed(good + b"\x02" + good[1:]) == [b"a"]
    with pytest.raises(RemoteProtocolError):
        dec.feed(good)


@pytest.mark.parametrize("kind", [0, 2, 0xFF])
def test_ipc_decoder_rejects_other_message_types(kind: int) -> None:
    dec = FrameDecoder(ipc=True)
    with pytest.raises(RemoteProtocolError):
        dec.feed(bytes([kind]) + struct.pack(">Q", 1) + b"x")


def test_ipc_decoder_rejects_a_bad_type_after_a_good_frame() -> None:
    dec = FrameDecoder(ipc=True)
    good = encode_frame(b"a", ipc=True)
    assert dec.feed(good) == [b"a"]
    with pytest.raises(RemoteProtocolError):
        dec.feed(b"\x02" + good[1:])


def test_tcp_decoder_has_no_type_byte() -> None:
    # A tcp frame whose first byte is 1 is simply a big length.
    dec = FrameDecoder(ipc=False, max_size=100)
    with pytest.raises(MessageTooLarge):
        dec.feed(encode_frame(b"hey", ipc=True))


def test_decoder_returns_bytes_objects() -> None:
    dec = FrameDecoder()
    (out,) = dec.feed(bytearray(encode_frame(b"abc")))
    assert bytes(out) == b"abc"
    (out,) = dec.feed(encode_frame(b"abc"))
    assert type(out) is bytes


@settings(max_examples=150, deadline=None)
@given(
    size=st.integers(min_value=0, max_value=40),
    count=st.integers(min_value=0, max_value=200),  # (past a block of 64)
    odd=st.one_of(st.none(), st.tuples(st.integers(min_value=0, max_value=199), st.binary(max_size=50))),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=6),
    ipc=st.booleans(),
)
def test_decoder_cuts_a_run_of_equal_frames_as_one_by_one(
    size: int, count: int, odd: tuple[int, bytes] | None, cuts: list[int], ipc: bool
) -> None:
    # Equal frames (a batch of one size) are cut in one pass: the same payloads, as
    # bytes, whatever the chunking and wherever a frame of another size sits.
    payloads = [bytes([i % 256]) * size for i in range(count)]
    if odd is not None and payloads:
        payloads[odd[0] % count] = odd[1]
    dec, out = _fed_in_pieces(payloads, cuts, ipc, 100)
    assert out == payloads
    assert all(type(p) is bytes for p in out)
    assert dec.pending == 0


@pytest.mark.parametrize("ipc", [False, True])
def test_decoder_run_of_equal_frames_then_a_violation(ipc: bool) -> None:
    # Frames after a run of equal ones are still checked: the run comes out, the
    # oversized frame's error waits for the next feed.
    wire = encode_frames([b"abc"] * 20, ipc) + encode_frame(b"x" * 200, ipc)
    dec = FrameDecoder(ipc, max_size=100)
    assert dec.feed(wire) == [b"abc"] * 20
    with pytest.raises(MessageTooLarge):
        dec.feed(b"")
