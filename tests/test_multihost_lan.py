"""The multi-host tier's own helpers: hosts reach each other over the bridge, a cut is silent, a heal restores."""

from __future__ import annotations

import netns
import pytest

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(60)]

_reason = netns.skip_reason()
if _reason:
    pytestmark.append(pytest.mark.skip(reason=_reason))

# A REP that answers every request with its own host name.
SERVER = """
import sys, nanopy
rep = nanopy.Socket("rep")
rep.bind(f"tcp://{sys.argv[1]}:5555")
print("bound", flush=True)
while True:
    rep.send(rep.recv() + b"@" + sys.argv[2].encode())
"""

# A REQ that sends one request per line of stdin and prints the answer or "timeout".
CLIENT = """
import sys, nanopy
req = nanopy.Socket("req")
req.connect(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    try:
        print("answer", req.request(line.strip().encode(), timeout=float(sys.argv[2])).decode(), flush=True)
    except nanopy.Timeout:
        print("timeout", flush=True)
"""


def test_hosts_talk_over_the_bridge_and_a_cut_is_silent() -> None:
    with netns.lan("client", "server") as net:
        client, server = net.hosts["client"], net.hosts["server"]
        server.python(SERVER, server.addr, "server").expect("bound")
        proc = client.python(CLIENT, f"tcp://{server.addr}:5555", "1.0")
        proc.expect("ready")
        proc.send("one")
        assert proc.expect(r"^answer|^timeout").group(0) == "answer"
        net.cut(server)
        proc.send("two")
        proc.expect("^timeout", timeout=5)  # no RST: the request just goes unanswered
        net.heal(server)
        for attempt in range(10):
            proc.send(f"three{attempt}")
            if proc.expect(r"^answer|^timeout", timeout=10).group(0) == "answer":
                break
        else:
            pytest.fail("no answer after the heal")


def test_lan_leaves_no_namespace_behind() -> None:
    import subprocess

    with netns.lan("a", "b") as net:
        names = [h.netns for h in net.hosts.values()] + [net.switch]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in names)
