"""Every program in examples/guide/ runs on its own, exits by itself and prints what it should."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parent.parent / "examples" / "guide"

# program -> patterns its output must contain (each a regular expression)
EXPECTED: dict[str, list[str]] = {
    "weather.py": [r"Average temperature for zipcode '10001' was -?\d+\.\dF over 50 updates"],
    "tasks.py": [
        r"Ventilator: sent 100 tasks",
        r"Sink: 100 results",
        r"Workers stopped: 3, tasks handled: 100 ",
    ],
    "mspoller.py": [r"Poller: 20 tasks and 20 weather updates"],
    "interrupt.py": [
        r"Client: got World 2",
        r"Server: interrupt received, shutting down",
        r"Server: closed cleanly",
    ],
    "mtserver.py": [r"30 replies through the device, 30 matched", r"device and 5 workers stopped"],
    "mtserver_shared.py": [r"8 threads on one REP socket: 80 of 80 replies matched"],
    "mtrelay.py": [r"Step 1 ready.*\n.*Step 2 ready.*\n.*Test successful!"],
    "syncpub.py": [
        r"Subscriber 0: received 20000 updates",
        r"Subscriber 1: received 20000 updates",
        r"Subscriber 2: received 20000 updates",
        r"Publisher: done, 0 updates lost",
    ],
    "envelopes.py": [r"(\[B\] We would like to see this\n){5}"],
    "hwm.py": [
        r"PUSH: \d+ messages queued .*then send blocked",
        r"PUB/SUB drop: 1000 sent, \d+ kept, \d+ dropped \(all accounted for: True\); the newest survive: True",
        r"PUB/SUB block: \d+ sent before Timeout .* none lost: True",
    ],
    "shutdown.py": [
        r"linger: sent 1000, closed at once, received 1000 in order: True",
        r"close\(\): 3 blocked workers woke with Closed",
    ],
    "wuproxy.py": [r"10 updates for zipcode 10002, all matching: True"],
}


def run_example(name: str, *args: str, timeout: float = 45) -> str:
    """Run an example; one that hangs is stopped with SIGABRT, so that faulthandler
    prints where every thread of it was waiting into the failure message."""
    proc = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", str(GUIDE / name), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"{name} hung for {timeout} s; its threads:\n{out}\n{err}")
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{out}\n{err}"
    return out


def test_every_example_is_checked() -> None:
    assert sorted(p.name for p in GUIDE.glob("*.py")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs_and_prints(name: str) -> None:
    out = run_example(name)
    for pattern in EXPECTED[name]:
        assert re.search(pattern, out), f"{name}: {pattern!r} not in output:\n{out}"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_example_stops_on_a_real_signal(sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(GUIDE / "interrupt.py"), "--wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("Server: ready on tcp://127.0.0.1:")
        os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "interrupt received" in out and "closed cleanly" in out


def test_weather_roles_in_separate_processes() -> None:
    from nanopy.testing import ipc_url

    url = ipc_url("weather")
    server = subprocess.Popen(
        [sys.executable, str(GUIDE / "weather.py"), "server", url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        out = run_example("weather.py", "client", url, "10003")
        assert "zipcode '10003'" in out
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
