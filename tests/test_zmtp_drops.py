"""Every message a ZMTP pipe discards is counted with its reason, against real libzmq
sockets (pyzmq): what libzmq's REQ and REP drop (no delimiter, nothing in flight, an
envelope gone) is dropped the same way, the pipe goes on, and the drop shows in
``stats().drops`` and in the exported metrics."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import wait_until

import nanopy
import nanopy.metrics
from nanopy.core.drops import DROP_REASONS
from nanopy.testing import wait_pipes

zmq = pytest.importorskip("zmq")

pytestmark = pytest.mark.interop

MakeSocket = Callable[..., nanopy.Socket]


@pytest.fixture
def zctx() -> Iterator[Any]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def zsocket(zctx: Any, kind: int) -> Any:
    sock = zctx.socket(kind)
    sock.linger = 0
    sock.rcvtimeo = sock.sndtimeo = 5000
    return sock


def wait_drops(sock: nanopy.Socket, **expected: int) -> None:
    """Until ``sock`` counts exactly these drops (every other reason 0)."""
    want = {reason: expected.get(reason, 0) for reason in DROP_REASONS}
    wait_until(lambda: dict(sock.stats().drops) == want, what=f"drops {expected}")
    stats = sock.stats()
    assert stats.dropped == sum(want.values())
    exported = {
        s.labels["reason"]: s.value for s in nanopy.metrics.collect()
        if s.family == "nanopy_messages_dropped" and s.labels["socket"] == sock.name
    }
    assert exported == want


def test_req_drops_what_libzmq_req_drops_and_counts_it(make_socket: MakeSocket, zctx: Any) -> None:
    req = make_socket("req", name="zmtp-req-drops", recv_timeout=5)
    router = zsocket(zctx, zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    req.connect(f"zmtp+tcp://127.0.0.1:{port}")
    wait_pipes(req)
    req.send(b"question")
    identity, empty, body = router.recv_multipart()
    assert (empty, body) == (b"", b"question")
    router.send_multipart([identity, b"no delimiter"])  # one frame: not a reply
    router.send_multipart([identity, b"x", b"answer"])  # a first frame that is not the delimiter
    router.send_multipart([identity, b"", b"answer"])
    assert req.recv() == b"answer"
    router.send_multipart([identity, b"", b"a second answer"])  # nothing in flight
    wait_drops(req, malformed=2, cancelled=1)
    assert len(req.pipes) == 1  # as libzmq's REQ, the pipe goes on
    req.send(b"still there?")
    identity, _, body = router.recv_multipart()
    router.send_multipart([identity, b"", body.upper()])
    assert req.recv() == b"STILL THERE?"


def test_rep_drops_what_has_no_envelope_and_counts_it(make_socket: MakeSocket, zctx: Any) -> None:
    rep = make_socket("rep", name="zmtp-rep-drops", recv_timeout=5)
    dealer = zsocket(zctx, zmq.DEALER)
    dealer.connect(rep.bind("zmtp+tcp://127.0.0.1:0").url.removeprefix("zmtp+"))
    wait_pipes(rep)
    dealer.send(b"no envelope")  # one frame
    dealer.send_multipart([b"no", b"delimiter"])
    dealer.send_multipart([b"id", b""])  # a delimiter, and no body after it
    dealer.send_multipart([b"", b"a request"])
    msg = rep.recv_msg()
    assert msg.body == b"a request"
    msg.reply(b"its reply")
    assert dealer.recv_multipart() == [b"", b"its reply"]
    wait_drops(rep, malformed=3)
    assert len(rep.pipes) == 1


def test_a_reply_whose_envelope_was_pushed_out_is_unroutable(
    make_socket: MakeSocket, zctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nanopy.transports.zmtp import _roles

    monkeypatch.setattr(_roles, "MAX_ENVELOPES", 1)  # (65536 by default: one pipe's waiting requests)
    rep = make_socket("rep", name="zmtp-rep-unroutable", recv_timeout=5)
    dealer = zsocket(zctx, zmq.DEALER)
    dealer.connect(rep.bind("zmtp+tcp://127.0.0.1:0").url.removeprefix("zmtp+"))
    wait_pipes(rep)
    dealer.send_multipart([b"", b"first"])
    dealer.send_multipart([b"", b"second"])
    first, second = rep.recv_msg(), rep.recv_msg()
    first.reply(b"lost: its envelope made room for the second's")
    second.reply(b"answered")
    assert dealer.recv_multipart() == [b"", b"answered"]
    wait_drops(rep, unroutable=1)


def test_the_transport_drop_reasons_are_the_cores() -> None:
    """A transport counts with the names of nanopy/transports/_base.py (it does not
    import the core's table): they are the core's reasons."""
    from nanopy.core import drops
    from nanopy.transports import _base

    names = {n: getattr(_base, n) for n in dir(_base) if n.startswith("DROP_")}
    assert names and all(getattr(drops, n.removeprefix("DROP_")) == v for n, v in names.items())
