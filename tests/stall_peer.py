"""The nanopy side of tests/test_zmtp_stall.py, in a process of its own so that the
test can freeze it (SIGSTOP, SIGCONT by PID) while its libzmq peer runs on.

Usage: ``python stall_peer.py URL DEAD_PEER_TIMEOUT``. A nanopy REP dials URL (a
libzmq DEALER) and answers every request with the request, ``echo:`` in front. Lines on stdin:
``stats`` answers ``stats {json}`` (the socket's stats), ``pings`` answers
``pings N`` (the PINGs our dead-peer watch sent on the pipes up now), ``watching``
answers ``watching ARMED TOTAL`` (of the pipes' dead-peer watches, how many wait on
their timer: a stall before a watch began is none it can see). Log records
(INFO and up) go to stderr.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import threading

import nanopy


def main() -> None:
    url, timeout = sys.argv[1], float(sys.argv[2])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    sock = nanopy.Socket("rep", name="stalled", dead_peer_timeout=timeout,
                         reconnect_interval=0.05, reconnect_interval_max=0.2)
    sock.connect(url)

    def echo() -> None:
        while True:
            try:
                msg = sock.recv_msg()
                msg.reply(b"echo:" + msg.body)
            except nanopy.Closed:
                return

    threading.Thread(target=echo, daemon=True).start()
    print("ready", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "stats":
            print("stats", json.dumps(dataclasses.asdict(sock.stats())), flush=True)
        elif command == "pings":
            drivers = sock._driver.pipe_drivers()  # type: ignore[attr-defined]
            print("pings", sum(d.conn._pings_sent for d in drivers), flush=True)
        elif command == "watching":
            drivers = sock._driver.pipe_drivers()  # type: ignore[attr-defined]
            watches = [d.conn.keepalive.__self__ for d in drivers if getattr(d.conn, "keepalive", None) is not None]
            print("watching", sum(w._due != math.inf for w in watches), len(watches), flush=True)
    sock.close(linger=0)


if __name__ == "__main__":
    main()
