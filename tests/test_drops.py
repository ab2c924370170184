"""Drop accounting: known traffic through every drop path, and the counts add up exactly.

Each test sends a known number of messages through real sockets and checks that
what arrived plus what each socket counted as dropped (by reason) is exactly what
was sent; ``stats().dropped`` is always the sum of ``stats().drops``.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import bind_url, wait_until
from faults import frame, raw_sp_client

import nanopy
from nanopy.core.drops import DROP_REASONS
from nanopy.testing import connect_pair, wait_no_pipes, wait_pipes

MakeSocket = Callable[..., nanopy.Socket]


def drops(sock: nanopy.Socket) -> dict[str, int]:
    """The socket's drops by reason, checked to add up to its totals."""
    stats = sock.stats()
    assert tuple(stats.drops) == DROP_REASONS
    assert stats.dropped == sum(stats.drops.values()) == stats.messages_dropped == stats["dropped"]
    return dict(stats.drops)


def only(**expected: int) -> dict[str, int]:
    """Every reason at zero but those given."""
    return {reason: expected.get(reason, 0) for reason in DROP_REASONS}


def drain(sock: nanopy.Socket, quiet: float = 0.3) -> list[bytes]:
    """Receive until nothing comes for ``quiet`` seconds."""
    got = []
    while True:
        try:
            got.append(sock.recv(timeout=quiet))
        except nanopy.Timeout:
            return got


@pytest.mark.parametrize("mode", ["drop", "drop-newest", "block"])
@pytest.mark.parametrize("transport", ["inproc", "tcp"])
def test_pub_sub_full_queues_add_up(make_socket: MakeSocket, transport: str, mode: str) -> None:
    # A SUB that reads nothing while 3000 messages go out: its queue fills, then
    # (block) the PUB's pipe does, or (drop modes) the SUB discards. Whatever the
    # split, received + the SUB's drops + the PUB's drops == sent, exactly.
    n = 3000
    pub = make_socket("pub", send_buffer=8)
    sub = make_socket("sub", recv_buffer=8, overflow=mode)
    sub.subscribe(b"")
    connect_pair(pub, sub, bind_url(transport, f"full-{mode}"))
    for i in range(n):
        pub.send(struct.pack(">I", i))
    wait_until(lambda: pub.stats().queued_out == 0, what="the PUB's queue written")
    got: list[bytes] = []

    def settled() -> bool:
        got.extend(drain(sub, 0.1))
        return len(got) + drops(sub)["queue_full"] + drops(pub)["queue_full"] == n

    wait_until(settled, timeout=20, what="every message received or counted as dropped")
    assert pub.stats().messages_sent == n
    assert drops(pub) == only(queue_full=n - len(got) - drops(sub)["queue_full"])
    assert drops(sub) == only(queue_full=n - len(got) - drops(pub)["queue_full"])
    seqs = [struct.unpack(">I", body)[0] for body in got]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # in order, none twice
    if mode == "block":
        assert drops(sub)["queue_full"] == 0 and drops(pub)["queue_full"] > 0
    else:
        # (some end discarded: the SUB when its queue filled, or -- when the PUB's
        # writer got no turn while the loop sent -- the PUB, and then the few that
        # reached the SUB fit its queue; the sums above hold either way)
        assert drops(sub)["queue_full"] + drops(pub)["queue_full"] > 0
    if mode == "drop-newest" and drops(pub)["queue_full"] == 0:
        assert seqs[:8] == list(range(8))  # the first ones were kept, later ones discarded
    # Each socket's one pipe carries all of its drops.
    (pub_pipe,) = pub.pipes()
    assert pub_pipe.dropped == drops(pub)["queue_full"]
    (sub_pipe,) = sub.pipes()
    assert sub_pipe.dropped == drops(sub)["queue_full"]


def test_no_peer(make_socket: MakeSocket) -> None:
    pub, bus, surveyor = make_socket("pub"), make_socket("bus"), make_socket("surveyor")
    for _ in range(3):
        pub.send(b"nobody listens")
        bus.send(b"nobody listens")
    surveyor.send(b"anyone?")
    assert drops(pub) == only(no_peer=3)
    assert drops(bus) == only(no_peer=3)
    assert drops(surveyor) == only(no_peer=1)


def test_unsubscribed(make_socket: MakeSocket) -> None:
    pub, sub = make_socket("pub"), make_socket("sub", recv_timeout=5)
    sub.subscribe(b"a")
    connect_pair(pub, sub, bind_url("tcp", "unsub"))
    for i in range(10):
        pub.send(b"a%d" % i)
        pub.send(b"b%d" % i)
        pub.send(b"c%d" % i)
    pub.send(b"a-end")  # one pipe keeps order: every b and c was filtered before this
    got = [sub.recv() for _ in range(11)]
    assert got[-1] == b"a-end" and all(body.startswith(b"a") for body in got)
    assert drops(sub) == only(unsubscribed=20)
    assert sub.pipes()[0].dropped == 20
    assert drops(pub) == only()


