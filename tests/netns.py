"""Test hosts in Linux network namespaces, joined by one bridge: the multi-host tier.

A :class:`Lan` is a switch (a namespace holding a bridge) and any number of
:class:`Host` namespaces, each wired to the switch by a veth pair whose host end is
``eth0`` with an address from a documentation range (RFC 5737's 192.0.2.0/24, so
no real network is named). Nothing is created in, or routed through, the root
namespace: the test process itself cannot reach these addresses, so every nanopy
peer runs as a child process inside its host (:meth:`Host.python`) and talks to
the test over stdin/stdout lines.

Faults:

* :meth:`Lan.cut` takes the host's switch port down: the host vanishes with no
  RST/FIN, as a crashed machine or a pulled cable does; :meth:`Lan.heal` brings it back.
* :meth:`Lan.cut_one_way` drops what one host sends another while the other way
  still works (``src`` resolves ``dst`` to a MAC nobody has); :meth:`Lan.heal_one_way`
  undoes it. (This kernel has no tc actions or nftables to drop by rule.)
* :meth:`Host.kill` SIGKILLs every process the test started in that host.
* :meth:`Lan.shape` adds delay/loss with ``tc netem`` where the kernel has
  ``sch_netem``; :func:`netem_available` says whether it does (this CI's kernel has not).

Everything is deleted when the ``Lan`` closes, processes first (by PID).
Requires root and iproute2; :func:`skip_reason` tells why not, for ``pytest.skip``.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

SUBNET = "192.0.2"  # RFC 5737 TEST-NET-1: only ever inside these namespaces
PREFIX_LEN = 24
NOBODY_MAC = "02:00:5e:00:53:01"  # locally administered: no host on the LAN has it
_counter = iter(range(1, 1 << 30))


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def skip_reason() -> str | None:
    """Why namespaces cannot be made here (None when they can)."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    name = f"npprobe{os.getpid()}"
    if _ip("netns", "add", name, check=False).returncode != 0:
        return "this kernel or sandbox refuses `ip netns add`"
    _ip("netns", "del", name, check=False)
    return None


def netem_available() -> bool:
    """True when ``tc qdisc ... netem`` works (the kernel has sch_netem)."""
    if shutil.which("tc") is None:
        return False
    name = f"npnetem{os.getpid()}"
    if _ip("netns", "add", name, check=False).returncode != 0:
        return False
    try:
        probe = subprocess.run(
            ["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
            capture_output=True, timeout=20,
        )
        return probe.returncode == 0
    finally:
        _ip("netns", "del", name, check=False)


class Process:
    """A child process in a host; its stdout is read line by line into a queue."""

    def __init__(self, name: str, popen: subprocess.Popen[str]) -> None:
        self.name = name
        self.popen = popen
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, pattern: str, timeout: float = 10.0) -> re.Match[str]:
        """The first line from now on matching ``pattern`` (regex search); fail after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(left, 0.0))
            except queue.Empty:
                seen = self.seen[-10:]
                raise AssertionError(f"{self.name}: no line matching {pattern!r} in {timeout} s; saw {seen}") from None
            if line is None:
                self.lines.put(None)  # stay at EOF for later calls
                err = self.popen.stderr.read() if self.popen.stderr else ""
                raise AssertionError(f"{self.name} exited ({self.popen.wait()}) before {pattern!r}: {err[-2000:]}")
            self.seen.append(line)
            match = re.search(pattern, line)
            if match:
                return match

    def drain(self) -> list[str]:
        """Every line read so far (those ``expect`` passed over too), without waiting."""
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return self.seen
            if line is None:
                self.lines.put(None)
                return self.seen
            self.seen.append(line)

    def send(self, line: str) -> None:
        """Write one command line to the process's stdin."""
        assert self.popen.stdin is not None
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)


