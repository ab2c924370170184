"""What ZAP (``bind(url, zap_domain=...)`` with ``nanopy.ZapAuthenticator``) adds per
admitted connection: sequential connections from one REQ to a REP in this process,
one round trip each, CPU (``time.process_time``, client and server together) per
connection, with no gate, with ``authorize=`` returning True, and with ZAP.

    .venv/bin/python benchmarks/zap_cost.py [connections] [rounds]
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import nanopy

VARIANTS: dict[str, dict[str, Any]] = {
    "no gate": {},
    "authorize=True": {"authorize": lambda peer: True},
    "zap_domain (ZapAuthenticator)": {"zap_domain": "global"},
}


def run(scheme: str, gate: dict[str, Any], n: int) -> float:
    """CPU seconds per admitted connection."""
    with nanopy.Socket("rep", recv_timeout=10) as rep, nanopy.Socket(
        "req", recv_timeout=10, reconnect_interval=0.001
    ) as req:
        url = rep.bind(f"{scheme}://127.0.0.1:0", **gate).url
        cpu = time.process_time()
        for i in range(n):
            ep = req.connect(url)
            req.send(b"%d" % i)
            msg = rep.recv_msg()
            msg.reply(b"ok")
            assert req.recv() == b"ok"
            ep.close()
        return (time.process_time() - cpu) / n


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    with nanopy.ZapAuthenticator():
        for scheme in ("tcp", "zmtp+tcp"):
            results: dict[str, list[float]] = {name: [] for name in VARIANTS}
            for _ in range(rounds):  # alternating, so that a busy machine hits them alike
                for name, gate in VARIANTS.items():
                    results[name].append(run(scheme, gate, n))
            base = statistics.median(results["no gate"])
            for name, values in results.items():
                med = statistics.median(values)
                print(f"{scheme:9} {name:32} {med * 1e3:6.2f} ms CPU/connection  (+{(med - base) * 1e3:5.2f} ms)")


if __name__ == "__main__":
    main()
