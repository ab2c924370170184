"""A thread blocked in ``recv`` reads its socket's only pipe itself (the read role);
the pipe may close at any moment under it. Whatever the timing, the receiver sees
messages, ``Timeout`` or ``Closed`` -- never an internal error."""

from __future__ import annotations

import threading

import pytest
from conftest import bind_url

import nanopy

CYCLES = 300


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_receiver_survives_its_pipe_closing_under_it(transport: str) -> None:
    with nanopy.Socket("pull") as pull:
        url = pull.bind(bind_url(transport, "roleclose")).url
        errors: list[BaseException] = []
        received = [0]
        stop = threading.Event()

        def receive() -> None:
            while not stop.is_set():
                try:
                    pull.recv(timeout=0.05)
                    received[0] += 1
                except (nanopy.Timeout, nanopy.Closed):
                    pass
                except BaseException as exc:  # noqa: BLE001 - anything else is the bug
                    errors.append(exc)
                    return

        thread = threading.Thread(target=receive)
        thread.start()
        try:
            for i in range(CYCLES):
                with nanopy.Socket("push", connect=url) as push:
                    push.send(b"%d" % i, timeout=5)
                    if i % 3 == 0:
                        push.close(linger=0)  # sometimes gone before the message is read
        finally:
            stop.set()
            thread.join(10)
        assert not thread.is_alive()
        assert not errors, errors
        assert received[0] > 0
