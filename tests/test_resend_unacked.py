"""``resend_unacked``: what a dying pipe's kernel held unacknowledged is sent again
(PUSH, raw REQ), or counted lost by number (issue 32, docs/partitions.md).

* the sent log (nanopy/pipe/sent_log.py), Sans-I/O: the kernel's unacknowledged byte
  count maps to exactly the messages whose frames end in those bytes, against a
  byte-by-byte model, through partial writes, control frames, failed writes and
  TLS slack; and it keeps about what the kernel holds, never more than its limit;
* on loopback, for each protocol that takes the option (PUSH over tcp and ws,
  raw REQ over tcp): a peer that reads nothing and then resets holds some
  messages in its receive buffer (it peeks them: those it has) while the rest
  waits in our kernel and queue. With the option, every message reaches the peer
  or the other one, in order; without it, exactly the missing ones are counted in
  ``lost_unacked_messages`` and as ``dead_pipe`` drops;
* the option is refused, with a nanopy error that says why, where it has no meaning.

The random partition nemesis across hosts is in tests/test_multihost_resend.py.
"""

from __future__ import annotations

import random
import socket
import struct
import time
from collections.abc import Callable

import pytest
from conftest import needs_platform, wait_until
from test_dead_peer import _sp_handshake, _stuck_listener, _ws_accept

import nanopy
from nanopy.pipe.sent_log import TRIM_BYTES, SentLog, frame_sizes
from nanopy.testing import wait_no_pipes, wait_pipes

pytestmark = pytest.mark.timeout(60)

PREFIX = 8  # SP over tcp: a u64 length before each payload


def sizes(batch: list[bytes]) -> list[int]:
    return [len(p) + PREFIX for p in batch]


class Model:
    """The byte stream a pipe wrote, byte by byte: which message each byte belongs to."""

    def __init__(self) -> None:
        self.owner: list[bytes | None] = []  # per stream byte: its message (None: a control frame)

    def chunk(self, batch: list[bytes]) -> None:
        for p in batch:
            self.owner += [p] * (len(p) + PREFIX)

    def control(self, n: int) -> None:
        self.owner += [None] * n

    def expected(self, taken: int, unacked: int) -> list[bytes]:
        """The messages whose last byte the peer did not acknowledge and whose
        first byte the kernel took, in order."""
        acked = taken - unacked
        out: list[bytes] = []
        seen: set[int] = set()
        ends: dict[int, int] = {}
        starts: dict[int, int] = {}
        for i, p in enumerate(self.owner):
            if p is not None:
                starts.setdefault(id(p), i)
                ends[id(p)] = i
        for p in self.owner:
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            if ends[id(p)] >= acked and starts[id(p)] < taken:
                out.append(p)
        return out


def _no_kernel() -> int | None:
    return None


def _messages(rng: random.Random, n: int) -> list[bytes]:
    return [b"%d:" % rng.randrange(1 << 30) + b"x" * rng.choice((0, 1, 7, 100, 1500, 9000)) for _ in range(n)]


@pytest.mark.parametrize("seed", range(40))
def test_unacked_bytes_map_to_exactly_the_messages_they_end(seed: int) -> None:
    rng = random.Random(seed)
    log = SentLog(_no_kernel, limit=1 << 40)
    model = Model()
    left = 0  # a chunk's rest not yet taken
    for _ in range(rng.randrange(1, 30)):
        if left:  # a chunk's rest goes before anything else
            log.advance(left)
            left = 0
        if rng.random() < 0.2:
            n = rng.randrange(2, 40)  # a control frame (a WebSocket PONG, a ZMTP PING)
            log.advance(n)
            model.control(n)
            continue
        batch = _messages(rng, rng.randrange(1, 12))
        length = sum(sizes(batch))
        taken = length if rng.random() < 0.7 else rng.randrange(length + 1)
        log.wrote(batch, length, taken)
        model.chunk(batch)
        left = length - taken
    taken_total = log.taken
    assert taken_total == len(model.owner) - left
    for unacked in {0, 1, PREFIX, rng.randrange(taken_total + 1), taken_total, taken_total + 50}:
        copy = SentLog(_no_kernel, limit=1 << 40)
        copy.writes.extend(log.writes)
        copy.taken = log.taken
        got = copy.unacked(unacked, sizes)
        assert got == model.expected(taken_total, unacked), (unacked, taken_total)


def test_a_partly_taken_chunk_leaves_its_untaken_messages_to_the_pipe() -> None:
    log = SentLog(_no_kernel, limit=1 << 20)
    batch = [b"a" * 92, b"b" * 92, b"c" * 92]  # frames of 100 bytes
    log.wrote(batch, 300, 150)  # the kernel took a, half of b; c waits in the pipe
    assert log.unacked(0, sizes) == [b"b" * 92]  # b's end never reached the peer; c is the pipe's
    log = SentLog(_no_kernel, limit=1 << 20)
    log.wrote(batch, 300, 150)
    assert log.unacked(120, sizes) == [b"a" * 92, b"b" * 92]


