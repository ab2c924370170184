"""The public Socket API over PAIR and PUSH/PULL: options, timeouts, errors, endpoints,
async use, pipe events, stats, closing, fork and Ctrl-C."""

from __future__ import annotations

import asyncio
import errno
import itertools
import math
import os
import signal
import socket as stdsocket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import trio
from conftest import bind_url, reap_child, wait_until
from peers import ipv6_available

import nanopy
from nanopy.testing import connect_pair, inproc_url, ipc_url, wait_no_pipes, wait_pipes

Factory = Callable[..., nanopy.Socket]


def push_pull(make_socket: Factory, transport: str, **pull_opts: object) -> tuple[nanopy.Socket, nanopy.Socket]:
    pull = make_socket("pull", **pull_opts)
    push = make_socket("push")
    connect_pair(pull, push, bind_url(transport))
    return push, pull


# -- construction and options -----------------------------------------------------------


def test_protocol_constants_and_names(make_socket: Factory) -> None:
    assert (nanopy.PAIR, nanopy.PUSH, nanopy.PULL) == ("pair", "push", "pull")
    s = make_socket(nanopy.PUSH)
    assert s.protocol == "push"
    assert s.name == "push"
    assert "push" in repr(s)
    assert not s.closed and s.endpoints == [] and s.pipes == []


def test_protocol_must_be_a_known_name() -> None:
    with pytest.raises(TypeError):
        nanopy.Socket(0x50)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pull"):
        nanopy.Socket("nosuchproto")


def test_option_defaults(make_socket: Factory) -> None:
    s = make_socket("pull")
    assert s.send_timeout is None and s.recv_timeout is None
    assert s.send_buffer == 1024 and s.recv_buffer == 1024
    assert (s.reconnect_interval, s.reconnect_interval_max) == (0.1, 5.0)
    assert s.recv_max_size == 1 << 20
    assert s.linger == 1.0
    assert s.resend_interval == 60.0 and s.survey_deadline == 1.0
    assert s.max_ttl == 8 and s.handshake_timeout == 10.0
    assert s.tcp_nodelay is True


def test_options_as_keywords_and_attributes(make_socket: Factory) -> None:
    s = make_socket("pull", recv_timeout=2, recv_buffer=7, name="jobs", tcp_nodelay=False)
    assert s.recv_timeout == 2.0 and isinstance(s.recv_timeout, float)
    assert s.recv_buffer == 7 and s.name == "jobs" and s.tcp_nodelay is False
    s.recv_timeout = None
    s.send_timeout = 0
    s.recv_max_size = 0
    s.max_ttl = 255
    s.resend_interval = None
    assert (s.recv_timeout, s.send_timeout, s.recv_max_size, s.max_ttl) == (None, 0.0, 0, 255)
    assert "jobs" in repr(s)


@pytest.mark.parametrize(
    "option, value, error",
    [
        ("send_timeout", "1", TypeError),
        ("send_timeout", True, TypeError),
        ("recv_timeout", -0.5, ValueError),
        ("recv_timeout", math.nan, ValueError),
        ("recv_timeout", [1], TypeError),
        ("send_buffer", 0, ValueError),
        ("send_buffer", 1.5, TypeError),
        ("recv_buffer", -1, ValueError),
        ("recv_buffer", "10", TypeError),
        ("recv_buffer", 1 << 25, ValueError),
        ("reconnect_interval", 0, ValueError),
        ("reconnect_interval_max", None, TypeError),
        ("recv_max_size", -1, ValueError),
        ("recv_max_size", 1.0, TypeError),
        ("linger", -1, ValueError),
        ("linger", None, TypeError),
        ("resend_interval", 0, ValueError),
        ("survey_deadline", 0, ValueError),
        ("max_ttl", 0, ValueError),
        ("max_ttl", 256, ValueError),
        ("max_ttl", False, TypeError),
        ("handshake_timeout", 0, ValueError),
        ("handshake_timeout", "10", TypeError),
        ("tcp_nodelay", 1, TypeError),
        ("name", 5, TypeError),
        ("name", None, TypeError),
    ],
)
def test_bad_option_values_are_refused_at_once(
    make_socket: Factory, option: str, value: object, error: type[Exception]
) -> None:
    s = make_socket("pull")
    before = getattr(s, option)
    with pytest.raises(error, match=option):
        setattr(s, option, value)
    assert getattr(s, option) == before  # unchanged
    with pytest.raises(error):
        nanopy.Socket("pull", **{option: value})


def test_unknown_option_keyword() -> None:
    with pytest.raises(TypeError, match="recv_timeout"):
        nanopy.Socket("pull", recv_timeout_ms=5)


# -- timeouts ------------------------------------------------------------------------------


def test_recv_timeout_zero_is_immediate(make_socket: Factory) -> None:
    s = make_socket("pull")
    t0 = time.monotonic()
    with pytest.raises(nanopy.Timeout) as info:
        s.recv(timeout=0)
    assert time.monotonic() - t0 < 0.5  # no waiting at all (generous bound for a loaded machine)
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, nanopy.NanopyError)


def test_send_timeout_zero_without_peers(make_socket: Factory) -> None:
    s = make_socket("push")
    t0 = time.monotonic()
    with pytest.raises(nanopy.Timeout):
        s.send(b"x", timeout=0)
    assert time.monotonic() - t0 < 0.5


def test_per_call_timeout_waits_about_that_long(make_socket: Factory) -> None:
    s = make_socket("pull")
    t0 = time.monotonic()
    with pytest.raises(nanopy.Timeout):
        s.recv(timeout=0.2)
    assert 0.18 <= time.monotonic() - t0 < 1.0


def test_timeout_options_are_the_defaults(make_socket: Factory) -> None:
    pull = make_socket("pull", recv_timeout=0.1)
    push = make_socket("push", send_timeout=0.1)
    t0 = time.monotonic()
    with pytest.raises(nanopy.Timeout):
        pull.recv()
    with pytest.raises(nanopy.Timeout):
        push.send(b"x")
    assert time.monotonic() - t0 < 1.0
    # A per-call timeout overrides the option.
    t0 = time.monotonic()
    with pytest.raises(nanopy.Timeout):
        pull.recv(timeout=0)
    assert time.monotonic() - t0 < 0.5


def test_timeout_zero_succeeds_when_data_is_there(make_socket: Factory, transport: str) -> None:
    push, pull = push_pull(make_socket, transport)
    push.send(b"ready", timeout=0)
    assert pull.recv(timeout=5) == b"ready"
    push.send(b"again")
    wait_until(lambda: pull._core.can_recv(), what="message queued")
    assert pull.recv(timeout=0) == b"again"


