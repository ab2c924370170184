"""A service: a REP server that announces itself to the discovery service.

    python service.py NAME --discovery tcp://127.0.0.1:5600
    python service.py NAME --beacon [--beacon-port 5606] [--beacon-bind 127.255.255.255]

NAME picks what it does with a request: ``echo`` returns it, ``upper`` upper-cases
it, ``answer`` replies "The answer is 42". It binds a free port and announces the
address it really got (with ``--beacon`` it finds the discovery service by
its beacons instead of ``--discovery``); every reply is prefixed with its pid so
clients can tell instances apart: ``<pid>:<result>``. Prints ``ready NAME ADDRESS`` when serving.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import nanopy
from nanopy.discovery import DEFAULT_BEACON_PORT, Announcer

HANDLERS = {
    "echo": lambda body: body,
    "upper": lambda body: body.upper(),
    "answer": lambda body: b"The answer is 42",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", choices=sorted(HANDLERS))
    ap.add_argument("--discovery", action="append", default=[], help="the discovery service's survey address")
    ap.add_argument("--bind", default="tcp://127.0.0.1:0")
    ap.add_argument("--beacon", action="store_true", help="find discovery services by their beacons")
    ap.add_argument("--beacon-port", type=int, default=DEFAULT_BEACON_PORT)
    ap.add_argument("--beacon-bind", action="append", help="listen for beacons here (default: all interfaces)")
    args = ap.parse_args()
    if not args.discovery and not args.beacon:
        ap.error("give --discovery URL or --beacon")
    beacon_options = {"beacon": args.beacon, "beacon_port": args.beacon_port}
    if args.beacon_bind:
        beacon_options["beacon_bind"] = args.beacon_bind
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    handler = HANDLERS[args.name]
    prefix = f"{os.getpid()}:".encode()
    with nanopy.Socket("rep", bind=args.bind) as rep:
        address = rep.endpoints[0].url
        with Announcer(args.name, address, args.discovery, metadata={"pid": os.getpid()}, **beacon_options):
            print(f"ready {args.name} {address}", flush=True)
            while True:
                msg = rep.recv_msg()
                msg.reply(prefix + handler(msg.body))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
