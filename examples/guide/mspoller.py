"""Reading from several sockets at once with nanopy.Poller (the Guide's mspoller).

One process is both a task worker (PULL) and a weather subscriber (SUB). A
poller waits on both and sleeps while neither has anything: no busy loop, no
thread per socket.

    python examples/guide/mspoller.py
"""

from __future__ import annotations

import threading

import nanopy
from nanopy.testing import ipc_url

WANTED = 20


def feed(push: nanopy.Socket, pub: nanopy.Socket, stop: threading.Event) -> None:
    """Send tasks and weather updates until told to stop."""
    n = 0
    while not stop.is_set():
        if nanopy.poll([(push, nanopy.POLLOUT)], timeout=0.1):  # the worker keeps up
            push.send(b"task %d" % n, timeout=0)
        pub.send(b"10001 %d 40" % (n % 90))
        n += 1
        stop.wait(0.001)


def main() -> None:
    with nanopy.Socket("push", bind="tcp://127.0.0.1:0") as push, nanopy.Socket(
        "pub", bind=ipc_url("mspoller")
    ) as pub, nanopy.Socket("pull", connect=push.endpoints[0].url) as receiver, nanopy.Socket(
        "sub", connect=pub.endpoints[0].url
    ) as subscriber:
        subscriber.subscribe(b"10001 ")
        stop = threading.Event()
        feeder = threading.Thread(target=feed, args=(push, pub, stop))
        feeder.start()
        poller = nanopy.Poller()
        poller.register(receiver, nanopy.POLLIN)
        poller.register(subscriber, nanopy.POLLIN)
        tasks = updates = 0
        try:
            while tasks < WANTED or updates < WANTED:
                for sock, _flags in poller.poll(timeout=10.0):
                    sock.recv(timeout=0)
                    if sock is receiver:
                        tasks += 1
                        done = tasks == WANTED
                    else:
                        updates += 1
                        done = updates == WANTED
                    if done:  # this socket has given enough: stop watching it
                        poller.unregister(sock)
        finally:
            stop.set()
            feeder.join()
        print(f"Poller: {tasks} tasks and {updates} weather updates, from 2 sockets, one thread")


if __name__ == "__main__":
    main()
