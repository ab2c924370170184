"""Signalling between threads with PAIR over inproc (the Guide's mtrelay).

Three steps run in three threads; each tells the next it is ready by sending
one message over an inproc PAIR socket. PAIR is exclusive (a second peer is
refused), so a signal can only come from the step before.

    python examples/guide/mtrelay.py
"""

from __future__ import annotations

import threading

import nanopy
from nanopy.testing import inproc_url

STEP2 = inproc_url("step2")
STEP3 = inproc_url("step3")


def step1() -> None:
    with nanopy.Socket("pair", connect=STEP2) as xmitter:
        print("Step 1 ready, signalling step 2", flush=True)
        xmitter.send(b"READY")


def step2() -> None:
    with nanopy.Socket("pair", bind=STEP2, recv_timeout=10.0) as receiver:
        threading.Thread(target=step1).start()
        receiver.recv()  # wait for step 1
    with nanopy.Socket("pair", connect=STEP3) as xmitter:
        print("Step 2 ready, signalling step 3", flush=True)
        xmitter.send(b"READY")


def main() -> None:
    with nanopy.Socket("pair", bind=STEP3, recv_timeout=10.0) as receiver:
        threading.Thread(target=step2).start()
        assert receiver.recv() == b"READY"
    print("Test successful!")


if __name__ == "__main__":
    main()
