"""REQ/REP, SURVEYOR/RESPONDENT, BUS and PAIR1 against NNG (pynng, nngcat) and nanomsg (nanocat).

Every pairing runs over tcp and ipc, with nanopy binding and with the peer binding.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import bind_url
from peers import free_tcp_url, need_tool, pynng_socket, read_exactly, run_tool, wait_exit

import nanopy
from nanopy.testing import ipc_url, wait_pipes

pytestmark = pytest.mark.interop

MakeSocket = Callable[..., nanopy.Socket]
TRANSPORTS = ["tcp", "ipc"]
BINDERS = ["nanopy-binds", "peer-binds"]


def free_url(transport: str) -> str:
    return free_tcp_url() if transport == "tcp" else ipc_url("iop")


def link_pynng(sock: nanopy.Socket, peer: Any, transport: str, binder: str) -> None:
    """Connect a nanopy socket and a pynng socket, either side listening.

    Returns once *both* sides have the pipe (pynng adds it a little after the
    handshake; a survey or bus message sent before then would miss it).
    """
    ready = threading.Event()
    peer.add_post_pipe_connect_cb(lambda _pipe: ready.set())
    if binder == "nanopy-binds":
        url = sock.bind(bind_url(transport)).url
        peer.dial(url, block=True)
    else:
        url = free_url(transport)
        peer.listen(url)
        sock.connect(url)
    wait_pipes(sock)
    assert ready.wait(5), "pynng did not see the pipe"


def tool_addr(sock: nanopy.Socket, transport: str, binder: str) -> list[str]:
    """Bind/connect ``sock`` and return the tool's address arguments."""
    if binder == "nanopy-binds":
        return ["--connect", sock.bind(bind_url(transport)).url]
    url = free_url(transport)
    sock.connect(url)
    return ["--bind", url]


def nng_addr(args: list[str]) -> list[str]:
    return ["--dial" if args[0] == "--connect" else "--listen", args[1]]


params = pytest.mark.parametrize(
    "transport,binder", [(t, b) for t in TRANSPORTS for b in BINDERS]
)


# -- pynng ----------------------------------------------------------------------------------


@params
def test_nanopy_req_pynng_rep(make_socket: MakeSocket, transport: str, binder: str) -> None:
    req = make_socket("req", recv_timeout=5)
    with pynng_socket("Rep0", recv_timeout=5000) as rep:
        link_pynng(req, rep, transport, binder)
        req.send(b"ping")
        assert rep.recv() == b"ping"
        rep.send(b"pong")
        assert req.recv() == b"pong"
        # request() too, from two threads at once.
        out: dict[int, bytes] = {}
        threads = [
            threading.Thread(target=lambda i=i: out.__setitem__(i, req.request(b"q%d" % i, timeout=5)))
            for i in range(2)
        ]
        for t in threads:
            t.start()
        # pynng's REP answers one request at a time, in arrival order.
        for _ in range(2):
            q = rep.recv()
            rep.send(b"a" + q[1:])
        for t in threads:
            t.join(5)
        assert out == {0: b"a0", 1: b"a1"}


@params
def test_pynng_req_nanopy_rep(make_socket: MakeSocket, transport: str, binder: str) -> None:
    rep = make_socket("rep", recv_timeout=5)
    with pynng_socket("Req0", recv_timeout=5000) as req:
        link_pynng(rep, req, transport, binder)
        for i in range(3):
            req.send(b"q%d" % i)
            msg = rep.recv_msg()
            assert msg.body == b"q%d" % i
            msg.reply(b"a%d" % i)
            assert req.recv() == b"a%d" % i
        req.send(b"classic")
        assert rep.recv() == b"classic"
        rep.send(b"ok")
        assert req.recv() == b"ok"


@params
def test_nanopy_surveyor_pynng_respondent(make_socket: MakeSocket, transport: str, binder: str) -> None:
    sv = make_socket("surveyor", survey_deadline=2.0)
    with pynng_socket("Respondent0", recv_timeout=5000) as resp:
        link_pynng(sv, resp, transport, binder)
        answers = sv.survey(b"who?")
        assert resp.recv() == b"who?"
        resp.send(b"me")
        assert next(answers) == b"me"


@params
def test_pynng_surveyor_nanopy_respondent(make_socket: MakeSocket, transport: str, binder: str) -> None:
    resp = make_socket("respondent", recv_timeout=5)
    with pynng_socket("Surveyor0", recv_timeout=5000, survey_time=5000) as sv:
        link_pynng(resp, sv, transport, binder)
        sv.send(b"who?")
        msg = resp.recv_msg()
        assert msg.body == b"who?"
        msg.reply(b"me")
        assert sv.recv() == b"me"


def _exchange_both_ways(sock: Any, peer: Any) -> None:
    """One message nanopy -> pynng, then one pynng -> nanopy, each checked."""
    sock.send(b"from nanopy")
    assert peer.recv() == b"from nanopy"
    peer.send(b"from nng")
    assert sock.recv() == b"from nng"


@params
def test_bus_with_pynng(make_socket: MakeSocket, transport: str, binder: str) -> None:
    bus = make_socket("bus", recv_timeout=5)
    with pynng_socket("Bus0", recv_timeout=5000) as peer:
        link_pynng(bus, peer, transport, binder)
        _exchange_both_ways(bus, peer)


@params
def test_pair1_with_pynng(make_socket: MakeSocket, transport: str, binder: str) -> None:
    pair = make_socket("pair1", recv_timeout=5)
    with pynng_socket("Pair1", recv_timeout=5000) as peer:
        link_pynng(pair, peer, transport, binder)
        _exchange_both_ways(pair, peer)