def test_too_large(make_socket: MakeSocket) -> None:
    pull = make_socket("pull", recv_max_size=100)
    push = make_socket("push")
    connect_pair(pull, push, bind_url("tcp", "large"))
    push.send(b"x" * 1000)
    wait_until(lambda: drops(pull)["too_large"] == 1, what="the large message counted")
    stats = pull.stats()
    assert drops(pull) == only(too_large=1)
    assert stats.messages_too_large == 1 and stats.protocol_errors == 1


def test_ttl_exceeded(make_socket: MakeSocket) -> None:
    # PAIR1: a raw sender forges a hop count above the receiver's max_ttl.
    src = make_socket("pair1", raw=True)
    dst = make_socket("pair1", max_ttl=3, recv_timeout=5)
    connect_pair(dst, src, bind_url("tcp", "ttl1"))
    for _ in range(4):
        src.send_msg(nanopy.Message(b"looped", header=b"\x00\x00\x00\x05"))  # arrives with 6 hops
    src.send_msg(nanopy.Message(b"fine", header=b"\x00\x00\x00\x01"))
    assert dst.recv() == b"fine"
    assert drops(dst) == only(ttl_exceeded=4)
    # REP: a raw REQ sends a backtrace of three words to a REP allowing two.
    rep = make_socket("rep", max_ttl=2, recv_timeout=5)
    req = make_socket("req", raw=True)
    connect_pair(rep, req, bind_url("tcp", "ttl2"))
    req.send_msg(nanopy.Message(b"far", header=struct.pack(">III", 1, 2, 0x80000001)))
    req.send_msg(nanopy.Message(b"near", header=struct.pack(">I", 0x80000002)))
    assert rep.recv() == b"near"
    assert drops(rep) == only(ttl_exceeded=1)


def test_unroutable_reply(make_socket: MakeSocket) -> None:
    rep = make_socket("rep", recv_timeout=5)
    req = make_socket("req")
    connect_pair(rep, req, bind_url("tcp", "unroutable"))
    req.send(b"question")
    msg = rep.recv_msg()
    req.close(linger=0)
    wait_no_pipes(rep)
    msg.reply(b"answer to nobody")
    assert drops(rep) == only(unroutable=1)


def test_cancelled_replies(make_socket: MakeSocket) -> None:
    rep = make_socket("rep", recv_timeout=5)
    req = make_socket("req", recv_timeout=5)
    connect_pair(rep, req, bind_url("tcp", "cancelled"))
    # A reply to a request its caller abandoned (a newer send) is dropped on arrival.
    req.send(b"1")
    m1 = rep.recv_msg()
    req.send(b"2")
    m2 = rep.recv_msg()
    m1.reply(b"late")
    m2.reply(b"re:2")
    assert req.recv() == b"re:2"
    wait_until(lambda: drops(req)["cancelled"] == 1, what="the late reply counted")
    # A reply that arrived but is never taken: the request is replaced.
    req.send(b"3")
    rep.recv_msg().reply(b"re:3")
    assert nanopy.poll([(req, nanopy.POLLIN)], timeout=5) == [(req, nanopy.POLLIN)]
    req.send(b"4")  # abandons 3, whose reply was waiting
    rep.recv_msg().reply(b"re:4")
    assert req.recv() == b"re:4"
    assert drops(req) == only(cancelled=2)
    assert drops(rep) == only()


def test_cancelled_survey_answers(make_socket: MakeSocket) -> None:
    surveyor = make_socket("surveyor", survey_deadline=5.0, recv_timeout=5)
    respondent = make_socket("respondent", recv_timeout=5)
    connect_pair(surveyor, respondent, bind_url("tcp", "survey"))
    surveyor.send(b"first")
    first = respondent.recv_msg()
    surveyor.send(b"second")  # the first survey is over: its answers are not wanted
    second = respondent.recv_msg()
    first.reply(b"too late")
    second.reply(b"in time")
    assert surveyor.recv() == b"in time"
    wait_until(lambda: drops(surveyor)["cancelled"] == 1, what="the late answer counted")
    assert drops(surveyor) == only(cancelled=1)


def test_protocol_error(make_socket: MakeSocket) -> None:
    # A REP peer answering without a request id: its message is discarded with its pipe.
    req = make_socket("req")
    url = req.bind(bind_url("tcp", "proto")).url
    raw = raw_sp_client(url, 0x31)  # speaks REP
    try:
        wait_pipes(req)
        raw.sendall(frame(b"\x00\x01"))
        wait_until(lambda: req.stats().protocol_errors == 1, what="the bad peer closed")
        assert drops(req) == only(protocol_error=1)
    finally:
        raw.close()


