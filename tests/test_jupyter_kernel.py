"""A real Jupyter kernel (ipykernel) driven by nanopy sockets over ZMTP.

The shell channel is a libzmq ROUTER: a nanopy REQ speaks the Jupyter wire
protocol to it (``[<IDS|MSG>, signature, header, parent, metadata, content]``,
HMAC-SHA256 signed) as a multipart body. The iopub channel is a PUB: a nanopy
SUB subscribes to everything and reads the kernel's status and output. Plain
hmac/json/uuid, no jupyter_client.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import reap_child, wait_until

import nanopy
from nanopy.testing import free_port, wait_pipes
from nanopy.zmtp import Multipart

pytest.importorskip("ipykernel")
pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

DELIM = b"<IDS|MSG>"
SESSION = uuid.uuid4().hex


class Kernel:
    """A kernel subprocess: its ports and HMAC key."""

    def __init__(self, proc: subprocess.Popen[bytes], ports: dict[str, int], key: bytes) -> None:
        self.proc = proc
        self.ports = ports
        self.key = key

    def url(self, channel: str) -> str:
        return f"zmtp+tcp://127.0.0.1:{self.ports[channel]}"


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    key = secrets.token_hex(16).encode()
    ports = {f"{ch}_port": free_port() for ch in ("shell", "iopub", "stdin", "control", "hb")}
    conn = Path(tmp_path_factory.mktemp("kernel")) / "kernel.json"
    conn.write_text(json.dumps({"transport": "tcp", "ip": "127.0.0.1", "key": key.decode(),
                                "signature_scheme": "hmac-sha256", **ports}))
    proc = subprocess.Popen([sys.executable, "-m", "ipykernel_launcher", "-f", str(conn)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield Kernel(proc, {k.removesuffix("_port"): v for k, v in ports.items()}, key)
    finally:
        if proc.poll() is None:  # (poll() reaps a kernel that already exited)
            os.kill(proc.pid, signal.SIGKILL)  # by PID: it need not shut down cleanly
            reap_child(proc.pid, timeout=10)
        conn.unlink(missing_ok=True)


def sign(key: bytes, frames: list[bytes]) -> bytes:
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for frame in frames:
        mac.update(frame)
    return mac.hexdigest().encode()


def message(key: bytes, msg_type: str, content: dict[str, Any]) -> tuple[str, list[bytes]]:
    """A signed Jupyter message (from the delimiter on) and its msg_id."""
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": msg_type, "session": SESSION, "username": "nanopy",
              "date": "2026-01-01T00:00:00.000000Z", "version": "5.3"}
    parts = [json.dumps(d).encode() for d in (header, {}, {}, content)]
    return msg_id, [DELIM, sign(key, parts), *parts]


def parse(key: bytes, frames: Sequence[bytes]) -> dict[str, Any]:
    """A received Jupyter message (any identities/topic before the delimiter), its
    signature checked."""
    at = list(frames).index(DELIM)
    signature, *parts = frames[at + 1 : at + 6]
    assert hmac.compare_digest(signature, sign(key, parts)), "bad HMAC signature"
    header, parent, metadata, content = (json.loads(p) for p in parts)
    return {"header": header, "parent": parent, "metadata": metadata, "content": content,
            "type": header["msg_type"]}


def ask(req: nanopy.Socket, key: bytes, msg_type: str, content: dict[str, Any],
        timeout: float = 20) -> dict[str, Any]:
    """One request/reply on the shell channel; the reply must answer this request."""
    msg_id, frames = message(key, msg_type, content)
    reply = req.request(Multipart(frames), timeout=timeout)
    assert isinstance(reply, Multipart), reply
    got = parse(key, reply.parts)
    assert got["parent"]["msg_id"] == msg_id
    assert got["type"] == msg_type.replace("_request", "_reply")
    return got


def execute(code: str) -> dict[str, Any]:
    return {"code": code, "silent": False, "store_history": True, "user_expressions": {},
            "allow_stdin": False, "stop_on_error": True}


@pytest.fixture
def shell(kernel: Kernel, make_socket: Any) -> nanopy.Socket:
    """A REQ on the kernel's shell, answered once (the kernel is up)."""
    req: nanopy.Socket = make_socket("req", recv_timeout=20)
    req.connect(kernel.url("shell"))
    wait_pipes(req, timeout=60)  # the kernel's ROUTER is listening
    info = ask(req, kernel.key, "kernel_info_request", {}, timeout=60)
    assert info["content"]["status"] == "ok"
    return req


def test_200_requests_each_answered_by_its_own_reply(kernel: Kernel, shell: nanopy.Socket) -> None:
    counts = []
    for i in range(200):
        if i % 2:
            assert ask(shell, kernel.key, "kernel_info_request", {})["content"]["status"] == "ok"
        else:
            got = ask(shell, kernel.key, "execute_request", execute(f"x = {i}*{i}"))
            assert got["content"]["status"] == "ok", got["content"]
            counts.append(got["content"]["execution_count"])
    assert counts == sorted(counts) and len(set(counts)) == 100
    check = ask(shell, kernel.key, "execute_request",
                execute("x == 198*198") | {"user_expressions": {"y": "x"}})
    assert check["content"]["user_expressions"]["y"]["data"]["text/plain"] == str(198 * 198)


