"""The plug-in API: registration rules, validation, and the example distribution.

Tests that depend on installed entry points run in a subprocess, so the entry
points are read fresh (nanopy caches what it loads).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import tcp_plugin, wait_until

import nanopy
import nanopy.protocols
import nanopy.transports
from nanopy.transports import Transport

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "plugins"


def run_python(code: str, *, path: Path | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = f"{path}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT,
    )


# -- in-process registration -------------------------------------------------------------
def test_builtins_cannot_be_replaced_silently() -> None:
    tcp = nanopy.transports.get("tcp")
    with pytest.raises(ValueError, match="built-in"):
        nanopy.transports.register("tcp", tcp)
    with pytest.raises(ValueError, match="built-in"):
        nanopy.protocols.register("pair", nanopy.protocols.get("pair"))


def test_register_validates() -> None:
    tcp = nanopy.transports.get("tcp")
    with pytest.raises(ValueError, match="not a valid URL scheme"):
        nanopy.transports.register("Not A Scheme", tcp)
    with pytest.raises(TypeError, match="Transport"):
        nanopy.transports.register("thing", object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="declares schemes"):
        nanopy.transports.register("tcpx", tcp)  # the object says it serves tcp only
    with pytest.raises(TypeError, match="Core"):
        nanopy.protocols.register("myproto", int)  # type: ignore[arg-type]


def test_register_and_override_in_process(make_socket) -> None:
    tcp = nanopy.transports.get("tcp")

    class Alias(type(tcp)):  # type: ignore[misc]
        """tcp under another scheme: rewrite the URL and delegate."""

        schemes = ("tcpalias",)

        def check_url(self, url: str) -> None:
            super().check_url(url.replace("tcpalias://", "tcp://"))

        def check_dial_url(self, url: str) -> None:
            super().check_dial_url(url.replace("tcpalias://", "tcp://"))

        async def listen(self, url, ctx):
            listener = await super().listen(url.replace("tcpalias://", "tcp://"), ctx)
            listener.url = listener.url.replace("tcp://", "tcpalias://")
            return listener

        async def dial(self, url, ctx):
            return await super().dial(url.replace("tcpalias://", "tcp://"), ctx)

    nanopy.transports.register("tcpalias", Alias)  # a class is instantiated
    try:
        assert "tcpalias" in nanopy.transports.schemes()
        with pytest.raises(ValueError, match="earlier register"):
            nanopy.transports.register("tcpalias", Alias())
        nanopy.transports.register("tcpalias", Alias(), override=True)
        a = make_socket("pair")
        b = make_socket("pair")
        ep = a.bind("tcpalias://127.0.0.1:0")
        assert ep.url.startswith("tcpalias://")
        b.connect(ep.url)
        b.send(b"via alias")
        assert a.recv(timeout=5) == b"via alias"
    finally:
        nanopy.transports.unregister("tcpalias")
    assert "tcpalias" not in nanopy.transports.schemes()
    with pytest.raises(nanopy.AddressError, match="unknown transport"):
        make_socket("pair").bind("tcpalias://127.0.0.1:0")


class _SendOnly(nanopy.transports.Connection):
    """A plug-in connection with nothing but the documented send/receive: it wraps a
    tcp connection and records the batches the engine hands to send()."""

    def __init__(self, inner: nanopy.transports.Connection) -> None:
        self.inner = inner
        self.remote_address = inner.remote_address
        self.batches: list[int] = []

    async def handshake(self) -> None:
        await self.inner.handshake()

    async def send(self, payloads: list[bytes]) -> None:
        self.batches.append(len(payloads))
        await self.inner.send(payloads)

    async def receive(self) -> list[bytes]:
        return await self.inner.receive()

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_send_only_plugin_connection_is_written_by_the_pipe_in_batches(make_socket) -> None:
    """A third-party connection that implements only send()/receive() keeps working:
    the pipe's driver adapts it (every write through its writer task, batched)."""
    with tcp_plugin("sendonly", _SendOnly) as made:
        pull = make_socket("pull", recv_timeout=5)
        push = make_socket("push", send_timeout=5)
        push.connect(pull.bind("sendonly://127.0.0.1:0").url)
        wait_until(lambda: len(push.pipes) == 1 and len(pull.pipes) == 1, what="the pipe")
        driver = push.pipes[0]._driver
        assert not isinstance(driver.channel, nanopy.transports.ChannelConnection)
        n = 2000
        for i in range(n):
            push.send(b"%d" % i)
        assert [pull.recv() for _ in range(n)] == [b"%d" % i for i in range(n)]
        (conn,) = made
        assert sum(conn.batches) == n
        assert len(conn.batches) < n // 4  # batched, not one send per message


