"""``nanopy cat`` against nanocat and nngcat, byte for byte.

Every interop scenario is run twice with the same peer tool: once with ``nanocat``
in the role under test (the baseline) and once with ``nanopy cat``. The stdout (and
exit status) of each side must be identical. The runs of one test execute in
parallel threads to keep the file fast.

Topology per pattern (the server binds a free port, the client connects once the
server listens): PUSH binds / PULL connects; REP binds / REQ connects; RESPONDENT
binds / SURVEYOR connects; PUB binds / SUB connects when nanopy publishes, SUB
binds / PUB connects when nanopy subscribes. The side that does not end by itself
is killed once the other ended: every side flushes its output before it replies,
so its stdout is complete by then.

No run depends on a fixed delay outlasting a slow start. Where a message could be
lost because the receiver is not connected yet (PUB, SURVEYOR, BUS, PAIR), the
sender repeats it every second and the run ends when the receiving side has printed
its first record (readiness), which is what both tools' outputs are compared on.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from peers import free_tcp_port, need_tool, read_exactly, read_until_eof, run_tool, wait_exit

import nanopy
from nanopy._cli import cat as catmod
from nanopy._cli.formats import FORMATTERS, fmt_msgpack
from nanopy._cli.options import UsageError
from nanopy.testing import wait_pipes

NANOPY_CAT = [sys.executable, "-m", "nanopy", "cat"]
FORMATS = ("no", "raw", "ascii", "quoted", "msgpack", "hex")
# Bytes that exercise every escape rule: quotes, backslash, CR/LF/TAB, NUL, DEL, high bytes.
PAYLOAD = b'topic/a "hi" \\ \n\r\t\x00\x01\x1f\x7f\x80\xc3\xa9\xff ~end'
REPLY = b're"ply\\ \t\n\xc3\xa9\xfe!'  # a command-line argument: no NUL possible


# -- running tools ---------------------------------------------------------------------------------


def cmd(tool: str, proto: str, *args: str | bytes) -> list[str | bytes]:
    """A command line for ``tool`` (nanocat, nngcat or nanopy) with a socket type."""
    if tool == "nanopy":
        return [*NANOPY_CAT, f"--{proto}", *args]
    if tool == "nngcat":
        return [need_tool("nngcat"), f"--{proto}0", *args]
    return [need_tool(tool), f"--{proto}", *args]


def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """Block until something accepts TCP connections on ``port`` (the server is up)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            pass
        if proc.poll() is not None:
            pytest.fail(f"{proc.args!r} exited with {proc.returncode}: {proc.stderr.read()!r}")  # type: ignore[union-attr]
        if time.monotonic() > deadline:
            pytest.fail(f"{proc.args!r} is not listening on {port} after {timeout}s")
        time.sleep(0.02)  # polling another process's listen(); nothing to wait on


@dataclass
class Outcome:
    server_out: bytes
    client_out: bytes
    client_rc: int


def _stop(proc: subprocess.Popen[bytes]) -> bytes:
    """Kill ``proc`` if it still runs; return all it wrote to stdout."""
    if proc.poll() is None:
        os.kill(proc.pid, 9)
    proc.wait(timeout=10)
    assert proc.stdout is not None
    return proc.stdout.read()


def pair_run(
    server: Sequence[str | bytes],
    client: Sequence[str | bytes],
    port: int,
    until: str = "client",
    expect: dict[str, int] | None = None,
) -> Outcome:
    """Start ``server``, wait until it listens, start ``client``.

    ``until`` names the side that ends by itself; the other one is killed then.
    With ``expect`` (side -> byte count) the run is readiness-driven instead: the
    sender repeats its message (``-i``) until the receiver is connected, and the
    run ends once each named side printed its first record (that many bytes);
    then both are killed. No fixed delay has to outlast a slow start.
    """
    with run_tool(server) as sp:
        wait_listening(port, sp)
        with run_tool(client) as cp:
            if expect is not None:
                server_out = read_exactly(sp, expect["server"], timeout=30) if "server" in expect else b""
                client_out = read_exactly(cp, expect["client"], timeout=30) if "client" in expect else b""
                _stop(cp)
                _stop(sp)
                return Outcome(server_out, client_out, 0)
            if until == "client":
                client_out = read_until_eof(cp, timeout=30)
                client_rc = wait_exit(cp, 30)
                server_out = _stop(sp)
            else:
                server_out = read_until_eof(sp, timeout=30)
                wait_exit(sp, 30)
                client_out, client_rc = _stop(cp), 0
    return Outcome(server_out, client_out, client_rc)


