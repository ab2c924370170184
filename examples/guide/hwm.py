"""High-water marks: what happens when a reader falls behind (the Guide's HWM section).

In nanopy the high-water marks are ``send_buffer`` and ``recv_buffer``, counted
in messages *per pipe*. When they are full:

1. PUSH (and REQ, PAIR, BUS...) blocks -- ``send(timeout=0)`` raises Timeout;
2. PUB skips that subscriber and a SUB keeps the newest ``recv_buffer``
   messages (``overflow="drop"``, the default): nothing ever blocks;
3. with ``overflow="block"`` PUB/SUB become lossless instead, and a stuck
   subscriber stalls the publisher (``send`` raises Timeout after ``send_timeout``).

    python examples/guide/hwm.py
"""

from __future__ import annotations

import nanopy
from nanopy.testing import inproc_url, wait_pipes


def push_blocks() -> None:
    with nanopy.Socket("pull", recv_buffer=10, bind=inproc_url("hwm")) as pull, nanopy.Socket(
        "push", send_buffer=10, connect=pull.endpoints[0].url
    ) as push:
        wait_pipes(push)
        queued = 0
        try:
            while True:
                push.send(b"job", timeout=0.2)
                queued += 1
        except nanopy.Timeout:
            pass
        print(f"PUSH: {queued} messages queued (send_buffer=10, recv_buffer=10), then send blocked")
        assert pull.recv(timeout=5) == b"job"


def pub_drops() -> None:
    with nanopy.Socket("sub", recv_buffer=10, bind=inproc_url("hwm")) as sub, nanopy.Socket(
        "pub", connect=sub.endpoints[0].url
    ) as pub:
        sub.subscribe(b"")
        wait_pipes(pub)
        for i in range(1000):
            pub.send(b"%d" % i)
        pub.send(b"END")  # the newest message always survives "drop"
        kept = []
        while (msg := sub.recv(timeout=5)) != b"END":
            kept.append(int(msg))
        dropped = sub.stats().messages_dropped + pub.stats().messages_dropped
        print(
            f"PUB/SUB drop: 1000 sent, {len(kept)} kept, {dropped} dropped "
            f"(all accounted for: {len(kept) + dropped == 1000}); the newest survive: {kept[-1] == 999}"
        )


def pub_blocks() -> None:
    with nanopy.Socket("sub", recv_buffer=10, overflow="block", bind=inproc_url("hwm")) as sub, nanopy.Socket(
        "pub", send_buffer=10, overflow="block", send_timeout=0.2, connect=sub.endpoints[0].url
    ) as pub:
        sub.subscribe(b"")
        wait_pipes(pub)
        sent = 0
        try:
            while True:
                pub.send(b"%d" % sent)
                sent += 1
        except nanopy.Timeout:
            pass
        received = [int(sub.recv(timeout=5)) for _ in range(sent)]
        print(
            f"PUB/SUB block: {sent} sent before Timeout (subscriber not reading), "
            f"{len(received)} received, in order and none lost: {received == list(range(sent))}"
        )


def main() -> None:
    push_blocks()
    pub_drops()
    pub_blocks()


if __name__ == "__main__":
    main()