# -- entry points (fake distributions on PYTHONPATH) ---------------------------------------
def fake_distribution(tmp_path: Path, entries: str, module: str = "") -> Path:
    dist = tmp_path / "fake_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(entries)
    if module:
        (tmp_path / "fake_plugin.py").write_text(textwrap.dedent(module))
    return tmp_path


def test_broken_plugins_get_clear_errors(tmp_path: Path) -> None:
    path = fake_distribution(
        tmp_path,
        "[nanopy.transports]\nmissing = no_such_module:transport\nnotatransport = fake_plugin:thing\n"
        "tcp = fake_plugin:thing\n"
        "[nanopy.protocols]\nbrokenproto = fake_plugin:thing\n",
        "thing = 42\n",
    )
    result = run_python(
        """
        import logging, nanopy
        logging.basicConfig(level=logging.WARNING, format="LOG %(message)s")
        for url in ("missing://x", "notatransport://x"):
            try:
                nanopy.Socket("pair").bind(url)
            except nanopy.AddressError as exc:
                print("ERR", exc)
        try:
            nanopy.Socket("brokenproto")
        except ValueError as exc:
            print("PROTO", exc)
        s = nanopy.Socket("pair")
        print("TCP", s.bind("tcp://127.0.0.1:0").url.startswith("tcp://"))
        s.close()
        """,
        path=path,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "ERR transport plug-in 'missing' (no_such_module:transport) failed to load" in out
    assert "ERR transport plug-in 'notatransport' is broken" in out and "got 42" in out
    assert "PROTO protocol plug-in 'brokenproto' is broken" in out
    assert "TCP True" in out  # the built-in wins ...
    assert "ignoring transport plug-in 'tcp'" in out  # ... and says so


# -- the example distribution ---------------------------------------------------------------
@pytest.fixture(scope="module")
def installed_example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """pip-install examples/plugins into a throwaway directory (offline, no dependencies).

    Yields the directory; tests put it on PYTHONPATH of a child process, so the
    user's own environment never sees the example, and the directory is removed
    afterwards.
    """
    target = tmp_path_factory.mktemp("plugins-site")
    source = tmp_path_factory.mktemp("plugins-src") / "plugins"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))  # builds leave files
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    try:
        yield target
    finally:
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(source.parent, ignore_errors=True)


def test_example_is_not_left_in_the_environment(installed_example: Path) -> None:
    """The install is private to the tests that ask for it."""
    result = run_python("import importlib.util; print(importlib.util.find_spec('nanopy_zlib'))")
    assert result.stdout.strip() == "None", result.stdout + result.stderr


def test_example_plugin_via_entry_point(installed_example: Path) -> None:
    result = run_python(
        """
        import nanopy
        from nanopy.testing import wait_pipes
        assert "tcp+zlib" in nanopy.transports.schemes()
        with nanopy.Socket("pull") as pull, nanopy.Socket("push") as push:
            ep = pull.bind("tcp+zlib://127.0.0.1:0")
            push.connect(ep.url)
            wait_pipes(push)
            body = b'{"level": "info", "msg": "hello"}' * 2000
            for _ in range(10):
                push.send(body)
            assert all(pull.recv(timeout=5) == body for _ in range(10))
            print("OK", ep.url, type(nanopy.transports.get("tcp+zlib")).__module__)
        """,
        path=installed_example,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK tcp+zlib://127.0.0.1:" in result.stdout
    assert "nanopy_zlib" in result.stdout


def test_conformance_suite_on_installed_plugin(installed_example: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{installed_example}{os.pathsep}{env.get('PYTHONPATH', '')}"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "tcp+zlib",
         str(ROOT / "tests" / "test_conformance.py")],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "failed" not in result.stdout


def test_plugin_wire_is_compressed() -> None:
    """The example really compresses: a repetitive batch shrinks on the wire."""
    import trio

    sys.path.insert(0, str(EXAMPLE / "src"))
    try:
        import nanopy_zlib
    finally:
        sys.path.remove(str(EXAMPLE / "src"))
    assert isinstance(nanopy_zlib.transport, Transport)

    class Capture:
        data = b""

        async def send_all(self, data: bytes) -> None:
            self.data += data

    stream = Capture()
    ctx = nanopy.transports.PipeContext(0x50, 0x51, "push", "pull")
    conn = nanopy_zlib.ZlibConnection(stream, ctx, "test")  # type: ignore[arg-type]
    body = b'{"level": "info", "msg": "hello"}' * 1000
    trio.run(conn.send, [body, body])
    assert 0 < len(stream.data) < len(body) // 20
    reader = nanopy_zlib.ZlibConnection(stream, ctx, "test")  # type: ignore[arg-type]
    reader._feed(stream.data)
    assert reader._parse() == [body, body]