@pytest.mark.parametrize("bad, error", [("1", TypeError), (True, TypeError), (-1, ValueError)])
def test_bad_per_call_timeouts(make_socket: Factory, bad: object, error: type[Exception]) -> None:
    push, pull = push_pull(make_socket, "inproc")
    with pytest.raises(error):
        pull.recv(timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(error):
        make_socket("push").send(b"x", timeout=bad)  # type: ignore[arg-type]
    # Also when the call could complete at once (the fast path).
    with pytest.raises(error):
        push.send(b"x", timeout=bad)  # type: ignore[arg-type]
    push.send(b"queued")
    wait_until(lambda: pull._core.can_recv(), what="message queued")
    with pytest.raises(error):
        pull.recv(timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(error):
        pull.recv_msg(timeout=bad)  # type: ignore[arg-type]

    async def main() -> None:
        with pytest.raises(error):
            await push.asend(b"x", timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(error):
            await pull.arecv(timeout=bad)  # type: ignore[arg-type]

    trio.run(main)
    assert pull.recv(timeout=5) == b"queued"  # nothing was taken by the refused calls


# -- data types and protocol errors ----------------------------------------------------------


def test_str_is_refused_with_advice(make_socket: Factory) -> None:
    push, _pull = push_pull(make_socket, "inproc")
    with pytest.raises(TypeError, match="encode"):
        push.send("text")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        push.send(12345)  # type: ignore[arg-type]

    async def main() -> None:
        with pytest.raises(TypeError, match="encode"):
            await push.asend("text")  # type: ignore[arg-type]

    trio.run(main)
    assert push.stats().messages_sent == 0


def test_inproc_hands_over_the_same_bytes_object(make_socket: Factory) -> None:
    push, pull = push_pull(make_socket, "inproc")
    body = os.urandom(100_000)
    push.send(body)
    assert pull.recv(timeout=5) is body  # no framing, no copy


def test_bytes_like_data(make_socket: Factory, transport: str) -> None:
    push, pull = push_pull(make_socket, transport)
    push.send(bytearray(b"ba"))
    push.send(memoryview(b"xmvx")[1:3])
    push.send(b"")
    got = [pull.recv(timeout=5) for _ in range(3)]
    assert got == [b"ba", b"mv", b""]
    assert all(type(g) is bytes for g in got)


def test_wrong_direction_is_a_protocol_error(make_socket: Factory) -> None:
    push, pull = push_pull(make_socket, "inproc")
    with pytest.raises(nanopy.ProtocolError):
        pull.send(b"x")
    with pytest.raises(nanopy.ProtocolError):
        pull.send(b"x", timeout=0)
    with pytest.raises(nanopy.ProtocolError):
        push.recv()
    with pytest.raises(nanopy.ProtocolError):
        push.recv_msg(timeout=0)
    # Also when nothing is connected.
    with pytest.raises(nanopy.ProtocolError):
        make_socket("pull").send(b"x")
    with pytest.raises(nanopy.ProtocolError):
        make_socket("push").recv()

    async def main() -> None:
        with pytest.raises(nanopy.ProtocolError):
            await pull.asend(b"x")
        with pytest.raises(nanopy.ProtocolError):
            await push.arecv()

    trio.run(main)


def test_recv_msg_carries_the_pipe(make_socket: Factory, transport: str) -> None:
    push, pull = push_pull(make_socket, transport)
    push.send(b"m")
    msg = pull.recv_msg(timeout=5)
    assert isinstance(msg, nanopy.Message)
    assert msg.body == b"m" and bytes(msg) == b"m" and len(msg) == 1 and msg.header == b""
    assert isinstance(msg.pipe, nanopy.Pipe)
    assert msg.pipe in pull.pipes
    assert 0 < msg.pipe.id < 2**31
    assert isinstance(msg.pipe.remote_address, str) and msg.pipe.remote_address
    assert msg.pipe.endpoint in pull.endpoints
    with pytest.raises(nanopy.ProtocolError):
        msg.reply(b"no")  # only REP/RESPONDENT messages can be answered


# -- PAIR -----------------------------------------------------------------------------------


def test_pair_both_ways(make_socket: Factory, transport: str) -> None:
    a = make_socket("pair")
    b = make_socket("pair")
    connect_pair(a, b, bind_url(transport))
    a.send(b"ping")
    assert b.recv(timeout=5) == b"ping"
    b.send(b"pong")
    assert a.recv(timeout=5) == b"pong"


def test_pair_refuses_a_second_peer(make_socket: Factory, transport: str) -> None:
    a = make_socket("pair")
    b = make_socket("pair")
    ep = a.bind(bind_url(transport))
    b.connect(ep.url)
    wait_pipes(a)
    wait_pipes(b)
    third = make_socket("pair", reconnect_interval=0.05, reconnect_interval_max=0.1)
    removed = threading.Event()
    third.on_pipe_removed(lambda p: removed.set())
    third.connect(ep.url)
    assert removed.wait(5), "the surplus peer's pipe was not closed"
    assert len(a.pipes) == 1
    a.send(b"to-b")
    assert b.recv(timeout=5) == b"to-b"
    # When b leaves, the waiting third peer takes its place. (A message it sends
    # on a pipe that `a` is refusing at that moment is lost, as with NNG: retry.)
    b.close()
    deadline = time.monotonic() + 5
    while True:
        third.send(b"hello", timeout=5)
        try:
            assert a.recv(timeout=0.3) == b"hello"
            break
        except nanopy.Timeout:
            assert time.monotonic() < deadline, "the waiting peer never took over"
    # The sentinel is the first message third ever gets: "to-b" never went its way.
    a.send(b"sentinel")
    assert third.recv(timeout=5) == b"sentinel"
    assert third.stats().messages_received == 1


# -- context managers and async ----------------------------------------------------------------


def test_sync_context_manager(transport: str) -> None:
    url = bind_url(transport)
    with nanopy.Socket("pull", bind=url) as pull:
        assert not pull.closed
        with nanopy.Socket("push", connect=pull.endpoints[0].url) as push:
            push.send(b"cm")
            assert pull.recv(timeout=5) == b"cm"
    assert pull.closed and push.closed
    with pytest.raises(nanopy.Closed):
        pull.recv()
    with pytest.raises(nanopy.Closed):
        push.send(b"x")
    with pytest.raises(nanopy.Closed):
        pull.bind(bind_url(transport))


@pytest.mark.trio
async def test_trio_async_api(transport: str) -> None:
    async with nanopy.Socket("pull", bind=bind_url(transport)) as pull:
        async with nanopy.Socket("push", connect=pull.endpoints[0].url) as push:
            got: list[bytes] = []

            async def receiver() -> None:
                for _ in range(100):
                    got.append(await pull.arecv(timeout=5))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(receiver)
                for i in range(100):
                    await push.asend(b"%d" % i)
            assert got == [b"%d" % i for i in range(100)]
            # A waiting arecv is woken by a send from another thread.
            threading.Timer(0.05, push.send, args=(b"late",)).start()
            msg = await pull.arecv_msg(timeout=5)
            assert msg.body == b"late" and msg.pipe is not None
            with pytest.raises(nanopy.Timeout):
                await pull.arecv(timeout=0)
            with pytest.raises(nanopy.Timeout):
                await pull.arecv(timeout=0.05)
    assert pull.closed and push.closed


@pytest.mark.trio
async def test_trio_cancelled_arecv_loses_nothing() -> None:
    async with nanopy.Socket("pull", bind=inproc_url()) as pull:
        async with nanopy.Socket("push", connect=pull.endpoints[0].url) as push:
            with trio.move_on_after(0.05) as scope:
                await pull.arecv()
            assert scope.cancelled_caught
            await push.asend(b"kept")
            assert await pull.arecv(timeout=5) == b"kept"


def test_asyncio_async_api(transport: str) -> None:
    async def main() -> list[bytes]:
        async with nanopy.Socket("pull", bind=bind_url(transport)) as pull:
            async with nanopy.Socket("push", connect=pull.endpoints[0].url) as push:

                async def receiver() -> list[bytes]:
                    return [await pull.arecv(timeout=5) for _ in range(100)]

                task = asyncio.create_task(receiver())
                for i in range(100):
                    await push.asend(b"%d" % i, timeout=5)
                got = await asyncio.wait_for(task, 10)
                # Wake-up from another thread.
                threading.Timer(0.05, push.send, args=(b"late",)).start()
                got.append((await pull.arecv_msg(timeout=5)).body)
                with pytest.raises(nanopy.Timeout):
                    await pull.arecv(timeout=0.05)
                # Cancelling a waiting arecv is lossless.
                waiting = asyncio.create_task(pull.arecv())
                await asyncio.sleep(0.02)
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
                await push.asend(b"after-cancel")
                got.append(await pull.arecv(timeout=5))
        assert pull.closed and push.closed
        return got

    got = asyncio.run(main())
    assert got == [b"%d" % i for i in range(100)] + [b"late", b"after-cancel"]


# -- stats -----------------------------------------------------------------------------------------


def test_stats(make_socket: Factory, transport: str) -> None:
    push, pull = push_pull(make_socket, transport)
    empty = make_socket("pull").stats()
    assert empty == nanopy.SocketStats()
    for body in (b"a", b"bb", b"ccc"):
        push.send(body)
    for _ in range(3):
        pull.recv(timeout=5)
    ps, ls = push.stats(), pull.stats()
    assert (ps.messages_sent, ps.bytes_sent, ps.pipes, ps.connects) == (3, 6, 1, 1)
    assert (ls.messages_received, ls.bytes_received, ls.pipes, ls.connects) == (3, 6, 1, 1)
    assert ls.messages_sent == 0 and ps.messages_received == 0
    assert ps.messages_dropped == 0 and ls.protocol_errors == 0
    with pytest.raises(AttributeError):
        ps.pipes = 5  # type: ignore[misc]  # frozen snapshot
    push.close()
    wait_no_pipes(pull)
    wait_until(lambda: pull.stats().disconnects == 1, what="disconnect counted")
    assert pull.stats().pipes == 0


def test_reconnect_attempts_are_counted(make_socket: Factory) -> None:
    port = _closed_port()
    push = make_socket("push", reconnect_interval=0.01, reconnect_interval_max=0.02)
    push.connect(f"tcp://127.0.0.1:{port}")
    wait_until(lambda: push.stats().reconnect_attempts >= 3, what="3 failed dials")
    assert push.stats().pipes == 0


def _closed_port() -> int:
    with stdsocket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- pipe events ---------------------------------------------------------------------------------


def test_pipe_events(make_socket: Factory, transport: str) -> None:
    pull = make_socket("pull")
    added: list[nanopy.Pipe] = []
    removed: list[nanopy.Pipe] = []
    gone = threading.Event()
    pull.on_pipe_added(added.append)
    pull.on_pipe_removed(lambda p: (removed.append(p), gone.set()))
    push = make_socket("push")
    ep = pull.bind(bind_url(transport))
    push.connect(ep.url)
    wait_pipes(pull)
    assert len(added) == 1
    pipe = added[0]
    assert pipe.endpoint is ep and pipe in pull.pipes
    assert "Pipe" in repr(pipe)
    push.close()
    assert gone.wait(5)
    assert removed == [pipe]


def test_rejecting_a_pipe(make_socket: Factory, transport: str) -> None:
    pull = make_socket("pull")
    accept = threading.Event()
    offered = threading.Event()
    calls = []

    def on_added(pipe: nanopy.Pipe) -> bool:
        calls.append(pipe)
        offered.set()
        return accept.is_set()

    pull.on_pipe_added(on_added)
    removed: list[nanopy.Pipe] = []
    pull.on_pipe_removed(removed.append)
    ep = pull.bind(bind_url(transport))
    push = make_socket("push", reconnect_interval=0.02, reconnect_interval_max=0.05)
    push.connect(ep.url)
    assert offered.wait(5)
    assert pull.pipes == [] and pull.stats().connects == 0
    assert removed == []  # a rejected pipe was never added, so it is not "removed"
    accept.set()
    wait_pipes(pull)
    push.send(b"let in", timeout=5)
    # The first message ever received: nothing came through a rejected pipe.
    assert pull.recv(timeout=5) == b"let in"
    assert pull.stats().messages_received == 1
    assert len(calls) >= 2


def test_pipe_close_from_user(make_socket: Factory) -> None:
    push, pull = push_pull(make_socket, "tcp")
    (pipe,) = pull.pipes
    pipe.close()
    wait_until(lambda: pipe not in pull.pipes, what="pipe closed")
    # The dialer reconnects.
    wait_pipes(pull)
    push.send(b"back", timeout=5)
    assert pull.recv(timeout=5) == b"back"


def test_blocking_call_in_a_pipe_callback_does_not_deadlock(make_socket: Factory) -> None:
    pull = make_socket("pull")
    errors: list[BaseException] = []
    done = threading.Event()

    def on_added(pipe: nanopy.Pipe) -> None:
        try:
            pull.recv()
        except BaseException as exc:
            errors.append(exc)
        done.set()

    pull.on_pipe_added(on_added)
    push = make_socket("push")
    connect_pair(pull, push, inproc_url())
    assert done.wait(5)
    assert isinstance(errors[0], RuntimeError)
    push.send(b"fine")
    assert pull.recv(timeout=5) == b"fine"


def test_failing_pipe_callback_is_logged_not_fatal(make_socket: Factory, caplog: pytest.LogCaptureFixture) -> None:
    pull = make_socket("pull")
    pull.on_pipe_added(lambda p: 1 / 0)
    push = make_socket("push")
    connect_pair(pull, push, inproc_url())
    push.send(b"ok")
    assert pull.recv(timeout=5) == b"ok"
    assert any("ZeroDivisionError" in r.getMessage() or r.exc_info for r in caplog.records)


# -- endpoints ---------------------------------------------------------------------------------------


def test_endpoints_list_and_close(make_socket: Factory) -> None:
    pull = make_socket("pull")
    ep_tcp = pull.bind("tcp://127.0.0.1:0")
    ep_ipc = pull.bind(ipc_url())
    ep_conn = pull.connect("tcp://127.0.0.1:9")  # nobody there: retries quietly
    assert pull.endpoints == [ep_tcp, ep_ipc, ep_conn]
    assert not ep_tcp.dialer and ep_conn.dialer
    assert not ep_tcp.url.endswith(":0") and ep_tcp.url.startswith("tcp://127.0.0.1:")
    assert "bind" in repr(ep_tcp) and "connect" in repr(ep_conn)
    assert ep_tcp.priority == 8 and ep_tcp.recv_priority == 8

    a = make_socket("push")
    b = make_socket("push")
    a.connect(ep_tcp.url)
    b.connect(ep_ipc.url)
    wait_pipes(pull, 2)
    lost = threading.Event()
    a.on_pipe_removed(lambda p: lost.set())
    ep_tcp.close()
    ep_tcp.close()  # idempotent
    assert ep_tcp.closed
    assert pull.endpoints == [ep_ipc, ep_conn]
    assert lost.wait(5), "closing the endpoint must close the pipes it made"
    wait_until(lambda: len(pull.pipes) == 1, what="one pipe left")
    b.send(b"still here")
    assert pull.recv(timeout=5) == b"still here"
    # The port is free again.
    other = make_socket("pull")
    assert other.bind(ep_tcp.url).url == ep_tcp.url
    ep_conn.close()
    assert pull.endpoints == [ep_ipc]


def test_closing_a_connect_endpoint_closes_its_pipe_and_stops_redialing(make_socket: Factory) -> None:
    pull = make_socket("pull")
    url = pull.bind("tcp://127.0.0.1:0").url
    push = make_socket("push", reconnect_interval=0.01, reconnect_interval_max=0.02)
    ep = push.connect(url)
    wait_pipes(pull)
    ep.close()
    wait_no_pipes(pull)
    wait_no_pipes(push)
    assert push.endpoints == []
    with pytest.raises(nanopy.Timeout):
        push.send(b"x", timeout=0.2)  # no redial happened
    assert pull.stats().connects == 1


def test_incompatible_peers_never_form_a_pipe(make_socket: Factory, transport: str) -> None:
    pair = make_socket("pair")
    url = pair.bind(bind_url(transport)).url
    push = make_socket("push", reconnect_interval=0.01, reconnect_interval_max=0.02)
    push.connect(url)
    wait_until(lambda: push.stats().reconnect_attempts >= 2, what="rejected twice")
    assert pair.pipes == [] and push.pipes == []
    if transport != "inproc":  # inproc refuses at dial time, before any connection
        assert pair.stats().protocol_errors >= 1


def test_failed_bind_in_constructor_leaves_nothing_behind(make_socket: Factory) -> None:
    url = make_socket("pull").bind("tcp://127.0.0.1:0").url
    before = threading.active_count()
    with pytest.raises(nanopy.AddressInUse):
        nanopy.Socket("pull", bind=url)
    with pytest.raises(nanopy.AddressError):
        nanopy.Socket("push", connect=["tcp://127.0.0.1:9", "tcp://nope"])
    assert threading.active_count() == before


def test_close_linger_is_bounded_when_the_peer_does_not_read(make_socket: Factory) -> None:
    pull = make_socket("pull", recv_buffer=1)
    push = nanopy.Socket("push", send_buffer=50)
    connect_pair(pull, push, "tcp://127.0.0.1:0")
    pad = b"q" * 65536
    with pytest.raises(nanopy.Timeout):
        for _ in range(2000):  # until the kernel buffers and the pipe's queue are full
            push.send(pad, timeout=0.2)
    t0 = time.monotonic()
    push.close(linger=0.3)
    took = time.monotonic() - t0
    assert 0.25 <= took < 1.5


def test_blocked_send_completes_when_a_peer_appears(make_socket: Factory) -> None:
    url = ipc_url()
    push = make_socket("push", connect=url, reconnect_interval=0.01, reconnect_interval_max=0.02)
    threading.Timer(0.1, lambda: make_socket("pull", bind=url)).start()
    t0 = time.monotonic()
    push.send(b"waited", timeout=5)
    assert 0.05 < time.monotonic() - t0 < 5


@pytest.mark.parametrize("kind", ["tcp", "inproc"])
def test_push_send_priority(make_socket: Factory, kind: str) -> None:
    push = make_socket("push")
    low = make_socket("pull")
    high = make_socket("pull")
    push.connect(low.bind(bind_url(kind)).url, priority=8)
    push.connect(high.bind(bind_url(kind)).url, priority=1)
    wait_pipes(push, 2)
    for i in range(20):
        push.send(b"%d" % i)
    assert [high.recv(timeout=5) for _ in range(20)] == [b"%d" % i for i in range(20)]
    # When the preferred peer goes away, the other one gets the traffic -- and the
    # fallback message is the first low ever gets: none of the 20 went its way.
    high.close()
    wait_until(lambda: len(push.pipes) == 1, what="preferred pipe gone")
    push.send(b"fallback")
    assert low.recv(timeout=5) == b"fallback"
    assert low.stats().messages_received == 1


def test_pull_recv_priority(make_socket: Factory) -> None:
    pull = make_socket("pull")
    a = make_socket("push")
    b = make_socket("push")
    a.connect(pull.bind(inproc_url(), recv_priority=9).url)
    b.connect(pull.bind(inproc_url(), recv_priority=2).url)
    wait_pipes(pull, 2)
    for i in range(5):
        a.send(b"a%d" % i)
        b.send(b"b%d" % i)
    wait_until(lambda: pull._core._fq.queued() == 10, what="10 messages queued at PULL")
    got = [pull.recv(timeout=5) for _ in range(10)]
    assert got == [b"b%d" % i for i in range(5)] + [b"a%d" % i for i in range(5)]


def test_close_from_a_pipe_callback(make_socket: Factory) -> None:
    pull = make_socket("pull")
    closed = threading.Event()

    def on_added(pipe: nanopy.Pipe) -> None:
        pull.close()  # on the engine thread: must not deadlock
        closed.set()

    pull.on_pipe_added(on_added)
    push = make_socket("push")
    push.connect(pull.bind(bind_url("tcp")).url)
    assert closed.wait(5)
    assert pull.closed and pull.pipes == []
    with pytest.raises(nanopy.Closed):
        pull.recv(timeout=0)


def test_relative_ipc_path(make_socket: Factory, tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    pull = make_socket("pull", bind="ipc://rel.ipc")
    assert os.path.exists(os.path.join(tmp_path, "rel.ipc"))
    push = make_socket("push", connect="ipc://rel.ipc")
    push.send(b"relative")
    msg = pull.recv_msg(timeout=5)
    assert msg.body == b"relative" and msg.pipe.remote_address == "rel.ipc"


def test_host_names_resolve(make_socket: Factory) -> None:
    pull = make_socket("pull")
    ep = pull.bind("tcp://localhost:0")
    port = ep.url.rsplit(":", 1)[1]
    push = make_socket("push", connect=f"tcp://localhost:{port}")
    push.send(b"by name")
    assert pull.recv(timeout=5) == b"by name"


def test_endpoint_options(make_socket: Factory) -> None:
    s = make_socket("push")
    ep = s.connect("tcp://127.0.0.1:9", priority=1, recv_priority=16)
    assert (ep.priority, ep.recv_priority) == (1, 16)
    with pytest.raises(ValueError):
        s.connect("tcp://127.0.0.1:9", priority=0)
    with pytest.raises(ValueError):
        s.connect("tcp://127.0.0.1:9", priority=17)
    with pytest.raises(TypeError):
        s.connect("tcp://127.0.0.1:9", priority="1")
    with pytest.raises(TypeError, match="priority"):
        s.connect("tcp://127.0.0.1:9", bogus=1)
    assert s.endpoints == [ep]


def test_unknown_scheme_names_the_registered_ones(make_socket: Factory) -> None:
    s = make_socket("pull")
    for call in (s.bind, s.connect):
        with pytest.raises(nanopy.AddressError) as info:
            call("bogus://x")
        text = str(info.value)
        assert "bogus" in text
        for scheme in ("tcp", "ipc", "inproc"):
            assert scheme in text
    assert isinstance(info.value, ValueError)
    assert s.endpoints == []


@pytest.mark.parametrize(
    "url",
    [
        "127.0.0.1:5555",
        "tcp:/127.0.0.1:5555",
        "://x",
        "tcp://127.0.0.1",
        "tcp://127.0.0.1:",
        "tcp://127.0.0.1:99999",
        "tcp://127.0.0.1:-1",
        "tcp://127.0.0.1:port",
        "tcp://::1:5555",
        "tcp://[::1]",
        "tcp://127.0.0.1:5555/path",
        "ipc://",
        "ipc:///tmp/" + "x" * 200,
        "inproc://",
    ],
)
def test_malformed_urls(make_socket: Factory, url: str) -> None:
    s = make_socket("pull")
    with pytest.raises(nanopy.AddressError):
        s.bind(url)
    with pytest.raises(nanopy.AddressError):
        s.connect(url)
    assert s.endpoints == []


@pytest.mark.parametrize("url", ["tcp://:5555", "tcp://*:5555", "tcp://127.0.0.1:0"])
def test_connect_needs_a_host_and_port(make_socket: Factory, url: str) -> None:
    with pytest.raises(nanopy.AddressError):
        make_socket("push").connect(url)


def test_bind_to_an_address_not_on_this_host(make_socket: Factory) -> None:
    with pytest.raises(nanopy.AddressError):
        make_socket("pull").bind("tcp://192.0.2.1:0")  # TEST-NET-1: never local


def test_ipc_path_length_limit(make_socket: Factory, tmp_path: os.PathLike[str]) -> None:
    base = os.path.join(tmp_path, "")
    if len(base) > 90:
        pytest.skip("temporary directory path too long")
    limit = nanopy.platform.UNIX_PATH_MAX  # (107 on Linux, 103 on macOS)
    longest = base + "p" * (limit - len(os.fsencode(base)))
    assert len(os.fsencode(longest)) == limit
    pull = make_socket("pull", bind=f"ipc://{longest}")
    push = make_socket("push", connect=f"ipc://{longest}")
    push.send(b"107")
    assert pull.recv(timeout=5) == b"107"
    with pytest.raises(nanopy.AddressError, match=str(limit)):
        make_socket("pull").bind(f"ipc://{longest}x")


def test_address_must_be_str(make_socket: Factory) -> None:
    s = make_socket("pull")
    with pytest.raises(TypeError):
        s.bind(b"tcp://127.0.0.1:0")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        s.connect(None)  # type: ignore[arg-type]


def test_bind_wildcard_reports_real_port(make_socket: Factory) -> None:
    s = make_socket("pull")
    ep = s.bind("tcp://*:0")
    assert ep.url.startswith("tcp://0.0.0.0:") and not ep.url.endswith(":0")
    push = make_socket("push", connect="tcp://127.0.0.1:" + ep.url.rsplit(":", 1)[1])
    push.send(b"w")
    assert s.recv(timeout=5) == b"w"


def test_address_in_use_tcp(make_socket: Factory) -> None:
    a = make_socket("pull")
    ep = a.bind("tcp://127.0.0.1:0")
    with pytest.raises(nanopy.AddressInUse) as info:
        make_socket("pull").bind(ep.url)
    assert isinstance(info.value, OSError) and info.value.errno == errno.EADDRINUSE
    with pytest.raises(nanopy.AddressInUse):
        a.bind(ep.url)  # the same socket twice
    assert a.endpoints == [ep]


def test_address_in_use_tcp_foreign_listener(make_socket: Factory) -> None:
    with stdsocket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        with pytest.raises(nanopy.AddressInUse):
            make_socket("pull").bind(f"tcp://127.0.0.1:{other.getsockname()[1]}")


def test_address_in_use_live_ipc(make_socket: Factory) -> None:
    url = ipc_url()
    a = make_socket("pull")
    a.bind(url)
    with pytest.raises(nanopy.AddressInUse):
        make_socket("pull").bind(url)
    # The live listener is intact.
    push = make_socket("push", connect=url)
    push.send(b"alive")
    assert a.recv(timeout=5) == b"alive"


def test_address_in_use_inproc(make_socket: Factory) -> None:
    url = inproc_url()
    make_socket("pull").bind(url)
    with pytest.raises(nanopy.AddressInUse):
        make_socket("pull").bind(url)


def test_ipc_path_that_is_not_a_socket(make_socket: Factory, tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "plain.file")
    with open(path, "w") as f:
        f.write("keep me")
    with pytest.raises(nanopy.AddressInUse):
        make_socket("pull").bind(f"ipc://{path}")
    with open(path) as f:
        assert f.read() == "keep me"


def test_ipc_socket_file_removed_on_close(make_socket: Factory) -> None:
    url = ipc_url()
    path = url[len("ipc://") :]
    s = make_socket("pull")
    ep = s.bind(url)
    assert os.path.exists(path)
    ep.close()
    wait_until(lambda: not os.path.exists(path), what="socket file removed")
    s.bind(url).close()


def test_stale_ipc_file_from_closed_socket_is_reclaimed(make_socket: Factory) -> None:
    url = ipc_url()
    path = url[len("ipc://") :]
    raw = stdsocket.socket(stdsocket.AF_UNIX, stdsocket.SOCK_STREAM)
    raw.bind(path)
    raw.listen()
    raw.close()  # no unlink: the file stays, nobody listens
    assert os.path.exists(path)
    pull = make_socket("pull")
    pull.bind(url)
    push = make_socket("push", connect=url)
    push.send(b"reclaimed")
    assert pull.recv(timeout=5) == b"reclaimed"


def test_stale_ipc_file_from_dead_process_is_reclaimed(make_socket: Factory) -> None:
    url = ipc_url()
    path = url[len("ipc://") :]
    code = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        f"s.bind({path!r}); s.listen()\n"
        "sys.stdout.write('up\\n'); sys.stdout.flush()\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"up\n"
        with pytest.raises(nanopy.AddressInUse):
            make_socket("pull").bind(url)  # still alive
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
    assert os.path.exists(path)
    pull = make_socket("pull")
    pull.bind(url)
    push = make_socket("push", connect=url)
    push.send(b"after death")
    assert pull.recv(timeout=5) == b"after death"


@pytest.mark.skipif(not ipv6_available(), reason="no IPv6 loopback")
def test_ipv6_loopback(make_socket: Factory) -> None:
    pull = make_socket("pull")
    ep = pull.bind("tcp://[::1]:0")
    assert ep.url.startswith("tcp://[::1]:") and not ep.url.endswith(":0")
    push = make_socket("push", connect=ep.url)
    push.send(b"v6")
    msg = pull.recv_msg(timeout=5)
    assert msg.body == b"v6"
    assert "::1" in msg.pipe.remote_address


@pytest.mark.parametrize("kind", ["tcp", "ipc"])
def test_reconnect_after_the_binder_restarts(make_socket: Factory, kind: str) -> None:
    pull = make_socket("pull")
    url = pull.bind(bind_url(kind)).url
    push = make_socket("push", reconnect_interval=0.02, reconnect_interval_max=0.1)
    push.connect(url)
    push.send(b"one", timeout=5)
    assert pull.recv(timeout=5) == b"one"
    pull.close()
    wait_no_pipes(push)
    pull2 = make_socket("pull")
    pull2.bind(url)
    push.send(b"two", timeout=5)
    assert pull2.recv(timeout=5) == b"two"
    assert push.stats().connects == 2


def test_reconnect_inproc_after_the_binder_restarts(make_socket: Factory) -> None:
    url = inproc_url()
    pull = make_socket("pull", bind=url)
    push = make_socket("push", connect=url, reconnect_interval=0.02, reconnect_interval_max=0.1)
    push.send(b"one", timeout=5)
    assert pull.recv(timeout=5) == b"one"
    pull.close()
    wait_no_pipes(push)
    pull2 = make_socket("pull", bind=url)
    push.send(b"two", timeout=5)
    assert pull2.recv(timeout=5) == b"two"


@pytest.mark.parametrize("kind", ["tcp", "ipc"])
def test_recv_max_size_closes_only_that_pipe(make_socket: Factory, kind: str) -> None:
    pull = make_socket("pull", recv_max_size=1000)
    url = pull.bind(bind_url(kind)).url
    big = make_socket("push", reconnect_interval=5.0)
    small = make_socket("push")
    big.connect(url)
    small.connect(url)
    wait_pipes(pull, 2)
    lost = threading.Event()
    big.on_pipe_removed(lambda p: lost.set())
    big.send(b"x" * 1000)  # exactly the limit: fine
    assert pull.recv(timeout=5) == b"x" * 1000
    big.send(b"y" * 1001)
    assert lost.wait(5), "the pipe that carried the oversized message must close"
    wait_until(lambda: pull.stats().protocol_errors == 1, what="protocol error counted")
    small.send(b"unaffected")
    assert pull.recv(timeout=5) == b"unaffected"
    assert len(small.pipes) == 1
    # The oversized message was never delivered: its pipe failed on it (the error
    # is counted) before delivering it, so nothing of it can still be on its way.
    with pytest.raises(nanopy.Timeout):
        pull.recv(timeout=0)


def test_recv_max_size_change_applies_to_new_dialed_pipes(make_socket: Factory) -> None:
    pull = make_socket("pull", reconnect_interval=0.01, reconnect_interval_max=0.02)
    push = make_socket("push")
    url = push.bind("tcp://127.0.0.1:0").url
    pull.recv_max_size = 10
    pull.connect(url)
    push.send(b"x" * 11)
    wait_until(lambda: pull.stats().protocol_errors >= 1, what="oversized message refused")


@pytest.mark.parametrize("kind", ["tcp", "ipc"])
def test_recv_max_size_change_applies_to_new_accepted_pipes(make_socket: Factory, kind: str) -> None:
    pull = make_socket("pull")
    url = pull.bind(bind_url(kind)).url
    pull.recv_max_size = 10  # docs/api.md: affects pipes made afterwards
    push = make_socket("push", connect=url)
    push.send(b"x" * 100)
    wait_until(lambda: pull.stats().protocol_errors >= 1, what="oversized message refused")
    with pytest.raises(nanopy.Timeout):
        pull.recv(timeout=0)


def test_recv_max_size_zero_is_unlimited(make_socket: Factory) -> None:
    push, pull = push_pull(make_socket, "tcp", recv_max_size=0)
    body = os.urandom(3 << 20)
    push.send(body)
    assert pull.recv(timeout=10) == body


# -- back-pressure -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tcp", "ipc", "inproc"])
def test_push_blocks_when_every_pipe_is_full_and_never_drops(make_socket: Factory, kind: str) -> None:
    pull = make_socket("pull", recv_buffer=4)
    push = make_socket("push", send_buffer=8)
    connect_pair(pull, push, bind_url(kind))
    pad = b"p" * (64 * 1024)
    sent = 0
    t_block = None
    while sent < 5000:  # bounded: kernel buffers hold a few MB at most
        try:
            push.send(b"%08d" % sent + pad, timeout=0.3)
        except nanopy.Timeout:
            t_block = sent
            break
        sent += 1
    assert t_block is not None, "PUSH never blocked"
    with pytest.raises(nanopy.Timeout):
        push.send(b"x", timeout=0)
    # Everything that was accepted arrives, once, in order.
    for i in range(sent):
        body = pull.recv(timeout=5)
        assert body[:8] == b"%08d" % i
    assert push.stats().messages_dropped == 0 and pull.stats().messages_dropped == 0
    # Nothing extra (the send that timed out sent nothing): the sentinel comes next.
    push.send(b"room again", timeout=5)
    assert pull.recv(timeout=5) == b"room again"


def test_blocked_send_is_released_by_the_receiver(make_socket: Factory) -> None:
    pull = make_socket("pull", recv_buffer=1)
    push = make_socket("push", send_buffer=1)
    connect_pair(pull, push, inproc_url())
    sent = 0
    with pytest.raises(nanopy.Timeout):
        while sent < 100:
            push.send(b"%d" % sent, timeout=0.1)
            sent += 1
    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(push.send(b"last", timeout=5)))
    t.start()
    got = [pull.recv(timeout=5) for _ in range(sent + 1)]
    t.join(5)
    assert result == [None]
    assert got == [b"%d" % i for i in range(sent)] + [b"last"]


@pytest.mark.parametrize("kind", ["tcp", "inproc"])
def test_push_round_robins_between_pullers(make_socket: Factory, kind: str) -> None:
    push = make_socket("push")
    a = make_socket("pull")
    b = make_socket("pull")
    push.connect(a.bind(bind_url(kind)).url)
    push.connect(b.bind(bind_url(kind)).url)
    wait_pipes(push, 2)
    for i in range(20):
        push.send(b"%d" % i)
    got_a = [a.recv(timeout=5) for _ in range(10)]
    got_b = [b.recv(timeout=5) for _ in range(10)]
    assert sorted(got_a + got_b, key=int) == [b"%d" % i for i in range(20)]
    # Alternating: each got every other message, in order.
    assert [int(x) % 2 for x in got_a] in ([0] * 10, [1] * 10)


@pytest.mark.parametrize("kind", ["tcp", "inproc"])
def test_pull_fair_queues_between_two_pushers(make_socket: Factory, kind: str) -> None:
    pull = make_socket("pull")
    url = pull.bind(bind_url(kind)).url
    a = make_socket("push", connect=url)
    b = make_socket("push", connect=url)
    wait_pipes(pull, 2)
    for i in range(50):
        a.send(b"a%d" % i)
    for i in range(50):
        b.send(b"b%d" % i)
    wait_until(lambda: pull._core._fq.queued() == 100, what="100 messages queued at PULL")
    got = [pull.recv(timeout=5) for _ in range(100)]
    assert [g for g in got if g[:1] == b"a"] == [b"a%d" % i for i in range(50)]
    assert [g for g in got if g[:1] == b"b"] == [b"b%d" % i for i in range(50)]
    sources = [g[:1] for g in got]
    assert all(x != y for x, y in itertools.pairwise(sources)), "not served in turn"


# -- closing --------------------------------------------------------------------------------------------


def test_close_is_idempotent_and_wakes_everyone(make_socket: Factory) -> None:
    pull = make_socket("pull")
    push = make_socket("push")
    pull.bind(inproc_url())
    errors: list[BaseException] = []
    started = threading.Barrier(5)

    def blocked(call: Callable[[], object]) -> None:
        started.wait()
        try:
            call()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=blocked, args=(pull.recv,)) for _ in range(2)]
    threads += [threading.Thread(target=blocked, args=(lambda: push.send(b"x"),)) for _ in range(2)]
    for t in threads:
        t.start()
    started.wait()
    wait_until(
        lambda: len(pull._driver.recv_q.waiters) == 2 and len(push._driver.send_q.waiters) == 2, what="4 waiters"
    )
    t0 = time.monotonic()
    closers = [threading.Thread(target=s.close) for s in (pull, push, pull)]
    for t in closers:
        t.start()
    for t in threads + closers:
        t.join(2)
    assert time.monotonic() - t0 < 1.0
    assert len(errors) == 4 and all(isinstance(e, nanopy.Closed) for e in errors)
    pull.close()
    push.close()


@pytest.mark.parametrize("kind", ["tcp", "inproc"])
def test_close_from_another_thread_wakes_blocked_recv(make_socket: Factory, kind: str) -> None:
    _push, pull = push_pull(make_socket, kind)
    result: list[BaseException] = []
    ready = threading.Event()

    def receiver() -> None:
        ready.set()
        try:
            pull.recv()
        except BaseException as exc:
            result.append(exc)

    t = threading.Thread(target=receiver)
    t.start()
    ready.wait()
    wait_until(lambda: len(pull._driver.recv_q.waiters) == 1, what="receiver parked")
    t0 = time.monotonic()
    threading.Thread(target=pull.close).start()
    t.join(2)
    assert not t.is_alive()
    assert time.monotonic() - t0 < 1.0
    assert isinstance(result[0], nanopy.Closed)
    assert "closed" in str(result[0])


@pytest.mark.trio
async def test_close_wakes_blocked_arecv_in_trio() -> None:
    pull = nanopy.Socket("pull", bind=inproc_url())
    closer = threading.Thread(target=_close_later, args=(pull,))
    closer.start()
    try:
        with pytest.raises(nanopy.Closed):
            with trio.fail_after(2):
                await pull.arecv()
    finally:
        closer.join(5)
        pull.close()


def _close_later(sock: nanopy.Socket) -> None:
    wait_until(lambda: len(sock._driver.recv_q.waiters) == 1, what="arecv parked")
    sock.close()


def test_close_wakes_blocked_arecv_in_asyncio() -> None:
    async def main() -> None:
        pull = nanopy.Socket("pull", bind=inproc_url())
        threading.Thread(target=_close_later, args=(pull,)).start()
        with pytest.raises(nanopy.Closed):
            await asyncio.wait_for(pull.arecv(), 2)

    asyncio.run(main())


def test_close_lingers_to_deliver_queued_messages(transport: str) -> None:
    pull = nanopy.Socket("pull", bind=bind_url(transport))
    try:
        push = nanopy.Socket("push", connect=pull.endpoints[0].url)
        wait_pipes(push)
        body = b"z" * 100_000
        for _ in range(50):
            push.send(body)
        push.close()  # default linger 1 s
        for _ in range(50):
            assert pull.recv(timeout=5) == body
    finally:
        pull.close(linger=0)


@pytest.mark.parametrize("kind", ["tcp", "ipc"])
def test_script_that_sends_and_exits_delivers(make_socket: Factory, kind: str) -> None:
    pull = make_socket("pull")
    url = pull.bind(bind_url(kind)).url
    code = (
        "import nanopy, sys\n"
        "push = nanopy.Socket('push', connect=sys.argv[1])\n"
        "for i in range(200):\n"
        "    push.send(b'%05d' % i + b'.' * 20000, timeout=10)\n"
        "# no close(): interpreter exit closes with linger\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, url], timeout=30, capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr
    got = [pull.recv(timeout=5)[:5] for _ in range(200)]
    assert got == [b"%05d" % i for i in range(200)]


def test_full_pipe_pushes_back_on_that_peer_only(make_socket: Factory) -> None:
    pull = make_socket("pull", recv_buffer=2)
    url = pull.bind("tcp://127.0.0.1:0").url
    flood = make_socket("push", connect=url, send_buffer=4)
    other = make_socket("push", connect=url)
    wait_pipes(pull, 2)
    flood.send(b"hi", timeout=1)
    first = pull.recv_msg(timeout=5).pipe

    def other_pid() -> int:
        (pipe,) = [p for p in pull.pipes if p is not first]
        return pipe.id

    pad = b"f" * 65536
    with pytest.raises(nanopy.Timeout):
        for _ in range(5000):
            flood.send(pad, timeout=0.2)
    # The other peer's pipe is unaffected and served in turn.
    other.send(b"other", timeout=1)
    wait_until(lambda: len(pull._core._fq._queues[other_pid()]) == 1, what="other's message queued")
    got = [pull.recv(timeout=5) for _ in range(2)]
    assert b"other" in got  # fair queueing: its turn comes at once


def _resources() -> tuple[int, int]:
    return threading.active_count(), len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_many_socket_cycles_leak_nothing() -> None:
    def cycle(i: int) -> None:
        kind = ("tcp", "ipc", "inproc")[i % 3]
        pull = nanopy.Socket("pull")
        push = nanopy.Socket("push")
        url = pull.bind(bind_url(kind)).url
        push.connect(url)
        if i % 25 == 0:
            push.send(b"x")
            assert pull.recv(timeout=5) == b"x"
        push.close(linger=0)
        pull.close(linger=0)

    for i in range(6):  # warm up: engine thread, imports, lazy registries
        cycle(i)
    threads0, fds0 = _resources()
    t0 = time.monotonic()
    for i in range(500):
        cycle(i)
    elapsed = time.monotonic() - t0
    # Closed pipes finish in the engine shortly after close() returns.
    wait_until(lambda: _resources() <= (threads0, fds0), timeout=5, what=f"resources back to {(threads0, fds0)}")
    assert elapsed < 30


# -- fork ----------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # 3.12+: docs/api.md
def test_fork_old_socket_is_closed_new_one_works(make_socket: Factory) -> None:
    parent_pull = make_socket("pull")
    url = parent_pull.bind("tcp://127.0.0.1:0").url
    old = make_socket("push", connect=url)
    old.send(b"before fork", timeout=5)
    assert parent_pull.recv(timeout=5) == b"before fork"

    pid = os.fork()
    if pid == 0:  # child: report through the exit code only
        code = 1
        try:
            code = _child(old, url)
        except BaseException:
            code = 99
        finally:
            os._exit(code)
    try:
        assert parent_pull.recv(timeout=10) == b"from child"
    finally:
        status = reap_child(pid, timeout=15)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child exit status {status}"
    # The parent's sockets are unaffected.
    old.send(b"parent still works", timeout=5)
    assert parent_pull.recv(timeout=5) == b"parent still works"


def _child(old: nanopy.Socket, url: str) -> int:
    try:
        old.send(b"x", timeout=1)
        return 2
    except nanopy.Closed as exc:
        if "fork" not in str(exc):
            return 3
    try:
        old.recv_msg(timeout=0)
        return 4
    except nanopy.Closed:
        pass
    except nanopy.ProtocolError:
        return 5
    old.close()  # harmless
    with nanopy.Socket("push", connect=url) as new:
        new.send(b"from child", timeout=5)
    return 0


# -- Ctrl-C ---------------------------------------------------------------------------------------------------


@pytest.fixture
def sigint_raises_keyboard_interrupt() -> Iterator[None]:
    """Install Python's Ctrl-C handler for the test, whatever the shell left.

    A shell starts background jobs with SIGINT ignored; Python then keeps it
    ignored, and a test relying on the default handler would hang.
    """
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
@pytest.mark.parametrize("op", ["recv", "send"])
def test_keyboard_interrupt_reaches_a_blocked_call(
    make_socket: Factory, op: str, sigint_raises_keyboard_interrupt: None
) -> None:
    push, pull = push_pull(make_socket, "inproc")
    main = threading.main_thread().ident
    assert main is not None
    call = pull.recv if op == "recv" else (lambda: make_socket("push").send(b"x"))
    timer = threading.Timer(0.2, signal.pthread_kill, args=(main, signal.SIGINT))
    t0 = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            call()
    finally:
        timer.cancel()
    assert time.monotonic() - t0 < 1.5
    # The interrupted call took nothing and left no waiter behind.
    assert not pull._driver.recv_q.waiters
    push.send(b"after ^C")
    assert pull.recv(timeout=5) == b"after ^C"
