"""Fault tier: peers SIGKILLed mid-conversation over tcp, ipc and ws, then brought back.

A REP server in a child process is killed with SIGKILL while a nanopy REQ keeps
asking, and a new one is started on the same address: every request still gets
its own, intact answer (REQ resends), nothing hangs. Then the roles swap: a
nanopy REP outlives its killed REQ clients and serves the next one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from faults import serve_replies, tagged, untag
from peers import free_tcp_port

import nanopy
from nanopy.testing import ipc_url, wait_no_pipes, wait_pipes

pytestmark = [pytest.mark.fault, pytest.mark.usefixtures("no_nanopy_errors")]

MakeSocket = Callable[..., nanopy.Socket]
FAST = {"reconnect_interval": 0.02, "reconnect_interval_max": 0.1}

REP_SERVER = """
import sys, nanopy
with nanopy.Socket("rep", bind=sys.argv[1]) as rep:
    print("ready", flush=True)
    while True:
        msg = rep.recv_msg(timeout=None)
        msg.reply(msg.body[::-1])
"""

REQ_CLIENT = """
import sys, nanopy
with nanopy.Socket("req", connect=sys.argv[1], recv_timeout=20) as req:
    n = 0
    while True:
        req.send(b"ping %d" % n)
        assert req.recv() == b"pong %d" % n
        n += 1
        if n == 3:
            print("ready", flush=True)
"""


def _url(transport: str) -> str:
    if transport == "tcp":
        return f"tcp://127.0.0.1:{free_tcp_port()}"
    if transport == "ipc":
        return ipc_url("kill")
    return f"ws://127.0.0.1:{free_tcp_port()}/kill"


@contextmanager
def _child(code: str, url: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), url], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"  # blocks until the child is up
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.mark.parametrize("transport", ["tcp", "ipc", "ws"])
def test_killed_rep_server_is_replaced_and_req_carries_on(make_socket: MakeSocket, transport: str) -> None:
    url = _url(transport)
    req = make_socket("req", resend_interval=0.3, recv_timeout=20, **FAST)
    req.connect(url)
    seq = 0
    for _ in range(3):  # three server lifetimes
        with _child(REP_SERVER, url) as server:
            for _ in range(10):
                body = tagged(seq)
                req.send(body)
                assert untag(req.recv()[::-1]) == seq
                seq += 1
            body = tagged(seq)
            req.send(body)  # in flight (maybe answered, maybe not) when the server dies
            os.kill(server.pid, signal.SIGKILL)
            server.wait(10)
        wait_no_pipes(req)
        # The outstanding request is resent to the next server.
        with _child(REP_SERVER, url):
            assert untag(req.recv()[::-1]) == seq
            seq += 1
    assert req.stats().protocol_errors == 0


@pytest.mark.parametrize("transport", ["tcp", "ipc", "ws"])
def test_rep_outlives_killed_clients(make_socket: MakeSocket, transport: str) -> None:
    rep = make_socket("rep", **FAST)
    url = rep.bind(_url(transport)).url
    serve_replies(rep, lambda body: body.replace(b"ping", b"pong"))
    for _ in range(3):
        with _child(REQ_CLIENT, url) as client:
            wait_pipes(rep)
            os.kill(client.pid, signal.SIGKILL)
            client.wait(10)
        wait_no_pipes(rep)
    assert rep.stats().pipes == 0
    # A fresh client is served as if nothing happened.
    req = make_socket("req", connect=url, recv_timeout=10)
    req.send(b"ping 0")
    assert req.recv() == b"pong 0"
