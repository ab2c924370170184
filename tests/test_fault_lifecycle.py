"""Fault tier: close racing blocked calls, fork under load, and 1,000 create-use-close
cycles per transport with descriptors, threads and memory compared."""

from __future__ import annotations

import os
import random
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from conftest import bind_url
from faults import open_fds, rss_bytes, tagged, untag
from peers import free_tcp_port
from tls_certs import tls_files

import nanopy
from nanopy.testing import wait_pipes

pytestmark = [pytest.mark.fault, pytest.mark.usefixtures("no_nanopy_errors")]

MakeSocket = Callable[..., nanopy.Socket]


# -- close racing send / recv / request ---------------------------------------------------------
def _blocked_call(op: str) -> tuple[nanopy.Socket, Callable[[], Any]]:
    """A socket and a call on it that blocks (no peer)."""
    if op == "send":
        sock = nanopy.Socket("push", bind=bind_url("inproc", "race"))
        return sock, lambda: sock.send(b"x", timeout=30)
    if op == "recv":
        sock = nanopy.Socket("pull", bind=bind_url("inproc", "race"))
        return sock, lambda: sock.recv(timeout=30)
    if op == "request":
        sock = nanopy.Socket("req", bind=bind_url("inproc", "race"))
        return sock, lambda: sock.request(b"q", timeout=30)
    sock = nanopy.Socket("surveyor", survey_deadline=30, bind=bind_url("inproc", "race"))
    return sock, lambda: list(sock.survey(b"q"))


@pytest.mark.parametrize("op", ["send", "recv", "request", "survey"])
def test_close_racing_blocked_calls(op: str) -> None:
    rng = random.Random(op)
    for _ in range(30):
        sock, call = _blocked_call(op)
        outcome: list[BaseException | None] = []

        def run() -> None:
            try:
                call()
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - recorded and checked below
                outcome.append(exc)

        # A new survey ends the open one, so a surveyor gets one caller.
        callers = [threading.Thread(target=run) for _ in range(1 if op == "survey" else 3)]
        for t in callers:
            t.start()
        time.sleep(rng.random() * 0.005)  # close at a random point of the callers' progress
        started = time.monotonic()
        sock.close(linger=0)
        for t in callers:
            t.join(2)
        assert not any(t.is_alive() for t in callers), f"{op} still blocked after close()"
        assert time.monotonic() - started < 2
        assert all(isinstance(exc, nanopy.Closed) for exc in outcome), outcome


def test_close_racing_traffic(make_socket: MakeSocket) -> None:
    """Senders and receivers in full flow while the socket closes: Closed, never anything else."""
    for _ in range(10):
        pull = nanopy.Socket("pull")
        url = pull.bind(bind_url("tcp")).url
        push = make_socket("push", connect=url)
        errors: list[BaseException] = []
        seqs: list[int] = []

        def send() -> None:
            n = 0
            while True:
                try:
                    push.send(tagged(n), timeout=1)
                    n += 1
                except (nanopy.Timeout, nanopy.Closed):
                    return

        def recv() -> None:
            while True:
                try:
                    seqs.append(untag(pull.recv(timeout=5)))
                except nanopy.Closed:
                    return
                except BaseException as exc:  # noqa: BLE001
                    errors.append(exc)
                    return

        threads = [threading.Thread(target=send), threading.Thread(target=recv)]
        for t in threads:
            t.start()
        wait_pipes(pull)
        time.sleep(0.02)
        pull.close(linger=0)
        push.close(linger=0)
        for t in threads:
            t.join(5)
        assert not any(t.is_alive() for t in threads)
        assert not errors, errors
        assert all(a + 1 == b for a, b in zip(seqs, seqs[1:]))


# -- fork under load -----------------------------------------------------------------------------
def test_fork_under_load(make_socket: MakeSocket) -> None:
    pull = make_socket("pull", recv_timeout=10)
    url = pull.bind(bind_url("tcp")).url
    push = make_socket("push", connect=url, send_timeout=10)
    stop = threading.Event()
    sent = [0]

    def pump() -> None:
        while not stop.is_set():
            try:
                push.send(tagged(sent[0]), timeout=0.1)
            except nanopy.Timeout:
                continue  # the receiver paused (forking, or done): look at ``stop`` again
            sent[0] += 1  # (a timed-out send sent nothing: the sequence has no gap)

    pumper = threading.Thread(target=pump, daemon=True)
    pumper.start()
    seqs: list[int] = []
    from_children: set[bytes] = set()

    def take(n: int) -> None:
        """Receive ``n`` messages, sorting a child's greeting from the parent's flow (a
        child may get its message through while the parent is still forking)."""
        for _ in range(n):
            body = pull.recv()
            if body.startswith(b"child "):
                from_children.add(body)
            else:
                seqs.append(untag(body))

    take(100)
    children = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: what we test
        for _ in range(3):
            pid = os.fork()
            if pid == 0:  # child: inherited sockets are closed; new ones work
                code = 1
                try:
                    try:
                        push.send(b"from child", timeout=0)
                    except nanopy.Closed:
                        with nanopy.Socket("push", connect=url) as fresh:
                            fresh.send(b"child %d" % os.getpid(), timeout=10)
                        code = 0
                finally:
                    os._exit(code)
            children.append(pid)
            take(50)
    for _ in range(200_000):
        if len(from_children) == len(children):
            break
        take(1)
    stop.set()
    pumper.join(10)
    for pid in children:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    assert from_children == {b"child %d" % pid for pid in children}
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # the parent's flow was undisturbed


# -- 1,000 create-use-close cycles per transport -------------------------------------------------
CYCLES = 1000


def _endpoint(transport: str) -> tuple[str, dict[str, Any], Callable[[str], str], dict[str, Any]]:
    if transport in ("tcp", "ipc", "inproc"):
        return bind_url(transport, "cycle"), {}, lambda u: u, {}
    if transport == "ws":
        return f"ws://127.0.0.1:{free_tcp_port()}/cycle", {}, lambda u: u, {}
    t = tls_files()
    url = f"wss://127.0.0.1:{free_tcp_port()}/cycle" if transport == "wss" else "tls+tcp://127.0.0.1:0"
    client = {"ssl_context": t.client_ctx}
    return url, {"ssl_context": t.server_ctx}, lambda u: u.replace("127.0.0.1", "localhost"), client


@pytest.mark.parametrize("transport", ["tcp", "ipc", "inproc", "ws", "wss", "tls+tcp"])
def test_create_use_close_cycles_leak_nothing(transport: str) -> None:
    def cycle() -> None:
        url, bind_opts, for_dial, dial_opts = _endpoint(transport)
        pull = nanopy.Socket("pull", recv_timeout=10)
        bound = pull.bind(url, **bind_opts).url
        push = nanopy.Socket("push", send_timeout=10)
        push.connect(for_dial(bound), **dial_opts)
        push.send(b"cycle")
        assert pull.recv() == b"cycle"
        push.close(linger=0)
        pull.close(linger=0)

    # wss too: its close handshake ends at once (1,000 TLS cycles take ~6 s on 2 busy cores).
    cycles = CYCLES
    for _ in range(30):  # warm up: engine, caches, allocator pools
        cycle()
    fds, threads, rss = open_fds(), threading.active_count(), rss_bytes()
    for _ in range(cycles):
        cycle()
    assert open_fds() <= fds + 2, f"{open_fds() - fds} descriptors leaked"
    assert threading.active_count() <= threads, "threads leaked"
    assert rss_bytes() - rss < 16 << 20, f"RSS grew {(rss_bytes() - rss) >> 20} MiB over {cycles} cycles"
