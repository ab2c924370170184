"""Errors a user should understand (issue 10): each names its cause and the fix."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
from conftest import bind_url, wait_until

import nanopy
from nanopy.testing import wait_pipes

MakeSocket = Callable[..., nanopy.Socket]


@pytest.mark.parametrize("url", ["ws://127.0.0.1:0/x", "wss://127.0.0.1:0/x"])
@pytest.mark.parametrize("how", ["bind", "connect"])
def test_ws_without_the_ws_extra_says_what_to_install(url: str, how: str) -> None:
    # A child process where the websockets package cannot be imported.
    code = textwrap.dedent(f"""
        import sys
        sys.modules["websockets"] = None
        import nanopy
        try:
            nanopy.Socket("pair", {how}={url!r})
        except nanopy.AddressError as exc:
            print("AddressError:", exc)
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "AddressError:" in out.stdout
    assert "nanopy[ws]" in out.stdout and "websockets" in out.stdout


@pytest.mark.parametrize("op", ["recv", "send"])
def test_timeout_without_a_peer_says_no_peer_connected(make_socket: MakeSocket, op: str) -> None:
    sock = make_socket("pair")
    sock.bind(bind_url("tcp"))
    with pytest.raises(nanopy.Timeout, match="no peer connected"):
        sock.recv(timeout=0.05) if op == "recv" else sock.send(b"x", timeout=0.05)


def test_timeout_with_a_peer_does_not_blame_the_peer(make_socket: MakeSocket) -> None:
    a = make_socket("pair")
    url = a.bind(bind_url("tcp")).url
    make_socket("pair", connect=url)
    wait_pipes(a)
    with pytest.raises(nanopy.Timeout) as info:
        a.recv(timeout=0.05)
    assert "no peer" not in str(info.value)


def test_a_rejected_pipe_is_logged_at_info_with_its_address(
    make_socket: MakeSocket, caplog: pytest.LogCaptureFixture
) -> None:
    server = make_socket("pull")
    rejected = []
    server.on_pipe_added(lambda pipe: rejected.append(pipe.remote_address) or False)
    url = server.bind(bind_url("tcp")).url
    with caplog.at_level(logging.INFO, logger="nanopy"):
        make_socket("push", connect=url)
        wait_until(lambda: any("rejected" in r.getMessage() for r in caplog.records), what="the log line")
    record = next(r for r in caplog.records if "rejected" in r.getMessage())
    assert record.levelno == logging.INFO
    assert rejected[0] in record.getMessage()  # the pipe's address
    assert "on_pipe_added" in record.getMessage()
    assert server.stats().pipes == 0


def test_oversized_messages_are_counted_where_they_are_refused(
    make_socket: MakeSocket, stream_transport: str
) -> None:
    pull = make_socket("pull", recv_max_size=100)
    url = pull.bind(bind_url(stream_transport)).url
    push = make_socket("push", connect=url)
    wait_pipes(pull)
    push.send(b"x" * 1000)
    wait_until(lambda: pull.stats().messages_too_large == 1, what="the oversized message counted")
    stats = pull.stats()
    assert stats.protocol_errors >= 1
    assert stats.messages_received == 0
