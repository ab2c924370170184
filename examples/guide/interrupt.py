"""Shutting down cleanly on Ctrl-C or SIGTERM (the Guide's interrupt handling).

A REP server blocks in ``recv()``. Ctrl-C raises KeyboardInterrupt in the
blocked call at once (the call took nothing); SIGTERM is turned into the same
exception. The server then closes its socket -- queued replies get ``linger``
seconds to leave -- and exits with status 0.

    python examples/guide/interrupt.py          # a client thread signals us when done
    python examples/guide/interrupt.py --wait   # serve until you press Ctrl-C
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import nanopy


def on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # handle SIGTERM exactly like Ctrl-C


def client_then_interrupt(url: str) -> None:
    with nanopy.Socket("req", connect=url, recv_timeout=10.0) as req:
        for n in range(3):
            req.send(b"Hello %d" % n)
            print(f"Client: got {req.recv().decode()}", flush=True)
    os.kill(os.getpid(), signal.SIGINT)  # as if the user pressed Ctrl-C


def main() -> int:
    # Python turns SIGINT into KeyboardInterrupt only if SIGINT was not ignored when it
    # started (a shell's background job starts with it ignored): install it ourselves.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, on_sigterm)
    server = nanopy.Socket("rep", bind="tcp://127.0.0.1:0")
    url = server.endpoints[0].url
    try:  # from here on, an interrupt at any point shuts down cleanly
        if "--wait" in sys.argv:
            print(f"Server: ready on {url}", flush=True)
        else:
            threading.Thread(target=client_then_interrupt, args=(url,), daemon=True).start()
        while True:
            request = server.recv()  # blocks; Ctrl-C interrupts it
            server.send(b"World" + request[len(b"Hello"):])
    except KeyboardInterrupt:
        print("Server: interrupt received, shutting down", flush=True)
    finally:
        server.close()
    print("Server: closed cleanly", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
