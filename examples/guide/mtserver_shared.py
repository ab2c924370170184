"""A multithreaded server on ONE shared REP socket (no device, no contexts).

Eight threads call the classic ``recv()`` then ``send()`` on the same REP
socket. nanopy keeps the pending request per thread, so each ``send()`` answers
the request *that thread* received -- with zmq you would need a socket per
thread, with NNG a context per thread.

    python examples/guide/mtserver_shared.py [--threads N] [--clients N]
"""

from __future__ import annotations

import argparse
import threading

import nanopy


def serve(rep: nanopy.Socket, name: bytes) -> None:
    while True:
        try:
            request = rep.recv()
            rep.send(b"World" + request[len(b"Hello"):] + b" from " + name)
        except nanopy.Closed:
            return


def client(url: str, n: int, matched: list[bool]) -> None:
    with nanopy.Socket("req", connect=url, recv_timeout=10.0) as req:
        for i in range(10):
            req.send(b"Hello %d.%d" % (n, i))
            reply = req.recv()
            matched.append(reply.startswith(b"World %d.%d from " % (n, i)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()

    rep = nanopy.Socket("rep", bind="tcp://127.0.0.1:0")
    servers = [threading.Thread(target=serve, args=(rep, b"thread %d" % i)) for i in range(args.threads)]
    for t in servers:
        t.start()
    matched: list[bool] = []
    clients = [threading.Thread(target=client, args=(rep.endpoints[0].url, n, matched)) for n in range(args.clients)]
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    print(f"{args.threads} threads on one REP socket: {sum(matched)} of {len(matched)} replies matched")
    rep.close()  # wakes every blocked recv() with Closed
    for t in servers:
        t.join()


if __name__ == "__main__":
    main()
