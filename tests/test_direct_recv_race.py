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


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
@pytest.mark.parametrize("call", ["recv", "recv_batch"])
def test_receiver_sees_closed_when_its_socket_closes_under_it(transport: str, call: str) -> None:
    """Another thread closes the socket while one receives (directly, from its only
    pipe): the receiver gets Closed -- never an OSError of a descriptor closed under it."""
    for i in range(40):
        pull = nanopy.Socket("pull")
        url = pull.bind(bind_url(transport, f"sockclose{i}")).url
        with nanopy.Socket("push", connect=url) as push:
            push.send(b"first", timeout=5)
            outcome: list[BaseException | None] = []

            def receive() -> None:
                try:
                    while True:
                        pull.recv(timeout=5) if call == "recv" else pull.recv_batch(16, timeout=5)
                except BaseException as exc:  # noqa: BLE001 - the outcome is the assertion
                    outcome.append(exc)

            thread = threading.Thread(target=receive)
            thread.start()
            push.send(b"second", timeout=5)
            pull.close(linger=0)
            thread.join(10)
        assert not thread.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], nanopy.Closed), outcome
