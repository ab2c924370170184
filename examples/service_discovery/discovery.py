"""The discovery service: surveys announcers and answers "where is NAME?" questions.

    python discovery.py [--bind tcp://127.0.0.1:5600] [--resolver tcp://127.0.0.1:5601]
    python discovery.py --beacon [--beacon-port 5606] [--beacon-to 127.255.255.255]

Two sockets: a SURVEYOR (inside nanopy.discovery.Discovery) that services connect
to, and a REP "resolver" that clients ask. Resolver requests (UTF-8 text):

    resolve NAME   ->  one live address of NAME (empty reply: none is live)
    services       ->  JSON {name: [address, ...]}

With ``--beacon`` services need no address: it beacons every interval (by UDP
broadcast on the host's interfaces, or to ``--beacon-to`` hosts; run_demo.py keeps
it on loopback with 127.255.255.255).

Prints ``ready <survey-url> <resolver-url>`` once listening, then one line per
change: ``+ NAME ADDRESS`` / ``- NAME ADDRESS``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys

import nanopy
from nanopy.discovery import DEFAULT_BEACON_PORT, Discovery


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bind", default="tcp://127.0.0.1:0", help="survey address (port 0: any)")
    ap.add_argument("--resolver", default="tcp://127.0.0.1:0", help="resolver address (port 0: any)")
    ap.add_argument("--interval", type=float, default=0.25)
    ap.add_argument("--misses", type=int, default=2)
    ap.add_argument("--beacon", action="store_true", help="announce this discovery service by UDP beacons")
    ap.add_argument("--beacon-port", type=int, default=DEFAULT_BEACON_PORT)
    ap.add_argument("--beacon-to", action="append", help="beacon to this host, not the interfaces (repeatable)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    def on_change(name: str, address: str, added: bool) -> None:
        print(f"{'+' if added else '-'} {name} {address}", flush=True)

    with Discovery(args.bind, interval=args.interval, misses=args.misses, beacon=args.beacon,
                   beacon_port=args.beacon_port, beacon_to=args.beacon_to) as disco, \
            nanopy.Socket("rep", bind=args.resolver) as resolver:
        disco.on_change(on_change)
        print(f"ready {disco.url} {resolver.endpoints[0].url}", flush=True)
        while True:
            msg = resolver.recv_msg()
            verb, _, name = msg.body.decode().partition(" ")
            if verb == "resolve":
                try:
                    reply = disco.resolve(name).encode()
                except LookupError:
                    reply = b""
            elif verb == "services":
                reply = json.dumps(disco.services()).encode()
            else:
                reply = b"error: unknown request"
            msg.reply(reply)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
