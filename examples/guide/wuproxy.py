"""A pub-sub proxy bridging two networks (the Guide's weather proxy).

A raw SUB on the "internal" side (tcp) and a raw PUB on the "external" side
(ipc) joined by ``nanopy.device``: the proxy forwards every update, and each
subscriber behind it still filters for itself.

    python examples/guide/wuproxy.py
"""

from __future__ import annotations

import threading

import nanopy
from nanopy.testing import ipc_url


def publish(pub: nanopy.Socket, stop: threading.Event) -> None:
    n = 0
    while not stop.wait(0.0005):
        pub.send(b"%05d %d" % (10000 + n % 3, n))
        n += 1


def main() -> None:
    with nanopy.Socket("pub", bind="tcp://127.0.0.1:0") as server:
        frontend = nanopy.Socket("sub", raw=True, connect=server.endpoints[0].url)
        backend = nanopy.Socket("pub", raw=True, bind=ipc_url("wuproxy"))
        proxy = threading.Thread(target=nanopy.device, args=(frontend, backend))
        proxy.start()
        stop = threading.Event()
        publisher = threading.Thread(target=publish, args=(server, stop))
        publisher.start()
        with nanopy.Socket("sub", connect=backend.endpoints[0].url, recv_timeout=10.0) as client:
            client.subscribe(b"10002 ")
            updates = [client.recv() for _ in range(10)]
        stop.set()
        publisher.join()
        frontend.close()
        backend.close()
        proxy.join()
    ok = all(u.startswith(b"10002 ") for u in updates)
    print(f"Through the proxy (tcp -> ipc): {len(updates)} updates for zipcode 10002, all matching: {ok}")


if __name__ == "__main__":
    main()