def test_iopub_status_and_output(kernel: Kernel, shell: nanopy.Socket, make_socket: Any) -> None:
    sub: nanopy.Socket = make_socket("sub", recv_timeout=1)
    sub.subscribe(b"")
    sub.connect(kernel.url("iopub"))
    wait_pipes(sub, timeout=10)
    # A PUB drops what it sends before our SUBSCRIBE reaches it: knock (kernel_info
    # makes a busy/idle pair) until iopub carries something, bounded.
    deadline = time.monotonic() + 30
    while True:
        ask(shell, kernel.key, "kernel_info_request", {})
        try:
            parse(kernel.key, sub.recv_multipart())
            break
        except nanopy.Timeout:
            assert time.monotonic() < deadline, "iopub stayed silent"
    msg_id, frames = message(kernel.key, "execute_request", execute("print('hello from nanopy')"))
    answer = shell.request(Multipart(frames))
    assert isinstance(answer, Multipart)
    reply = parse(kernel.key, answer.parts)
    assert reply["parent"]["msg_id"] == msg_id and reply["content"]["status"] == "ok"
    seen: list[dict[str, Any]] = []
    while not seen or (seen[-1]["type"], seen[-1]["content"].get("execution_state")) != ("status", "idle"):
        got = parse(kernel.key, sub.recv_multipart(timeout=20))
        if got["parent"].get("msg_id") == msg_id:
            seen.append(got)
    kinds = [(m["type"], m["content"].get("execution_state") or m["content"].get("name")) for m in seen]
    assert kinds[0] == ("status", "busy") and kinds[-1] == ("status", "idle"), kinds
    assert ("execute_input", None) in kinds and ("stream", "stdout") in kinds, kinds
    inp = next(m for m in seen if m["type"] == "execute_input")
    assert inp["content"]["code"] == "print('hello from nanopy')"
    out = "".join(m["content"]["text"] for m in seen if m["type"] == "stream")
    assert out == "hello from nanopy\n"


def test_a_request_queued_behind_one_in_flight(kernel: Kernel, shell: nanopy.Socket) -> None:
    """The first execution blocks in the kernel until the test lets it go, so the
    second request provably waits in the REQ pipe's outbox, then both are answered."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as gate:
        gate.settimeout(30)
        port = gate.getsockname()[1]
        first = execute(f"import socket as _s; _c = _s.create_connection(('127.0.0.1', {port})); "
                        "_c.recv(1); _c.close(); first = 1")
        replies: dict[str, dict[str, Any]] = {}

        def run(name: str, content: dict[str, Any]) -> None:
            replies[name] = ask(shell, kernel.key, "execute_request", content)

        t1 = threading.Thread(target=run, args=("first", first))
        t1.start()
        conn, _ = gate.accept()  # the first request is executing
        with conn:
            t2 = threading.Thread(target=run, args=("second", execute("second = first + 1")))
            t2.start()
            wait_until(lambda: sum(p.queued_out for p in shell.pipes()) == 1,
                       what="the second request waiting in the outbox")
            assert "second" not in replies
            conn.sendall(b"!")
            for t in (t1, t2):
                t.join(30)
    assert replies["first"]["content"]["status"] == "ok", replies["first"]["content"]
    assert replies["second"]["content"]["status"] == "ok", replies["second"]["content"]
    assert replies["second"]["content"]["execution_count"] == replies["first"]["content"]["execution_count"] + 1


def test_a_late_reply_to_an_abandoned_request_is_not_taken_for_the_next(
        kernel: Kernel, shell: nanopy.Socket) -> None:
    """A request abandoned after it was written still gets its reply later; the REQ
    must drop it, and the next request must get its own reply."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as gate:
        gate.settimeout(30)
        port = gate.getsockname()[1]
        blocked = execute(f"import socket as _s; _c = _s.create_connection(('127.0.0.1', {port})); "
                          "_c.recv(1); _c.close()")
        _, frames = message(kernel.key, "execute_request", blocked)

        async def abandon() -> socket.socket:
            # cancelled only once the kernel runs it: written, so its reply will come
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(shell.arequest, Multipart(frames), timeout=None))
                conn, _ = await trio.to_thread.run_sync(gate.accept)
                nursery.cancel_scope.cancel()
            return conn

        with trio.run(abandon) as conn:
            conn.sendall(b"!")
    assert ask(shell, kernel.key, "kernel_info_request", {})["content"]["status"] == "ok"
    assert shell.stats().drops.get("cancelled") == 1  # the late reply, dropped
    assert ask(shell, kernel.key, "execute_request", execute("z = 1"))["content"]["status"] == "ok"