class Host:
    """One namespace on the LAN with address ``addr`` on its ``eth0``."""

    def __init__(self, lan: Lan, name: str, index: int) -> None:
        self.lan = lan
        self.name = name
        self.netns = f"{lan.prefix}{name}"
        self.addr = f"{SUBNET}.{index}"
        self.port = f"p{index}"  # its veth end in the switch namespace
        self.processes: list[Process] = []

    def python(self, code: str, *args: str, env: dict[str, str] | None = None) -> Process:
        """Run ``python -u -c code args...`` inside this host (the test's interpreter and sys.path)."""
        child_env = dict(os.environ)
        child_env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        child_env.update(env or {})
        popen = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, sys.executable, "-u", "-c", code, *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env,
        )
        proc = Process(f"{self.name}:{len(self.processes)}", popen)
        self.processes.append(proc)
        return proc

    def run(self, *argv: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
        """Run a command to completion inside this host."""
        return subprocess.run(["ip", "netns", "exec", self.netns, *argv], capture_output=True, text=True,
                              timeout=timeout)

    def kill(self) -> None:
        """SIGKILL every process started in this host (a crashed host's software)."""
        for proc in self.processes:
            proc.kill()


class Lan:
    """A bridge and its hosts, all in namespaces of their own; use as a context manager."""

    def __init__(self) -> None:
        self.prefix = f"np{os.getpid() % 100000}x{next(_counter)}-"
        self.switch = f"{self.prefix}sw"
        self.hosts: dict[str, Host] = {}
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")

    def add_host(self, name: str, *, broadcast: bool = True) -> Host:
        """A host wired to the switch; ``broadcast=False`` adds its address without a
        broadcast address (``ip addr add`` with no ``brd``), as some systems do."""
        host = Host(self, name, len(self.hosts) + 1)
        self.hosts[name] = host
        _ip("netns", "add", host.netns)
        _ip("-n", host.netns, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", host.port, "type", "veth", "peer", "name", "eth0",
            "netns", host.netns)
        _ip("-n", self.switch, "link", "set", host.port, "master", "br0")
        _ip("-n", self.switch, "link", "set", host.port, "up")
        brd = ["brd", "+"] if broadcast else []
        _ip("-n", host.netns, "addr", "add", f"{host.addr}/{PREFIX_LEN}", *brd, "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        return host

    def cut(self, host: Host) -> None:
        """Take the host's switch port down: its packets vanish both ways, no RST or FIN."""
        _ip("-n", self.switch, "link", "set", host.port, "down")

    def heal(self, host: Host) -> None:
        _ip("-n", self.switch, "link", "set", host.port, "up")

    def cut_one_way(self, src: Host, dst: Host) -> None:
        """Drop every packet ``src`` sends ``dst``, silently; ``dst`` still reaches ``src``."""
        _ip("-n", src.netns, "neigh", "replace", dst.addr, "lladdr", NOBODY_MAC, "dev", "eth0", "nud", "permanent")

    def heal_one_way(self, src: Host, dst: Host) -> None:
        """Undo :meth:`cut_one_way` (``src`` asks for ``dst``'s MAC again)."""
        _ip("-n", src.netns, "neigh", "del", dst.addr, "dev", "eth0", check=False)

    def shape(self, host: Host, *, delay_ms: float = 0.0, loss_pct: float = 0.0) -> None:
        """Delay and/or drop the host's outgoing packets (needs sch_netem; see netem_available)."""
        args = ["tc", "qdisc", "replace", "dev", "eth0", "root", "netem"]
        if delay_ms:
            args += ["delay", f"{delay_ms}ms"]
        if loss_pct:
            args += ["loss", f"{loss_pct}%"]
        done = host.run(*args)
        if done.returncode != 0:
            raise RuntimeError(f"netem is not available here: {done.stderr.strip()}")

    def close(self) -> None:
        for host in self.hosts.values():
            host.kill()
        for host in self.hosts.values():
            _ip("netns", "del", host.netns, check=False)
        _ip("netns", "del", self.switch, check=False)

    def __enter__(self) -> Lan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def lan(*names: str, broadcast: bool = True) -> Iterator[Lan]:
    """A LAN with one host per name (``lan("client", "ny", "ldn")``), deleted afterwards;
    ``broadcast=False``: their addresses have no broadcast address set."""
    with Lan() as net:
        for name in names:
            net.add_host(name, broadcast=broadcast)
        yield net
