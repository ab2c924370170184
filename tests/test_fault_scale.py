"""Fault tier: many pipes on one socket, and a listener that runs out of descriptors."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from collections.abc import Callable

import pytest
from faults import open_fds

import nanopy
from nanopy.testing import wait_no_pipes, wait_pipes

pytestmark = [pytest.mark.fault, pytest.mark.usefixtures("no_nanopy_errors")]

MakeSocket = Callable[..., nanopy.Socket]
PIPES = 1000


def test_a_thousand_pipes_on_one_socket(make_socket: MakeSocket) -> None:
    nanopy.Socket("pull", bind="tcp://127.0.0.1:0").close(linger=0)  # the engine exists from here on
    fds_before = open_fds()
    pull = make_socket("pull", recv_timeout=20)
    url = pull.bind("tcp://127.0.0.1:0").url
    push = make_socket("push", send_timeout=20)
    for _ in range(PIPES):
        push.connect(url)  # one endpoint, one pipe each
    wait_pipes(pull, PIPES, timeout=60)
    wait_pipes(push, PIPES, timeout=60)
    total = 5 * PIPES
    for n in range(total):
        push.send(n.to_bytes(4, "big"))
    per_pipe: dict[int, list[int]] = defaultdict(list)
    for _ in range(total):
        msg = pull.recv_msg()
        per_pipe[msg.pipe.id].append(int.from_bytes(msg.body, "big"))
    got = sorted(n for seqs in per_pipe.values() for n in seqs)
    assert got == list(range(total))  # nothing lost or duplicated
    assert all(seqs == sorted(seqs) for seqs in per_pipe.values())  # in order per pipe
    assert len(per_pipe) > PIPES // 2  # load-balanced over the pipes
    started = time.monotonic()
    push.close(linger=0)
    wait_no_pipes(pull, timeout=30)
    pull.close(linger=0)
    assert time.monotonic() - started < 20
    assert open_fds() <= fds_before + 2


LIMITED_LISTENER = """
import logging, os, resource, sys
import nanopy
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
pull = nanopy.Socket("pull", bind="tcp://127.0.0.1:0", recv_timeout=30)
spare = len(os.listdir("/proc/self/fd")) + 8
resource.setrlimit(resource.RLIMIT_NOFILE, (spare, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
print(pull.endpoints[0].url, flush=True)
assert pull.recv() == b"still listening"
print("got it", flush=True)
pull.close()
"""


def test_listener_out_of_descriptors_recovers() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(LIMITED_LISTENER)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    hogs: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        host, _, port = url.removeprefix("tcp://").rpartition(":")
        for _ in range(40):  # far more connections than the child has descriptors
            hogs.append(socket.create_connection((host, int(port)), timeout=5))
        time.sleep(0.3)  # let the child hit EMFILE (it backs off and retries)
        for s in hogs:
            s.close()
        with nanopy.Socket("push", connect=url, send_timeout=20) as push:
            push.send(b"still listening")
            assert proc.stdout.readline().strip() == "got it"
        assert proc.wait(30) == 0
    finally:
        for s in hogs:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert "ERROR" not in err and "Traceback" not in err, err
