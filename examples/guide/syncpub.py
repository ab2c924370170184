"""Node coordination: a publisher waits for its subscribers (the Guide's syncpub/syncsub).

PUB/SUB has a "slow joiner" problem: a subscriber that connects late misses
what was published before. Here each subscriber first waits until its SUB
pipe is up, then says so over REQ/REP; the publisher starts once all have
checked in. With ``overflow="block"`` on both sides the feed is also
lossless: a subscriber that falls behind slows the publisher down instead of
losing updates (the Guide's version loses some).

    python examples/guide/syncpub.py [--subscribers N] [--updates N]
"""

from __future__ import annotations

import argparse
import threading

import nanopy


def subscriber(pub_url: str, sync_url: str, n: int, counts: dict[int, int]) -> None:
    connected = threading.Event()
    with nanopy.Socket("sub", overflow="block", recv_timeout=30.0) as sub:
        sub.on_pipe_added(lambda pipe: connected.set())
        sub.subscribe(b"")
        sub.connect(pub_url)
        connected.wait(10)  # only now can nothing published be missed
        with nanopy.Socket("req", connect=sync_url, recv_timeout=10.0) as sync:
            sync.send(b"ready")
            sync.recv()
        received = 0
        while sub.recv() != b"END":
            received += 1
    counts[n] = received
    print(f"Subscriber {n}: received {received} updates", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=3)
    parser.add_argument("--updates", type=int, default=20_000)
    args = parser.parse_args()

    with nanopy.Socket("pub", overflow="block", send_timeout=30.0, bind="tcp://127.0.0.1:0") as pub, nanopy.Socket(
        "rep", bind="tcp://127.0.0.1:0", recv_timeout=10.0
    ) as sync:
        counts: dict[int, int] = {}
        subs = [
            threading.Thread(target=subscriber, args=(pub.endpoints[0].url, sync.endpoints[0].url, n, counts))
            for n in range(args.subscribers)
        ]
        for t in subs:
            t.start()
        for _ in range(args.subscribers):
            sync.recv()
            sync.send(b"")
        print(f"Publisher: {args.subscribers} subscribers ready, sending {args.updates} updates", flush=True)
        for i in range(args.updates):
            pub.send(b"Rhubarb %d" % i)
        pub.send(b"END")
        for t in subs:
            t.join()
    lost = args.subscribers * args.updates - sum(counts.values())
    print(f"Publisher: done, {lost} updates lost")


if __name__ == "__main__":
    main()
