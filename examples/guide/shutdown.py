"""Clean shutdown (the Guide's rules, the nanopy way).

nanopy has no context to terminate. Shutting down cleanly means:

1. ``close()`` (or leaving a ``with`` block) gives queued messages up to
   ``linger`` seconds to be written, so a sender may close right after sending;
2. closing a socket from any thread wakes every call blocked on it with
   ``nanopy.Closed`` -- the way to stop worker threads;
3. ``close(linger=0)`` drops whatever is still queued, at once.

    python examples/guide/shutdown.py
"""

from __future__ import annotations

import threading

import nanopy

MESSAGES = 1000


def linger_delivers() -> None:
    with nanopy.Socket("pull", bind="tcp://127.0.0.1:0", recv_timeout=10.0) as pull:
        with nanopy.Socket("push", connect=pull.endpoints[0].url) as push:
            for i in range(MESSAGES):
                push.send(b"%d" % i)
        # The PUSH is closed here; its queued messages were flushed first.
        got = [int(pull.recv()) for _ in range(MESSAGES)]
    print(f"linger: sent {MESSAGES}, closed at once, received {len(got)} in order: {got == list(range(MESSAGES))}")


def close_stops_workers() -> None:
    pull = nanopy.Socket("pull", bind="tcp://127.0.0.1:0")
    stopped: list[str] = []

    def worker(n: int) -> None:
        try:
            pull.recv()  # blocks: nobody sends
        except nanopy.Closed:
            stopped.append(f"worker {n}")

    workers = [threading.Thread(target=worker, args=(n,)) for n in range(3)]
    for t in workers:
        t.start()
    pull.close()  # from the main thread
    for t in workers:
        t.join()
    print(f"close(): {len(stopped)} blocked workers woke with Closed and stopped")


def main() -> None:
    linger_delivers()
    close_stops_workers()
    print("all sockets closed, exiting")


if __name__ == "__main__":
    main()