def test_a_failed_write_of_unknown_length_is_sent_again_whole() -> None:
    log = SentLog(_no_kernel, limit=1 << 20)
    first, second = [b"a" * 92], [b"b" * 92, b"c" * 92]
    log.wrote(first, 100, 100)
    log.wrote(second, 200, 200)  # a TLS write that failed: how much went is unknown
    log.doubt(200)
    assert log.unacked(0, sizes) == second  # the kernel holds nothing, yet they may never have gone


def test_tls_slack_covers_a_record_the_peer_got_part_of() -> None:
    batch = [b"m" * 1000 for _ in range(40)]  # 40 frames of 1008 bytes
    for unacked, lost in ((1, 17), (0, 0)):  # one byte unacknowledged: a record of up to 16 KiB is
        log = SentLog(_no_kernel, limit=1 << 20, slack=16 * 1024)  # lost; none: every record arrived
        log.wrote(batch, 40 * 1008, 40 * 1008)
        assert log.unacked(unacked, sizes) == batch[len(batch) - lost:]


def test_without_the_kernel_count_everything_kept_goes() -> None:
    log = SentLog(_no_kernel, limit=1 << 20)
    log.wrote([b"a", b"b"], 18, 18)
    log.wrote([b"c"], 9, 4)
    assert log.unacked(None, sizes) == [b"a", b"b", b"c"]


def test_a_batch_framed_otherwise_than_message_by_message_goes_whole() -> None:
    log = SentLog(_no_kernel, limit=1 << 20)
    log.wrote([b"a" * 10, b"b" * 10], 100, 100)  # 100 bytes: not 18 + 18
    assert log.unacked(1, sizes) == [b"a" * 10, b"b" * 10]


def test_frame_sizes_frame_each_payload_where_framing_varies() -> None:
    class Channel:
        def frame(self, payloads: list[bytes]) -> bytes:
            return b"".join(bytes([min(len(p), 126)]) * (2 if len(p) < 126 else 4) + p for p in payloads)

    assert frame_sizes(Channel(), -1)([b"x", b"y" * 200]) == [3, 204]
    assert frame_sizes(Channel(), 8)([b"x", b"y" * 200]) == [9, 208]


def test_the_log_keeps_about_what_the_kernel_holds() -> None:
    in_kernel = [0]
    log = SentLog(lambda: in_kernel[0], limit=1 << 30)
    batch = [b"p" * 992]  # 1000-byte frames
    for i in range(5000):  # 5 MB through a kernel that holds 300 kB unacknowledged
        log.wrote(batch, 1000, 1000)
        in_kernel[0] = min(300_000, (i + 1) * 1000)
        assert log.held_bytes() <= 300_000 + TRIM_BYTES + 1000
    assert len(log.unacked(in_kernel[0], sizes)) == 300  # what it forgot was acknowledged


def test_without_a_kernel_answer_the_log_keeps_its_limit() -> None:
    log = SentLog(_no_kernel, limit=200_000)
    for _ in range(3000):
        log.wrote([b"p" * 992], 1000, 1000)
        assert log.held_bytes() <= 200_000 + TRIM_BYTES + 1000


# -- the option --------------------------------------------------------------------------


@pytest.mark.parametrize(("protocol", "raw"), [("push", False), ("req", True)])
def test_the_option_is_off_by_default_and_taken_where_it_means_something(protocol: str, raw: bool) -> None:
    with nanopy.Socket(protocol, raw=raw) as sock:
        assert sock.resend_unacked is False
        sock.resend_unacked = True
        assert sock.resend_unacked is True
        with pytest.raises(TypeError, match="resend_unacked"):
            sock.resend_unacked = 1  # type: ignore[assignment]
    with nanopy.Socket(protocol, raw=raw, resend_unacked=True) as sock:
        assert sock.resend_unacked


@pytest.mark.parametrize(("protocol", "raw", "why"), [
    ("req", False, "already sends every request again"),
    ("pub", False, "only PUSH and raw REQ"),
    ("pair", False, "only PUSH and raw REQ"),
    ("rep", True, "only PUSH and raw REQ"),
    ("surveyor", False, "only PUSH and raw REQ"),
])
def test_the_option_is_refused_where_it_means_nothing(protocol: str, raw: bool, why: str) -> None:
    with pytest.raises(nanopy.ProtocolError, match=why):
        nanopy.Socket(protocol, raw=raw, resend_unacked=True)
    with nanopy.Socket(protocol, raw=raw) as sock:
        sock.resend_unacked = False  # (off is always fine)
        with pytest.raises(nanopy.ProtocolError, match="resend_unacked"):
            sock.resend_unacked = True
        assert sock.resend_unacked is False