def first_record(fmt: str, body: bytes) -> int:
    """How many bytes a cat tool prints for one message in format ``fmt``."""
    return len(FORMATTERS[fmt](body))


#: A sender's repeat interval in readiness-driven runs (see pair_run's ``expect``).
REPEAT = ("-i", "1")  # nngcat takes whole seconds


def run_all(jobs: dict[tuple[str, ...], tuple]) -> dict[tuple[str, ...], Outcome]:
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {key: pool.submit(pair_run, *job) for key, job in jobs.items()}
        return {key: f.result() for key, f in futures.items()}


@pytest.fixture(scope="module")
def payload_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("cli") / "payload.bin"
    path.write_bytes(PAYLOAD)
    return str(path)


def url(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


# -- interop: the same scenario with nanocat and with nanopy cat ----------------------------------------

PEERS = ("nanocat", "nngcat")
SUBJECTS = ("nanocat", "nanopy")


def _compare(results: dict[str, Outcome], key: str, side: str) -> None:
    base, ours = results[("nanocat",) + key], results[("nanopy",) + key]  # type: ignore[operator]
    if side == "client":
        assert (ours.client_out, ours.client_rc) == (base.client_out, base.client_rc), key
    else:
        assert ours.server_out == base.server_out, key


@pytest.mark.interop
@pytest.mark.parametrize("peer", PEERS)
def test_push_pull(peer: str, payload_file: str) -> None:
    jobs = {}
    for subject in SUBJECTS:
        for fmt in FORMATS:  # the subject pulls and prints
            p = free_tcp_port()
            jobs[(subject, "pull", fmt)] = (
                cmd(peer, "push", "--bind", url(p), "-F", payload_file, "-i", "30"),
                cmd(subject, "pull", "--connect", url(p), "--recv-timeout", "2", "--format", fmt),
                p,
            )
        for fmt in ("msgpack", "quoted"):  # the subject pushes, the peer prints
            p = free_tcp_port()
            jobs[(subject, "push", fmt)] = (
                cmd(subject, "push", "--bind", url(p), "-F", payload_file, "-i", "30"),
                cmd(peer, "pull", "--connect", url(p), "--recv-timeout", "2", "--format", fmt),
                p,
            )
    results = run_all(jobs)
    for fmt in FORMATS:
        _compare(results, ("pull", fmt), "client")
    for fmt in ("msgpack", "quoted"):
        _compare(results, ("push", fmt), "client")
    # Not vacuous: the message really went through.
    assert results[("nanopy", "pull", "raw")].client_out == PAYLOAD
    assert results[("nanopy", "pull", "no")].client_out == b""


@pytest.mark.interop
@pytest.mark.parametrize("peer", PEERS)
def test_req_rep(peer: str, payload_file: str) -> None:
    jobs = {}
    for subject in SUBJECTS:
        for fmt in FORMATS:
            p = free_tcp_port()  # the subject answers
            jobs[(subject, "rep", fmt)] = (
                cmd(subject, "rep", "--bind", url(p), "-D", REPLY, "--format", fmt),
                cmd(peer, "req", "--connect", url(p), "-F", payload_file, "--format", fmt),
                p,
            )
            p = free_tcp_port()  # the subject asks
            jobs[(subject, "req", fmt)] = (
                cmd(peer, "rep", "--bind", url(p), "-D", REPLY, "--format", fmt),
                cmd(subject, "req", "--connect", url(p), "-F", payload_file, "--format", fmt),
                p,
            )
    results = run_all(jobs)
    for fmt in FORMATS:
        _compare(results, ("rep", fmt), "server")  # what the subject printed
        _compare(results, ("rep", fmt), "client")  # what the peer got back
        _compare(results, ("req", fmt), "client")
        _compare(results, ("req", fmt), "server")
    assert results[("nanopy", "req", "raw")].client_out == REPLY
    assert results[("nanopy", "rep", "msgpack")].server_out == fmt_msgpack(PAYLOAD)


@pytest.mark.interop
@pytest.mark.parametrize("peer", PEERS)
def test_pub_sub(peer: str, payload_file: str) -> None:
    jobs = {}
    sub_cases = [(fmt, ["--subscribe", "topic/"]) for fmt in FORMATS]
    sub_cases.append(("quoted-two", ["--subscribe", "other", "--subscribe", "topic/a"]))
    sub_cases.append(("quoted-miss", ["--subscribe", "topic/b"]))
    for subject in SUBJECTS:
        for case, subs in sub_cases:  # the subject subscribes and prints
            fmt = case.partition("-")[0]
            p = free_tcp_port()
            subscriber = cmd(subject, "sub", "--bind", url(p), *subs, "--recv-timeout", "3", "--format", fmt)
            if case == "quoted-miss":  # nothing may arrive: the subscriber times out and exits
                jobs[(subject, "sub", case)] = (
                    subscriber, cmd(peer, "pub", "--connect", url(p), "-F", payload_file, *REPEAT), p, "server",
                )
                continue
            jobs[(subject, "sub", case)] = (  # the publisher repeats until the subscriber has it
                subscriber,
                cmd(peer, "pub", "--connect", url(p), "-F", payload_file, *REPEAT),
                p,
                "server",
                {"server": first_record(fmt, PAYLOAD)},
            )
        for fmt in ("msgpack", "quoted"):  # the subject publishes
            p = free_tcp_port()
            jobs[(subject, "pub", fmt)] = (  # repeats until the subscriber has it
                cmd(subject, "pub", "--bind", url(p), "-F", payload_file, *REPEAT),
                cmd(peer, "sub", "--connect", url(p), "--subscribe", "topic/a", "--recv-timeout", "3",
                    "--format", fmt),
                p,
                "client",
                {"client": first_record(fmt, PAYLOAD)},
            )
    results = run_all(jobs)
    for case, _ in sub_cases:
        _compare(results, ("sub", case), "server")
    for fmt in ("msgpack", "quoted"):
        _compare(results, ("pub", fmt), "client")
    assert results[("nanopy", "sub", "raw")].server_out == PAYLOAD
    assert results[("nanopy", "sub", "quoted-two")].server_out != b""
    assert results[("nanopy", "sub", "quoted-miss")].server_out == b""


@pytest.mark.interop
@pytest.mark.parametrize("peer", PEERS)
def test_surveyor_respondent(peer: str, payload_file: str) -> None:
    jobs = {}
    for subject in SUBJECTS:
        for fmt in FORMATS:
            p = free_tcp_port()  # the subject answers surveys
            # Surveys repeat until one is answered; each side's first record is compared.
            expect = {"server": first_record(fmt, PAYLOAD), "client": first_record(fmt, REPLY)}
            jobs[(subject, "respondent", fmt)] = (
                cmd(subject, "respondent", "--bind", url(p), "-D", REPLY, "--format", fmt),
                cmd(peer, "surveyor", "--connect", url(p), "-F", payload_file, *REPEAT, "--format", fmt),
                p,
                "client",
                expect,
            )
            p = free_tcp_port()  # the subject surveys
            jobs[(subject, "surveyor", fmt)] = (
                cmd(peer, "respondent", "--bind", url(p), "-D", REPLY, "--format", fmt),
                cmd(subject, "surveyor", "--connect", url(p), "-F", payload_file, *REPEAT, "--format", fmt),
                p,
                "client",
                expect,
            )
    results = run_all(jobs)
    for fmt in FORMATS:
        for role in ("respondent", "surveyor"):
            _compare(results, (role, fmt), "server")
            _compare(results, (role, fmt), "client")
    assert results[("nanopy", "surveyor", "raw")].client_out == REPLY
    assert results[("nanopy", "respondent", "raw")].server_out == PAYLOAD


@pytest.mark.interop
def test_ws_url_with_nanocat() -> None:
    """``ws://`` works: nanopy cat pushes over WebSocket to nanocat."""
    p = free_tcp_port()
    ws = f"ws://127.0.0.1:{p}"  # nanomsg refuses a path when binding
    with run_tool([need_tool("nanocat"), "--pull", "--bind", ws, "--recv-timeout", "1", "-Q"]) as sink:
        wait_listening(p, sink)
        with run_tool([*NANOPY_CAT, "--push", "--connect", ws, "-D", "over ws"]) as src:
            assert wait_exit(src, 30) == 0
        assert read_until_eof(sink, 30) == b'"over ws"\n'


@pytest.mark.interop
@pytest.mark.parametrize("argv", [
    [],
    ["--pull"],
    ["--bind", "tcp://127.0.0.1:1"],
    ["--pu", "-l", "1"],
    ["--push", "-l", "1"],
    ["--req", "-l", "1"],
    ["--pull", "--push", "-l", "1"],
    ["--pull", "-l", "1", "-D", "x"],
    ["--push", "-l", "1", "-D", "x", "-F", "/dev/null"],
    ["--pull", "-l", "1", "--format=nope"],
    ["--pull", "-l", "1", "--recv-timeout", "abc"],
    ["--pull", "-l", "1", "--send-timeout", "1"],
    ["--pull", "-l", "1", "--subscribe", "x"],
    ["--pull=1", "-l", "1"],
    ["--pull", "-l"],
    ["--pull", "-l", "1", "extra"],
    ["--pull", "-Z"],
    ["--nosuch"],
    ["--push", "-l", "1", "-F", "/nonexistent/file"],
    ["--pull", "-l", "1", "-i", "1"],
    ["--pub", "-l", "1", "-D", "x", "-A"],
])
def test_usage_errors_match_nanocat_exit_codes(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    ours = catmod.main(argv)
    err = capsys.readouterr().err
    theirs = subprocess.run([need_tool("nanocat"), *argv], check=False, capture_output=True, timeout=10).returncode
    assert ours == theirs
    assert err.startswith("nanopy cat: ") and err.endswith("\n")


@pytest.mark.interop
def test_bind_error_exits_3_like_nanocat(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--pull", "--bind", "nosuchscheme://x"]
    assert catmod.main(argv) == 3
    assert "Can't bind" in capsys.readouterr().err
    assert subprocess.run([need_tool("nanocat"), *argv], check=False, capture_output=True, timeout=10).returncode == 3


@pytest.mark.interop
def test_reply_loop_timeout_exits_3_like_nanocat(capsys: pytest.CaptureFixture[str]) -> None:
    # nanocat ends a REP reply loop with "Can't recv: Connection timed out", status 3.
    p = free_tcp_port()
    argv = ["--rep", "--bind", url(p), "-D", "x", "--recv-timeout", "1"]
    assert subprocess.run([need_tool("nanocat"), *argv], check=False, capture_output=True, timeout=10).returncode == 3
    assert catmod.main(["--rep", "--bind", "tcp://127.0.0.1:0", "-D", "x", "--recv-timeout", "0.1"]) == 3
    assert "Can't recv: Connection timed out" in capsys.readouterr().err


# -- in-process behaviour ------------------------------------------------------------------------------------


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert catmod.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--subscribe" in out and "--msgpack" in out and "--connect-local,-l PORT" in out


def test_parser_rules() -> None:
    cfg = catmod.parse(["--sub", "-l5555", "--subs=ab", "--subscribe", "cd", "-AQ", "--recv=1.5", "--", "-X", "/tmp/s"])
    assert cfg.protocol == "sub"
    assert cfg.connects == ["tcp://127.0.0.1:5555"] and cfg.binds == ["ipc:///tmp/s"]
    assert cfg.subscriptions == [b"ab", b"cd"]
    assert cfg.format == "quoted" and cfg.recv_timeout == 1.5
    cfg = catmod.parse(["--req", "--bind", "ws://127.0.0.1:1/x", "-D", "q", "-i", " 0x1p-1", "-d1e-1"])
    assert cfg.interval == 0.5 and cfg.delay == pytest.approx(0.1) and cfg.data == b"q"
    # nanopy's extensions never steal nanocat's abbreviations: --in is --interval.
    cfg = catmod.parse(["--push", "-l", "1", "-D", "x", "--in", "2", "--ins"])
    assert cfg.interval == 2.0 and cfg.insecure
    assert catmod.parse(["--pull", "-l", "1", "--recv-timeout", "inf"]).recv_timeout == 1e9
    with pytest.raises(UsageError, match="needs a number of seconds"):
        catmod.parse(["--pull", "-l", "1", "--recv-timeout", "1_0"])
    with pytest.raises(UsageError, match="ambiguous option --su: could be --sub, --surveyor, --subscribe"):
        catmod.parse(["--su", "-l", "1"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_formatters_against_spec(fmt: str) -> None:
    msgpack = pytest.importorskip("msgpack")
    body = bytes(range(256))
    out = FORMATTERS[fmt](body)
    if fmt == "no":
        assert out == b""
    elif fmt == "raw":
        assert out == body
    elif fmt == "ascii":
        assert out == bytes(b if 32 <= b < 127 else 46 for b in body) + b"\n"
    elif fmt == "hex":
        assert out == b'"' + "".join(f"\\x{b:02x}" for b in body).encode() + b'"\n'
    elif fmt == "quoted":
        assert out.startswith(b'"\\x00') and b"\\n" in out and b'\\"' in out and b"\\\\" in out
        assert out.endswith(b'}~\\x7f' + b"".join(b"\\x%02x" % b for b in range(128, 256)) + b'"\n')
    else:
        for size in (0, 255, 256, 65535, 65536):
            data = b"z" * size
            assert msgpack.unpackb(FORMATTERS[fmt](data)) == data


def test_cat_in_process_pull_and_exit(tmp_path: Path) -> None:
    """The receive loop ends on the receive timeout with status 0 and flushed output."""
    with nanopy.Socket("push", bind="tcp://127.0.0.1:0") as push:
        out = tmp_path / "out"
        proc = subprocess.Popen(
            [*NANOPY_CAT, "--pull", "--connect", push.endpoints[0].url, "--recv-timeout", "0.5", "--hex"],
            stdout=out.open("wb"),
        )
        try:
            wait_pipes(push, 1, 20)
            push.send(b"\x01\x02")
            push.send(b"")
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert out.read_bytes() == b'"\\x01\\x02"\n""\n'


def test_data_from_stdin() -> None:
    with nanopy.Socket("pull", bind="tcp://127.0.0.1:0", recv_timeout=20) as pull:
        proc = subprocess.run(
            [*NANOPY_CAT, "--push", "--connect", pull.endpoints[0].url, "-F", "-"],
            input=b"from\x00stdin", check=False, capture_output=True, timeout=30,
        )
        assert proc.returncode == 0, proc.stderr
        assert pull.recv() == b"from\x00stdin"


def test_nanopy_command_dispatch() -> None:
    from nanopy.__main__ import main

    assert main(["--version"]) == 0
    assert main(["no-such-command"]) == 1
    assert main(["--help"]) == 0
    done = subprocess.run(
        [sys.executable, "-m", "nanopy", "cat", "--help"], check=False, capture_output=True, timeout=30
    )
    assert done.returncode == 0 and done.stdout.startswith(b"Usage: nanopy cat")


@pytest.mark.interop
def test_pair_and_bus(payload_file: str) -> None:
    """PAIR/BUS without data only print (nanocat's recv loop); with data they send."""
    jobs = {}
    for proto in ("pair", "bus"):
        for subject in SUBJECTS:
            for fmt in ("quoted", "msgpack"):
                p = free_tcp_port()
                # The sender repeats until the printing side has its first record.
                expect = {"server": first_record(fmt, PAYLOAD)}
                jobs[(subject, proto, "recv", fmt)] = (
                    cmd(subject, proto, "--bind", url(p), "--format", fmt),
                    cmd("nanocat", proto, "--connect", url(p), "-F", payload_file, *REPEAT),
                    p,
                    "client",
                    expect,
                )
                p = free_tcp_port()
                jobs[(subject, proto, "send", fmt)] = (
                    cmd("nanocat", proto, "--bind", url(p), "--format", fmt),
                    cmd(subject, proto, "--connect", url(p), "-F", payload_file, *REPEAT),
                    p,
                    "client",
                    expect,
                )
    results = run_all(jobs)
    for proto in ("pair", "bus"):
        for fmt in ("quoted", "msgpack"):
            _compare(results, (proto, "recv", fmt), "server")
            _compare(results, (proto, "send", fmt), "server")
        assert results[("nanopy", proto, "recv", "msgpack")].server_out == fmt_msgpack(PAYLOAD)
        assert results[("nanopy", proto, "send", "msgpack")].server_out == fmt_msgpack(PAYLOAD)


def test_req_interval_repeats_requests() -> None:
    """REQ with --interval: a new request every interval, replies printed in between."""
    with nanopy.Socket("rep", bind="tcp://127.0.0.1:0") as rep:
        proc = subprocess.Popen(
            [*NANOPY_CAT, "--req", "--connect", rep.endpoints[0].url, "-D", "q", "-i", "0.2", "-A"],
            stdout=subprocess.PIPE,
        )
        try:
            for n in range(3):
                msg = rep.recv_msg(timeout=20)
                assert msg.body == b"q"
                msg.reply(b"a%d" % n)
            assert proc.stdout is not None
            assert proc.stdout.read(9) == b"a0\na1\na2\n"
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, 9)
            proc.wait(timeout=10)


def test_tls_with_verbose_bind_address(tmp_path: Path) -> None:
    """tls+tcp with nngcat-style TLS flags; -v reports the port a port-0 bind got."""
    from tls_certs import tls_files

    tls = tls_files()
    server_pem, ca_pem = tmp_path / "server.pem", tmp_path / "ca.pem"
    server_pem.write_text(tls.server_pem)
    ca_pem.write_text(tls.ca_pem)
    proc = subprocess.Popen(
        [*NANOPY_CAT, "--pull", "--bind", "tls+tcp://127.0.0.1:0", "--cert", str(server_pem), "-v",
         "--recv-timeout", "3", "-Q"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None and proc.stdout is not None
        line = proc.stderr.readline().decode()
        assert line.startswith("Listening at: tls+tcp://127.0.0.1:"), line
        bound = line.split(": ", 1)[1].strip()
        with nanopy.Socket("push") as push:
            push.connect(bound, ssl_context=tls.client_ctx)
            push.send(b"secret\n")
            assert proc.stdout.readline() == b'"secret\\n"\n'
        with nanopy.Socket("pull", recv_timeout=20) as pull:
            ep = pull.bind("tls+tcp://127.0.0.1:0", ssl_context=tls.server_ctx)
            sent = subprocess.run(
                [*NANOPY_CAT, "--push", "--connect", ep.url, "--cacert", str(ca_pem), "-D", "over tls"],
                check=False, capture_output=True, timeout=30,
            )
            assert sent.returncode == 0, sent.stderr
            assert pull.recv() == b"over tls"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, 9)
        proc.wait(timeout=10)


# -- issue 22 (6): no peer ever connected -----------------------------------------------------


def test_send_timeout_with_no_peer_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    target = f"tcp://127.0.0.1:{free_tcp_port()}"  # nobody listens there
    assert catmod.main(["--push", "--connect", target, "--data", "x", "--send-timeout", "0.2"]) == 3
    err = capsys.readouterr().err
    assert f"Can't send: Connection timed out: no peer connected: check that a peer is running at {target}" in err


def test_waiting_with_no_peer_prints_a_hint() -> None:
    target = f"tcp://127.0.0.1:{free_tcp_port()}"
    proc = subprocess.Popen([*NANOPY_CAT, "--push", "--connect", target, "--data", "x"], stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        line = b""
        deadline = time.monotonic() + 30
        while not line.endswith(b"\n") and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stderr], [], [], deadline - time.monotonic())
            if not ready:
                break
            chunk = os.read(proc.stderr.fileno(), 4096)
            if not chunk:
                break
            line += chunk
        assert line.startswith(b"nanopy cat: no peer connected after "), line
        assert f"check that a peer is running at {target}".encode() in line
        assert proc.poll() is None  # a hint, not an error: it goes on waiting
    finally:
        proc.kill()
        proc.wait(10)