def test_count_drop_hook_counts_with_a_reason_and_a_pipe(make_socket: MakeSocket) -> None:
    # The engine side's call (a pipe found dead with unwritten messages uses it).
    push, pull = make_socket("push"), make_socket("pull")
    connect_pair(pull, push, bind_url("inproc", "hook"))
    (pipe,) = push.pipes
    push._driver.count_drop("dead_pipe", 3, pipe.id)
    push._driver.count_drop("dead_pipe", 0, pipe.id)  # (nothing lost: nothing counted)
    assert drops(push) == only(dead_pipe=3)
    assert pipe.stats().dropped == 3
    with pytest.raises(KeyError):
        push._driver.count_drop("no such reason")


def test_a_transmit_for_a_pipe_removed_meanwhile_is_a_dead_pipe_drop() -> None:
    # The core chose pipe 7 in a round; its driver is gone before the TRANSMIT runs.
    # PAIR does not requeue: the payload is lost with the pipe, and counted.
    from nanopy.core.base import PipeInfo
    from nanopy.core.options import new_options
    from nanopy.driver.socket_driver import SocketDriver
    from nanopy.protocols.pair import Pair0

    core = Pair0(new_options("pair"))
    driver = SocketDriver(core, lambda: "t", lambda: None)  # type: ignore[arg-type,return-value]
    core.add_pipe(PipeInfo(7, None, 8, 8), 4)
    assert driver.try_send(b"lost", b"")
    assert core.drops["dead_pipe"] == 1 and core.dropped == 1


def test_a_transmit_for_a_pipe_removed_meanwhile_is_requeued_by_push() -> None:
    # PUSH sends it on another pipe instead (queued there in the round that chose it).
    from nanopy.core.base import TRANSMIT, PipeInfo
    from nanopy.core.options import new_options
    from nanopy.driver.socket_driver import SocketDriver
    from nanopy.protocols.pipeline import Push0

    class Queued:
        pid, withdrawn, closed = 8, False, False
        batches: list[list[bytes]] = []

        def queue_batch(self, batch: list[bytes], kick: bool) -> None:
            self.batches.append(batch)

    core = Push0(new_options("push"))
    driver = SocketDriver(core, lambda: "t", lambda: None)  # type: ignore[arg-type,return-value]
    other = Queued()
    driver.pipes[8] = other  # type: ignore[assignment]
    core.add_pipe(PipeInfo(7, None, 8, 8), 4)
    core.add_pipe(PipeInfo(8, None, 8, 8), 4)
    core.remove_pipe(7)  # (the driver's remove_pipe: gone from both)
    driver.execute([(TRANSMIT, 7, b"saved")])  # chosen by a round before that
    assert other.batches == [[b"saved"]] and core.dropped == 0
    assert driver.requeued == 1 and not core.holding


# -- the snapshots ---------------------------------------------------------------------------


def test_pipe_snapshots(make_socket: MakeSocket) -> None:
    pull = make_socket("pull", recv_timeout=5)
    push = make_socket("push")
    before = time.time()
    url = pull.bind(bind_url("tcp", "pipes")).url
    push.connect(url, priority=3)
    wait_pipes(pull)
    wait_pipes(push)
    for _ in range(5):
        push.send(b"0123456789")
    wait_until(lambda: pull.pipes()[0].messages_received == 5, what="five messages read")
    # (a writer task counts its batch once written)
    wait_until(lambda: push.pipes()[0].messages_sent == 5, what="five messages written")
    (out,) = push.pipes()
    (inn,) = pull.pipes()
    assert isinstance(out, nanopy.PipeStats) and out.id == push.pipes[0].id
    assert (out.transport, out.url, out.dialed, out.priority) == ("tcp", url, True, 3)
    assert (inn.dialed, inn.priority, inn.url) == (False, 8, url)
    assert (out.messages_sent, out.bytes_sent, out.messages_received) == (5, 50, 0)
    assert (inn.messages_received, inn.bytes_received, inn.messages_sent) == (5, 50, 0)
    assert inn.queued_in == 5 and pull.stats().queued_in == 5  # read from the wire, not taken yet
    assert out.queued_out == 0 and out.dropped == 0
    assert before - 1 <= inn.connected_since <= time.time()
    assert inn.remote_address == pull.pipes[0].remote_address
    pull.recv()
    assert pull.pipes()[0].queued_in == 4
    assert dict(out)["messages_sent"] == 5 and out["bytes_sent"] == 50
    # sock.pipes is still the list of Pipe objects.
    assert len(push.pipes) == 1 and isinstance(push.pipes[0], nanopy.Pipe)


def test_stats_key_access(make_socket: MakeSocket) -> None:
    stats = make_socket("push").stats()
    assert stats["drops"] == only() and stats["queued_out"] == 0
    assert set(dict(stats)) == set(stats.keys())
    with pytest.raises(KeyError, match="not a SocketStats field"):
        stats["nope"]


def test_cores_refuse_an_unexplained_drop() -> None:
    from nanopy.core.options import new_options
    from nanopy.protocols.pipeline import Push0

    core: Any = Push0(new_options("push"))
    with pytest.raises(AttributeError, match="count_drop"):
        core.dropped += 1