# -- tcp loopback: a peer that read nothing resets -------------------------------------------------


def _body(n: int) -> bytes:
    return b"%06d" % n + b"x" * (200 + n * 7919 % 4000)  # sizes vary: the mapping is per message


def _peek_frames(conn: socket.socket, header: int) -> list[int]:
    """The sequence numbers of the whole messages in ``conn``'s receive buffer
    (peeked: the window stays closed, nothing more arrives)."""
    data = conn.recv(32 << 20, socket.MSG_PEEK)
    seqs, i = [], 0
    while i + 8 <= len(data):
        size = int.from_bytes(data[i:i + 8], "big")
        if i + 8 + size > len(data):
            break  # the message its kernel has only part of
        seqs.append(int(data[i + 8 + header:i + 14 + header]))
        i += 8 + size
    return seqs


def _peek_ws_frames(conn: socket.socket, header: int) -> list[int]:
    """As _peek_frames, for a client's masked WebSocket data frames (PINGs skipped)."""
    data = conn.recv(32 << 20, socket.MSG_PEEK)
    seqs, i = [], 0
    while i + 2 <= len(data):
        opcode, size = data[i] & 0x0F, data[i + 1] & 0x7F
        at = i + 2
        if size >= 126:
            width = 2 if size == 126 else 8
            if at + width > len(data):
                break
            size, at = int.from_bytes(data[at:at + width], "big"), at + width
        if at + 4 + size > len(data):
            break  # the message its kernel has only part of
        mask, body = data[at:at + 4], data[at + 4:at + 4 + size]
        if opcode == 0x2:
            seqs.append(int(bytes(b ^ mask[k % 4] for k, b in enumerate(body[header:header + 6]))))
        i = at + 4 + size
    return seqs


SendFn = Callable[[nanopy.Socket, int], None]


def _push_send(sock: nanopy.Socket, n: int) -> None:
    sock.send(_body(n))


def _raw_req_send(sock: nanopy.Socket, n: int) -> None:
    sock.send_msg(nanopy.Message(_body(n), header=struct.pack("!I", 0x80000000 | n)))


CASES = {  # (protocol, transport): (socket kwargs, the peer's protocol id, the good peer, send, header bytes)
    ("push", "tcp"): ({"protocol": "push"}, 0x51, ("pull", False), _push_send, 0),
    ("raw req", "tcp"): ({"protocol": "req", "raw": True}, 0x31, ("rep", True), _raw_req_send, 4),
    ("push", "ws"): ({"protocol": "push"}, 0x51, ("pull", False), _push_send, 0),  # (frames sized one by one)
}


def _until_accounted(sender: nanopy.Socket, good: nanopy.Socket, count: int, has: list[int]) -> list[int]:
    """What ``good`` receives until every message is there or counted lost with
    the dead pipe (gone from ``sender``), or 15 s passed (the asserts then say what)."""
    got: list[int] = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            got.append(int(good.recv_msg(timeout=0.2).body[:6]))
        except nanopy.Timeout:
            pass
        stats = sender.stats()
        if stats.pipes == 1 and len(set(has) | set(got)) + stats.lost_unacked_messages >= count:
            break
    return got


