"""Many threads on one PUSH/PULL pair: every message delivered exactly once, each
sender's messages in order as seen by any one receiver."""

from __future__ import annotations

import struct
import threading
import time
from collections import Counter

import pytest
from conftest import bind_url

import nanopy
from nanopy.testing import connect_pair

SENDERS = 8
RECEIVERS = 8
PER_SENDER = 8000
_REC = struct.Struct(">HI")


@pytest.mark.parametrize("kind", ["tcp", "ipc", "inproc"])
def test_threads_send_and_receive_exactly_once(kind: str) -> None:
    pull = nanopy.Socket("pull", recv_buffer=64)
    push = nanopy.Socket("push", send_buffer=64)
    try:
        connect_pair(pull, push, bind_url(kind))
        total = SENDERS * PER_SENDER
        got: list[list[bytes]] = [[] for _ in range(RECEIVERS)]
        count = [0]
        count_lock = threading.Lock()
        done = threading.Event()
        errors: list[BaseException] = []
        pad = b"." * 40

        def sender(tid: int) -> None:
            try:
                for seq in range(PER_SENDER):
                    push.send(_REC.pack(tid, seq) + pad, timeout=10)
            except BaseException as exc:
                errors.append(exc)

        def receiver(rid: int) -> None:
            mine = got[rid]
            try:
                while not done.is_set():
                    try:
                        body = pull.recv(timeout=0.2)
                    except nanopy.Timeout:
                        continue
                    mine.append(body)
                    with count_lock:
                        count[0] += 1
                        if count[0] == total:
                            done.set()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=receiver, args=(r,)) for r in range(RECEIVERS)]
        threads += [threading.Thread(target=sender, args=(s,)) for s in range(SENDERS)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        finished = done.wait(30)
        done.set()
        for t in threads:
            t.join(10)
        elapsed = time.monotonic() - t0
        assert errors == []
        assert finished, f"only {count[0]} of {total} messages arrived"
        # Exactly once.
        seen = Counter(_REC.unpack_from(b) for per in got for b in per)
        assert len(seen) == total and max(seen.values()) == 1
        # Per receiver, each sender's messages come in the order they were sent.
        for per in got:
            last: dict[int, int] = {}
            for body in per:
                tid, seq = _REC.unpack_from(body)
                assert seq > last.get(tid, -1)
                last[tid] = seq
        # Work was shared (not one receiver taking everything).
        assert sum(1 for per in got if per) >= 2
        push.send(b"sentinel", timeout=5)
        assert pull.recv(timeout=5) == b"sentinel"  # nothing extra came before it
        stats = pull.stats()
        assert stats.messages_received == total + 1
        assert push.stats().messages_sent == total + 1
        assert elapsed < 30
    finally:
        push.close(linger=0)
        pull.close(linger=0)


def test_threads_trio_and_asyncio_share_one_pair() -> None:
    """Sync threads, a trio loop and an asyncio loop (each in its own thread) send
    and receive on the same two sockets at once."""
    import asyncio

    import trio

    per = 2000
    pull = nanopy.Socket("pull", recv_buffer=32)
    push = nanopy.Socket("push", send_buffer=32)
    try:
        connect_pair(pull, push, "tcp://127.0.0.1:0")
        total = 3 * per
        received: list[bytes] = []
        lock = threading.Lock()
        done = threading.Event()
        errors: list[BaseException] = []

        def note(body: bytes) -> None:
            with lock:
                received.append(body)
                if len(received) == total:
                    done.set()

        def guard(fn: object) -> object:
            def run() -> None:
                try:
                    fn()  # type: ignore[operator]
                except BaseException as exc:
                    errors.append(exc)
            return run

        def sync_sender() -> None:
            for i in range(per):
                push.send(b"s%d" % i, timeout=10)

        def sync_receiver() -> None:
            while not done.is_set():
                try:
                    note(pull.recv(timeout=0.1))
                except nanopy.Timeout:
                    pass

        async def async_receiver() -> None:
            # Runs under trio and under asyncio alike: it only awaits pull.arecv.
            while not done.is_set():
                try:
                    note(await pull.arecv(timeout=0.1))
                except nanopy.Timeout:
                    pass

        async def trio_main() -> None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(async_receiver)
                for i in range(per):
                    await push.asend(b"t%d" % i, timeout=10)

        async def asyncio_main() -> None:
            task = asyncio.create_task(async_receiver())
            for i in range(per):
                await push.asend(b"a%d" % i, timeout=10)
            await task

        threads = [
            threading.Thread(target=guard(sync_sender)),
            threading.Thread(target=guard(sync_receiver)),
            threading.Thread(target=guard(lambda: trio.run(trio_main))),
            threading.Thread(target=guard(lambda: asyncio.run(asyncio_main()))),
        ]
        for t in threads:
            t.start()
        finished = done.wait(30)
        done.set()
        for t in threads:
            t.join(10)
        assert errors == []
        assert finished, f"{len(received)} of {total} arrived"
        assert sorted(received) == sorted([b"%s%d" % (k, i) for k in (b"s", b"t", b"a") for i in range(per)])
    finally:
        push.close(linger=0)
        pull.close(linger=0)