def test_survey_three_respondents_two_pynng_one_nanopy(make_socket: MakeSocket) -> None:
    """Done means 4: all three answers, and survey() ends within deadline + 0.5 s."""
    deadline = 0.5
    sv = make_socket("surveyor", survey_deadline=deadline)
    url = sv.bind("tcp://127.0.0.1:0").url
    mine = make_socket("respondent", connect=url, recv_timeout=5)
    with pynng_socket("Respondent0", recv_timeout=5000) as r1, pynng_socket(
        "Respondent0", recv_timeout=5000
    ) as r2:
        r1.dial(url, block=True)
        r2.dial(url, block=True)
        wait_pipes(sv, 3)

        def pynng_answer(sock: Any, name: bytes) -> None:
            sock.send(name + b":" + sock.recv())

        def nanopy_answer() -> None:
            msg = mine.recv_msg()
            msg.reply(b"nanopy:" + msg.body)

        workers = [
            threading.Thread(target=pynng_answer, args=(r1, b"nng1")),
            threading.Thread(target=pynng_answer, args=(r2, b"nng2")),
            threading.Thread(target=nanopy_answer),
        ]
        for t in workers:
            t.start()
        t0 = time.monotonic()
        answers = sorted(sv.survey(b"census"))
        elapsed = time.monotonic() - t0
        for t in workers:
            t.join(5)
    assert answers == [b"nanopy:census", b"nng1:census", b"nng2:census"]
    assert elapsed < deadline + 0.5


# -- nngcat / nanocat -------------------------------------------------------------------------


@params
@pytest.mark.parametrize("tool", ["nngcat", "nanocat"])
def test_tool_rep_answers_nanopy_req(make_socket: MakeSocket, tool: str, transport: str, binder: str) -> None:
    exe = need_tool(tool)
    req = make_socket("req")
    addr = tool_addr(req, transport, binder)
    if tool == "nngcat":
        addr = nng_addr(addr)
    with run_tool([exe, "--rep", *addr, "--data", "pong"]):
        assert req.request(b"ping", timeout=10) == b"pong"
        assert req.request(b"ping again", timeout=10) == b"pong"


@params
@pytest.mark.parametrize("tool", ["nngcat", "nanocat"])
def test_tool_req_answered_by_nanopy_rep(make_socket: MakeSocket, tool: str, transport: str, binder: str) -> None:
    exe = need_tool(tool)
    rep = make_socket("rep", recv_timeout=10)
    addr = tool_addr(rep, transport, binder)
    if tool == "nngcat":
        addr = nng_addr(addr)
    with run_tool([exe, "--req", *addr, "--data", "ping", "--ascii"]) as proc:
        msg = rep.recv_msg()
        assert msg.body == b"ping"
        msg.reply(b"pong")
        assert read_exactly(proc, 4).startswith(b"pong")
        assert wait_exit(proc) == 0


@params
@pytest.mark.parametrize("tool", ["nngcat", "nanocat"])
def test_tool_respondent_answers_nanopy_surveyor(
    make_socket: MakeSocket, tool: str, transport: str, binder: str
) -> None:
    exe = need_tool(tool)
    sv = make_socket("surveyor", survey_deadline=0.5)
    addr = tool_addr(sv, transport, binder)
    if tool == "nngcat":
        addr = nng_addr(addr)
    with run_tool([exe, "--respondent", *addr, "--data", "here"]):
        wait_pipes(sv)
        assert list(sv.survey(b"anyone?")) == [b"here"]


@params
@pytest.mark.parametrize("tool", ["nngcat", "nanocat"])
def test_tool_surveyor_with_nanopy_respondent(
    make_socket: MakeSocket, tool: str, transport: str, binder: str
) -> None:
    exe = need_tool(tool)
    resp = make_socket("respondent", recv_timeout=10)
    addr = tool_addr(resp, transport, binder)
    if tool == "nngcat":
        addr = nng_addr(addr)
    # --interval repeats the survey, so one sent before the pipe was up is no loss
    # (nngcat takes whole seconds only).
    interval = "1" if tool == "nngcat" else "0.2"
    with run_tool([exe, "--surveyor", *addr, "--data", "q", "--interval", interval, "--ascii"]) as proc:
        msg = resp.recv_msg()
        assert msg.body == b"q"
        msg.reply(b"answer")
        assert read_exactly(proc, 6) == b"answer"


@params
def test_nanocat_bus_meshes_with_nanopy_bus(make_socket: MakeSocket, transport: str, binder: str) -> None:
    exe = need_tool("nanocat")
    bus = make_socket("bus", recv_timeout=10)
    addr = tool_addr(bus, transport, binder)
    with run_tool([exe, "--bus", *addr, "--data", "hello", "--interval", "0.2", "--ascii"]) as proc:
        assert bus.recv() == b"hello"
        bus.send(b"world")
        assert read_exactly(proc, 6) == b"world\n"


@params
def test_nngcat_pair1(make_socket: MakeSocket, transport: str, binder: str) -> None:
    exe = need_tool("nngcat")
    pair = make_socket("pair1", recv_timeout=10)
    addr = nng_addr(tool_addr(pair, transport, binder))
    with run_tool([exe, "--pair1", *addr, "--data", "from nng", "--interval", "1", "--ascii"]) as proc:
        assert pair.recv() == b"from nng"
        pair.send(b"from nanopy")
        out = b""
        while b"from nanopy" not in out:
            out += read_exactly(proc, 1)