@needs_platform("unacked_bytes")
@pytest.mark.parametrize("resend", [True, False], ids=["resend", "count"])
@pytest.mark.parametrize("case", list(CASES), ids=[f"{p}-{t}" for p, t in CASES])
def test_peer_reset_with_unread_data(case: tuple[str, str], resend: bool) -> None:
    kwargs, peer_id, (good_protocol, good_raw), send, header = CASES[case]
    transport = case[1]
    if transport == "ws":
        pytest.importorskip("websockets")
    server, stuck_url = _stuck_listener("tcp")
    if transport == "ws":
        stuck_url = stuck_url.replace("tcp://", "ws://") + "/"
    peek = _peek_ws_frames if transport == "ws" else _peek_frames
    with nanopy.Socket(**kwargs, send_buffer=50, send_timeout=0.5, resend_unacked=resend) as sender, \
            nanopy.Socket(good_protocol, raw=good_raw) as good:
        good.bind("tcp://127.0.0.1:0")
        sender.connect(stuck_url, priority=1)
        conn, _ = server.accept()
        if transport == "ws":
            _ws_accept(conn, b"pull.sp.nanomsg.org")
        else:
            _sp_handshake(conn, peer_id)
        wait_pipes(sender)
        count = 0
        while True:  # into the stuck peer's receive buffer, our kernel, then our queue
            try:
                send(sender, count + 1)
            except nanopy.Timeout:
                break
            count += 1
        sender.connect(good.endpoints[0].url, priority=2)
        wait_pipes(sender, 2)
        has = peek(conn, header)  # what the reset peer got whole
        assert has == list(range(1, len(has) + 1))
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()  # RST: its receive buffer goes, our kernel's part was never acknowledged
        got = _until_accounted(sender, good, count, has)
        stats = sender.stats()
    server.close()
    assert got == sorted(set(got)), f"out of order or twice: {got[:20]}"
    missing = sorted(set(range(1, count + 1)) - set(has) - set(got))
    twice = set(has) & set(got)
    print(f"{case[0]}/{transport} resend={resend}: sent {count}, the peer had {len(has)}, "
          f"resent {stats.messages_resent}, requeued {stats.messages_requeued}, lost {len(missing)} "
          f"(counted {stats.lost_unacked_messages}), twice {len(twice)}")
    assert count > len(has) + stats.messages_requeued  # (some in the peer, more in our kernel)
    if resend:
        assert missing == [] and len(twice) <= stats.messages_resent
        assert stats.messages_resent + stats.messages_requeued == count - len(has) + len(twice)
        assert stats.lost_unacked_messages == stats.drops["dead_pipe"] == 0
        assert stats.lost_unacked_bytes == stats.lost_pipes_unacked == 0  # (sent again: no loss)
    else:
        assert twice == set() and stats.messages_resent == 0
        assert missing == list(range(len(has) + 1, missing[-1] + 1))  # one run, right after the peer's
        assert len(missing) == stats.lost_unacked_messages == stats.drops["dead_pipe"] == stats.dropped
        assert stats.lost_pipes_unacked == 1 and stats.lost_unacked_bytes > 0


@needs_platform("unacked_bytes")
@pytest.mark.parametrize("scheme", ["tcp", "ws", "tls+tcp", "wss", "zmtp+tcp"])
def test_a_peer_that_got_everything_and_left_gets_nothing_again(scheme: str) -> None:
    """Every stream transport over TCP keeps a log (TLS with a record's slack), and a
    pipe whose peer acknowledged everything before it closed sends nothing again."""
    if scheme in ("ws", "wss"):
        pytest.importorskip("websockets")
    secure = scheme in ("tls+tcp", "wss")
    bind, dial = {}, {}
    if secure:
        from tls_certs import tls_files

        bind, dial = {"ssl_context": tls_files().server_ctx}, {"ssl_context": tls_files().client_ctx}
    with nanopy.Socket("push", resend_unacked=True) as push, nanopy.Socket("pull") as pull:
        url = pull.bind(f"{scheme}://127.0.0.1:0" + ("/resend" if scheme in ("ws", "wss") else ""), **bind).url
        push.connect(url, **dial)
        wait_pipes(push)
        for n in range(1, 301):
            push.send(_body(n))
        assert [int(pull.recv(timeout=10)[:6]) for _ in range(300)] == list(range(1, 301))
        (log,) = [d.sent_log for d in push._driver.pipe_drivers()]  # type: ignore[attr-defined]
        assert log is not None
        # The writer notes a write once the kernel took it: the peer may read the last
        # bytes before that thread is back from the system call.
        wait_until(lambda: log.taken > sum(map(len, map(_body, range(1, 301)))), what="the last write noted")
        assert log.slack == (16 * 1024 if secure else 0)
        pull.close()
        wait_no_pipes(push)
        stats = push.stats()
        assert stats.messages_resent == stats.lost_unacked_messages == stats.lost_unacked_bytes == 0


@needs_platform("unacked_bytes")
def test_a_protocol_that_never_sends_again_keeps_no_log() -> None:
    """The pipe keeps a sent log only when its socket's protocol may send a message
    again (PUSH, raw REQ: ``PipeDriver(..., resends)``); a PAIR over tcp keeps none."""
    with nanopy.Socket("pair") as a, nanopy.Socket("pair") as b:
        b.connect(a.bind("tcp://127.0.0.1:0").url)
        wait_pipes(b)
        b.send(b"m")
        assert a.recv(timeout=5) == b"m"
        assert [d.sent_log for d in b._driver.pipe_drivers()] == [None]  # type: ignore[attr-defined]


def test_ipc_keeps_no_log() -> None:
    """Over ipc a message the kernel took is in the peer's receive queue: nothing is
    ever unacknowledged, so the option changes nothing and costs nothing."""
    from nanopy.testing import connect_pair, ipc_url

    with nanopy.Socket("push", resend_unacked=True) as push, nanopy.Socket("pull") as pull:
        connect_pair(pull, push, ipc_url("resend"))
        push.send(b"m")
        assert pull.recv(timeout=5) == b"m"
        assert [d.sent_log for d in push._driver.pipe_drivers()] == [None]  # type: ignore[attr-defined]
