"""A nanopy listener in its own process, so a test can sample its RSS alone.

Usage: ``python hostile_listener.py PROTOCOL URL RECV_MAX_SIZE``. Prints the bound
URL, then answers each line on stdin: ``stats`` -> ``protocol_errors pipes``,
``quit`` -> exits. A PUB or PUSH listener publishes 1 KiB messages without pause,
so a peer that never reads keeps its writer blocked.
"""

from __future__ import annotations

import sys
import threading

import nanopy


def publish(sock: nanopy.Socket, stop: threading.Event) -> None:
    body = b"x" * 1024
    while not stop.is_set():
        try:
            sock.send(body, timeout=0.05)
        except (nanopy.Timeout, nanopy.Closed):
            pass


def main() -> None:
    protocol, url, recv_max_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sock = nanopy.Socket(protocol, recv_max_size=recv_max_size, handshake_timeout=2.0)
    ep = sock.bind(url)
    stop = threading.Event()
    if protocol in ("pub", "push"):
        threading.Thread(target=publish, args=(sock, stop), daemon=True).start()
    print(ep.url, flush=True)
    for line in sys.stdin:
        if line.strip() == "stats":
            st = sock.stats()
            print(st.protocol_errors, st.pipes, flush=True)
        elif line.strip() == "trim":  # hand freed heap back to the kernel (glibc)
            import ctypes

            ctypes.CDLL("libc.so.6").malloc_trim(0)
            print("ok", flush=True)
        else:
            break
    stop.set()
    sock.close(linger=0)


if __name__ == "__main__":
    main()
