"""Devices: forwarding between raw sockets, across transports, with loop protection."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
import trio
from conftest import bind_url, wait_until
from peers import pynng_socket

import nanopy
from nanopy.testing import wait_pipes

MakeSocket = Callable[..., nanopy.Socket]


def run_device(a: nanopy.Socket, b: nanopy.Socket) -> threading.Thread:
    t = threading.Thread(target=nanopy.device, args=(a, b), daemon=True)
    t.start()
    return t


def serve(rep: nanopy.Socket, tag: bytes) -> None:
    def loop() -> None:
        while True:
            try:
                msg = rep.recv_msg()
            except nanopy.Closed:
                return
            msg.reply(tag + b":" + msg.body)

    threading.Thread(target=loop, daemon=True).start()


@pytest.mark.interop
def test_pynng_clients_on_tcp_reach_nanopy_reps_on_ipc(make_socket: MakeSocket) -> None:
    """Done means 5: tcp front end, ipc back end, nanopy.device() in between."""
    front = make_socket("rep", raw=True)
    back = make_socket("req", raw=True)
    front_ep = front.bind("tcp://127.0.0.1:0")
    back_ep = back.bind(bind_url("ipc"))
    for i in range(2):
        serve(make_socket("rep", connect=back_ep.url), b"srv%d" % i)
    wait_pipes(back, 2)
    dev = run_device(front, back)
    seen: set[bytes] = set()
    with pynng_socket("Req0", recv_timeout=5000) as c1, pynng_socket("Req0", recv_timeout=5000) as c2:
        c1.dial(front_ep.url, block=True)
        c2.dial(front_ep.url, block=True)
        for i in range(20):
            for n, client in enumerate((c1, c2)):
                body = b"c%d-%d" % (n, i)
                client.send(body)
                tag, _, echoed = client.recv().partition(b":")
                assert echoed == body
                seen.add(tag)
    assert seen == {b"srv0", b"srv1"}  # the back end load-balances
    front.close()
    dev.join(5)
    assert not dev.is_alive()  # the device ends when a socket closes


def test_ring_of_devices_drops_after_max_ttl(make_socket: MakeSocket) -> None:
    """Done means 5: requests circling a ring of devices die after max_ttl hops."""
    n = 3
    fronts = [make_socket("rep", raw=True, max_ttl=5) for _ in range(n)]
    backs = [make_socket("req", raw=True) for _ in range(n)]
    urls = [f.bind(bind_url("inproc")).url for f in fronts]
    for i in range(n):
        backs[i].connect(urls[(i + 1) % n])  # device i feeds device i+1: a loop
    client = make_socket("req", resend_interval=None)
    client.connect(urls[0])
    wait_pipes(fronts[0], 2)
    for i in range(n):
        wait_pipes(backs[i])
    devices = [run_device(fronts[i], backs[i]) for i in range(n)]
    client.send(b"round and round")
    dropped = lambda: sum(f.stats().messages_dropped for f in fronts)  # noqa: E731
    wait_until(lambda: dropped() == 1, what="the looping request dropped")
    # Hop k arrives with k words; k = 1..5 are forwarded, the 6th is dropped.
    assert sum(f.stats().messages_received for f in fronts) == 5
    with pytest.raises(nanopy.Timeout):
        client.recv(timeout=0.05)
    for f in fronts:
        f.close()
    for d in devices:
        d.join(5)
        assert not d.is_alive()


def test_survey_through_a_device(make_socket: MakeSocket) -> None:
    front = make_socket("respondent", raw=True)
    back = make_socket("surveyor", raw=True)
    front_ep = front.bind(bind_url("tcp"))
    back_ep = back.bind(bind_url("ipc"))
    for i in range(2):
        resp = make_socket("respondent", connect=back_ep.url)
        serve(resp, b"r%d" % i)
    wait_pipes(back, 2)
    run_device(front, back)
    sv = make_socket("surveyor", survey_deadline=0.5, connect=front_ep.url)
    wait_pipes(sv)
    assert sorted(sv.survey(b"q")) == [b"r0:q", b"r1:q"]


def test_pair1_through_a_device_counts_hops(make_socket: MakeSocket) -> None:
    left = make_socket("pair1", raw=True)
    right = make_socket("pair1", raw=True)
    a = make_socket("pair1", recv_timeout=5)
    b = make_socket("pair1", raw=True, recv_timeout=5)
    a.connect(left.bind(bind_url("inproc")).url)
    b.connect(right.bind(bind_url("tcp")).url)
    for s in (left, right, a, b):
        wait_pipes(s)
    run_device(left, right)
    a.send(b"via device")
    msg = b.recv_msg()
    assert msg.body == b"via device"
    assert msg.header == b"\x00\x00\x00\x02"  # one hop from a, one from the device
    b.send_msg(nanopy.Message(b"back", header=msg.header))
    assert a.recv() == b"back"


@pytest.mark.parametrize("lib", ["trio", "asyncio"])
def test_adevice(make_socket: MakeSocket, lib: str) -> None:
    front = make_socket("rep", raw=True)
    back = make_socket("req", raw=True)
    url = front.bind(bind_url("inproc")).url
    serve(make_socket("rep", connect=back.bind(bind_url("inproc")).url), b"s")
    wait_pipes(back)
    client = make_socket("req", connect=url)
    wait_pipes(front)

    async def ask() -> bytes:
        return await client.arequest(b"hi", timeout=5)

    if lib == "trio":

        async def main() -> bytes:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(nanopy.adevice, front, back)
                reply = await ask()
                await front.aclose()  # ends the device
            return reply

        assert trio.run(main) == b"s:hi"
    else:

        async def amain() -> bytes:
            dev = asyncio.ensure_future(nanopy.adevice(front, back))
            reply = await ask()
            await front.aclose()
            await asyncio.wait_for(dev, 5)
            return reply

        assert asyncio.run(amain()) == b"s:hi"


def test_device_argument_checks(make_socket: MakeSocket) -> None:
    raw_rep = make_socket("rep", raw=True)
    with pytest.raises(ValueError, match="raw"):
        nanopy.device(raw_rep, make_socket("req"))
    with pytest.raises(ValueError, match="cannot be joined"):
        nanopy.device(raw_rep, make_socket("push", raw=True))
    with pytest.raises(TypeError):
        nanopy.device(raw_rep, object())  # type: ignore[arg-type]


def test_one_way_device_for_pipeline(make_socket: MakeSocket) -> None:
    pull = make_socket("pull", raw=True)
    push = make_socket("push", raw=True)
    src = make_socket("push", connect=pull.bind(bind_url("inproc")).url)
    dst = make_socket("pull", recv_timeout=5, connect=push.bind(bind_url("inproc")).url)
    wait_pipes(pull)
    wait_pipes(push)
    run_device(pull, push)
    src.send(b"through")
    assert dst.recv() == b"through"


# -- a device ends when either socket closes (issue 10, defect 2) -------------------------
# Every raw pair nanopy.device() accepts: (the socket that receives first, its peer).
RAW_PAIRS = [
    ("rep", "req"),
    ("respondent", "surveyor"),
    ("sub", "pub"),
    ("pull", "push"),
    ("bus", "bus"),
    ("pair", "pair"),
    ("pair1", "pair1"),
]


def _run_device_in(runner: str, a: nanopy.Socket, b: nanopy.Socket) -> threading.Thread:
    """Start nanopy.device (thread) or adevice under trio/asyncio in a thread of its own."""
    if runner == "thread":
        return run_device(a, b)
    if runner == "trio":
        target: Callable[[], object] = lambda: trio.run(nanopy.adevice, a, b)
    else:
        target = lambda: asyncio.run(nanopy.adevice(a, b))
    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("runner", ["thread", "trio", "asyncio"])
@pytest.mark.parametrize("closing", ["a", "b"])
@pytest.mark.parametrize(("proto_a", "proto_b"), RAW_PAIRS)
def test_device_returns_within_1s_of_either_socket_closing(
    make_socket: MakeSocket, proto_a: str, proto_b: str, closing: str, runner: str
) -> None:
    """Both pumps sit blocked in recv (no peers) -- or there is only one pump
    (SUB -> PUB, PULL -> PUSH) and the closed socket is the one it does not read."""
    a = make_socket(proto_a, raw=True)
    b = make_socket(proto_b, raw=True)
    dev = _run_device_in(runner, a, b)
    assert not _joined(dev, 0.1)  # running, blocked
    (a if closing == "a" else b).close(linger=0)
    assert _joined(dev, 1.0), f"device({proto_a}, {proto_b}) still running 1 s after closing {closing}"


@pytest.mark.parametrize(("proto_a", "proto_b"), [("pull", "push"), ("pair", "pair"), ("pair1", "pair1")])
def test_device_blocked_sending_returns_when_its_source_closes(
    make_socket: MakeSocket, proto_a: str, proto_b: str
) -> None:
    """The pump holds a message it cannot send (b has no peer); closing a ends it."""
    a = make_socket(proto_a, raw=True)
    b = make_socket(proto_b, raw=True)
    url = a.bind(bind_url("inproc")).url
    sender = make_socket("push" if proto_a == "pull" else proto_a, connect=url)
    wait_pipes(a)
    sender.send(b"stuck", timeout=5)
    dev = run_device(a, b)
    wait_until(lambda: a.stats().messages_received == 1, what="the device took the message")
    assert not _joined(dev, 0.1)
    a.close(linger=0)
    assert _joined(dev, 1.0)


def _joined(t: threading.Thread, timeout: float) -> bool:
    t.join(timeout)
    return not t.is_alive()
