"""A multithreaded server behind a device (the Guide's mtserver, ROUTER/DEALER style).

Clients talk REQ to a raw REP socket on tcp (the Guide's ROUTER); a raw REQ
socket on inproc (its DEALER) load-balances the requests to worker threads,
each with its own cooked REP socket. ``nanopy.device`` forwards both ways and
routes every reply back to its client through the backtrace in the header.

    python examples/guide/mtserver.py [--workers N] [--clients N]
"""

from __future__ import annotations

import argparse
import threading
import time

import nanopy
from nanopy.testing import inproc_url


def worker(rep: nanopy.Socket) -> None:
    """Serve until the socket is closed (from any thread: no context to terminate)."""
    while True:
        try:
            request = rep.recv()
            time.sleep(0.01)  # the "work"
            rep.send(b"World" + request[len(b"Hello"):])
        except nanopy.Closed:
            return


def client(url: str, n: int, replies: list[bool]) -> None:
    with nanopy.Socket("req", connect=url, recv_timeout=10.0) as req:
        for i in range(3):
            req.send(b"Hello %d.%d" % (n, i))
            replies.append(req.recv() == b"World %d.%d" % (n, i))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=5)
    parser.add_argument("--clients", type=int, default=10)
    args = parser.parse_args()

    front = nanopy.Socket("rep", raw=True, bind="tcp://127.0.0.1:0")
    back = nanopy.Socket("req", raw=True, bind=inproc_url("workers"))
    reps = [nanopy.Socket("rep", connect=back.endpoints[0].url) for _ in range(args.workers)]
    workers = [threading.Thread(target=worker, args=(rep,)) for rep in reps]
    for t in workers:
        t.start()
    device = threading.Thread(target=nanopy.device, args=(front, back))
    device.start()

    replies: list[bool] = []
    clients = [
        threading.Thread(target=client, args=(front.endpoints[0].url, n, replies)) for n in range(args.clients)
    ]
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    print(f"{len(replies)} replies through the device, {sum(replies)} matched their requests")

    front.close()  # ends the device
    back.close()
    device.join()
    for rep in reps:
        rep.close()  # a worker blocked in recv() gets Closed and returns
    for t in workers:
        t.join()
    print(f"device and {len(workers)} workers stopped")


if __name__ == "__main__":
    main()
