"""``nanopy cat``: a nanocat-compatible command-line peer.

Same flags, same loops, same output bytes and exit codes as nanomsg's ``nanocat``:

* PUB/PUSH send DATA (again every ``--interval``); SUB/PULL print forever;
* REQ/SURVEYOR send DATA then print the replies (the request is repeated every
  ``--interval``, replies are printed in between);
* REP/RESPONDENT answer each request with DATA, or only print without DATA;
* BUS/PAIR act like REQ with DATA and like PULL without.

Receive loops end quietly on a receive timeout or when the protocol state allows
no more messages (REQ after its reply, SURVEYOR after the deadline). Exit status:
0 normally, 1 for a bad command line, 2 for an unreadable ``--file``, 3 when a
socket operation fails (``Can't bind: ...``, ``Can't send: ...``), 130 on Ctrl-C.

Differences from nanocat, all additive: fractional ``--recv-timeout`` values are
honoured (nanocat truncates them to whole seconds in receive-only loops);
``ws://``, ``wss://``, ``tls+tcp://`` and ZeroMQ's ``zmtp+tcp://`` and ``zmtp+ipc://``
URLs work (a multipart message printed as one record of its frames, see
nanopy/_cli/formats.py), with nngcat's TLS flags
(``--cert``, ``--key``, ``--cacert``, ``--insecure``); ``-v`` prints the address a
bind really got (useful with port 0).
"""

from __future__ import annotations

import os
import ssl
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from .formats import FORMAT_NAMES, FORMATTERS, MULTIPART_FORMATTERS
from .options import (
    DATA,
    ENDPOINT,
    READABLE,
    SOCK,
    SUB,
    WRITABLE,
    Flag,
    HelpRequested,
    Parser,
    UsageError,
    as_arg_bytes,
    read_data_file,
    seconds_option,
)

PROG = "nanopy cat"
SUMMARY = "A nanocat-compatible command-line interface to nanopy sockets."


@dataclass
class CatConfig:
    """Everything the command line says (defaults as nanocat's)."""

    protocol: str | None = None
    binds: list[str] = field(default_factory=list)
    connects: list[str] = field(default_factory=list)
    send_timeout: float = -1.0  # negative = no timeout
    recv_timeout: float = -1.0
    subscriptions: list[bytes] = field(default_factory=list)
    socket_name: str | None = None
    delay: float = 0.0
    interval: float = -1.0  # negative = send once
    data: bytes | None = None
    format: str = "no"
    verbose: int = 0
    cert: str | None = None
    key: str | None = None
    cacert: str | None = None
    insecure: bool = False


# -- the option table ---------------------------------------------------------------------


def _set(attr: str, value: Any) -> Any:
    def apply(config: CatConfig, _: str | None) -> None:
        setattr(config, attr, value)

    return apply


def _store(attr: str) -> Any:
    def apply(config: CatConfig, value: str | None) -> None:
        setattr(config, attr, value)

    return apply


def _append(attr: str, template: str = "{}") -> Any:
    def apply(config: CatConfig, value: str | None) -> None:
        getattr(config, attr).append(template.format(value))

    return apply


def _bump(delta: int) -> Any:
    def apply(config: CatConfig, _: str | None) -> None:
        config.verbose += delta

    return apply


def _help(config: CatConfig, _: str | None) -> None:
    raise HelpRequested


def _format(config: CatConfig, value: str | None) -> None:
    if value not in FORMATTERS:
        raise UsageError(f"{PROG}: invalid format {value!r} for --format; choose one of: {', '.join(FORMAT_NAMES)}")
    config.format = value


def _data(config: CatConfig, value: str | None) -> None:
    config.data = as_arg_bytes(value or "")


def _file(config: CatConfig, value: str | None) -> None:
    config.data = read_data_file(value or "")


def _subscribe(config: CatConfig, value: str | None) -> None:
    config.subscriptions.append(as_arg_bytes(value or ""))


_RW = SOCK | WRITABLE | READABLE
_SOCKET_TYPES = [
    # name, provides, requires
    ("push", SOCK | WRITABLE, DATA),
    ("pull", SOCK | READABLE, 0),
    ("pub", SOCK | WRITABLE, DATA),
    ("sub", SOCK | READABLE | SUB, 0),
    ("req", _RW, DATA),
    ("rep", _RW, 0),
    ("surveyor", _RW, DATA),
    ("respondent", _RW, 0),
    ("bus", _RW, 0),
    ("pair", _RW, 0),
]

# The shorthands for --format NAME: name, short flag, help.
_FORMAT_FLAGS = [
    ("raw", "", "Print the message as is (no delimiters)"),
    ("ascii", "A", "Print printable bytes, others as '.', one line each"),
    ("quoted", "Q", "Print each message quoted with C-like escapes"),
    ("msgpack", "", "Print each message as a msgpack bin object"),
    ("hex", "", "Print each message quoted with \\xHH for every byte"),
]

G_GEN, G_TYPE, G_SOCK, G_SUB, G_IN, G_OUT, G_TLS = (
    "Generic", "Socket Types", "Socket Options", "SUB Socket Options", "Input Options",
    "Output Options", "TLS Options (nanopy extension, for wss:// and tls+tcp://)",
)

FLAGS: list[Flag] = [
    Flag("verbose", "v", "", _bump(1), G_GEN, "More verbose (prints the address a bind got)"),
    Flag("silent", "q", "", _bump(-1), G_GEN, "Less verbose"),
    Flag("help", "h", "", _help, G_GEN, "This help text"),
    *[
        Flag(name, "", "", _set("protocol", name), G_TYPE, f"Use a {name.upper()} socket",
             provides=provides, conflicts=SOCK, requires=requires)
        for name, provides, requires in _SOCKET_TYPES
    ],
    Flag("bind", "", "ADDR", _append("binds"), G_SOCK, "Bind the socket to ADDR", provides=ENDPOINT),
    Flag("connect", "", "ADDR", _append("connects"), G_SOCK, "Connect the socket to ADDR", provides=ENDPOINT),
    Flag("bind-ipc", "X", "PATH", _append("binds", "ipc://{}"), G_SOCK, 'Bind to "ipc://PATH"',
         provides=ENDPOINT),
    Flag("connect-ipc", "x", "PATH", _append("connects", "ipc://{}"), G_SOCK, 'Connect to "ipc://PATH"',
         provides=ENDPOINT),
    Flag("bind-local", "L", "PORT", _append("binds", "tcp://127.0.0.1:{}"), G_SOCK,
         'Bind to "tcp://127.0.0.1:PORT"', provides=ENDPOINT),
    Flag("connect-local", "l", "PORT", _append("connects", "tcp://127.0.0.1:{}"), G_SOCK,
         'Connect to "tcp://127.0.0.1:PORT"', provides=ENDPOINT),
    Flag("recv-timeout", "", "SEC", seconds_option("recv_timeout", "recv-timeout"), G_SOCK,
         "Timeout for receiving a message", requires=READABLE),
    Flag("send-timeout", "", "SEC", seconds_option("send_timeout", "send-timeout"), G_SOCK,
         "Timeout for sending a message", requires=WRITABLE),
    Flag("socket-name", "", "NAME", _store("socket_name"), G_SOCK, "Name of the socket (stats, logs)"),
    Flag("subscribe", "", "PREFIX", _subscribe, G_SUB,
         "Subscribe to PREFIX (repeatable; default: everything)", requires=SUB),
    Flag("format", "", "FORMAT", _format, G_IN, "Output format: " + ", ".join(FORMAT_NAMES), requires=READABLE),
    *[
        Flag(name, short, "", _set("format", name), G_IN, help_text, requires=READABLE)
        for name, short, help_text in _FORMAT_FLAGS
    ],
    Flag("interval", "i", "SEC", seconds_option("interval", "interval"), G_OUT,
         "Send the message (or request) every SEC seconds", requires=WRITABLE),
    Flag("delay", "d", "SEC", seconds_option("delay", "delay"), G_OUT, "Wait SEC seconds before the first send"),
    Flag("data", "D", "DATA", _data, G_OUT, "Send DATA (the reply for REP/RESPONDENT)",
         provides=DATA, conflicts=DATA, requires=WRITABLE),
    Flag("file", "F", "PATH", _file, G_OUT, "Like --data, from file PATH ('-' = stdin)",
         provides=DATA, conflicts=DATA, requires=WRITABLE),
    Flag("cert", "E", "FILE", _store("cert"), G_TLS, "Own certificate (PEM; key too unless --key)", extension=True),
    Flag("key", "", "FILE", _store("key"), G_TLS, "Private key (PEM)", extension=True),
    Flag("cacert", "", "FILE", _store("cacert"), G_TLS, "CA certificates to verify the peer", extension=True),
    Flag("insecure", "k", "", _set("insecure", True), G_TLS, "Do not verify the peer", extension=True),
]

PARSER = Parser(PROG, FLAGS, required=SOCK | ENDPOINT)


def parse(argv: Sequence[str]) -> CatConfig:
    """Parse a ``nanopy cat`` command line (raises UsageError / HelpRequested)."""
    config: CatConfig = PARSER.parse(argv, CatConfig())
    return config


# -- running ---------------------------------------------------------------------------------


class Fatal(Exception):
    """A socket operation failed: print the message and exit 3 (nanocat's nn_assert_errno)."""


#: seconds without any peer after which ``nanopy cat`` says so on stderr (once)
NO_PEER_HINT_AFTER = 3.0


def _reason(exc: BaseException, cfg: CatConfig | None = None) -> str:
    from .. import Closed, ProtocolError, Timeout

    # nanocat prints strerror(); keep its wording for the common cases.
    if isinstance(exc, Timeout):
        if cfg is not None and "no peer connected" in str(exc):
            # The API's explanation, with the addresses this command line used.
            return f"Connection timed out: no peer connected: {_where_peer(cfg)}"
        return "Connection timed out"
    if isinstance(exc, ProtocolError):
        return f"Operation cannot be performed in this state ({exc})"
    if isinstance(exc, Closed):
        return "Bad file descriptor"
    return str(exc) or type(exc).__name__


def _where_peer(cfg: CatConfig) -> str:
    """Where a peer should be, in the words of the API's "no peer connected" Timeout."""
    parts = []
    if cfg.connects:
        parts.append(f"check that a peer is running at {', '.join(cfg.connects)}")
    if cfg.binds:
        parts.append(f"check that a peer connects to {', '.join(cfg.binds)}")
    return "; ".join(parts) or "no --bind or --connect address was given"


def _ssl_context(cfg: CatConfig, server: bool) -> ssl.SSLContext | None:
    if not (cfg.cert or cfg.cacert or cfg.insecure):
        return None
    try:
        if server:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            if cfg.cacert:
                ctx.load_verify_locations(cfg.cacert)
                ctx.verify_mode = ssl.CERT_NONE if cfg.insecure else ssl.CERT_REQUIRED
        else:
            ctx = ssl.create_default_context(cafile=cfg.cacert)
            if cfg.insecure:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
        if cfg.cert:
            ctx.load_cert_chain(cfg.cert, cfg.key)
    except (OSError, ssl.SSLError) as exc:
        files = ", ".join(f"--{k} {v}" for k, v in (("cert", cfg.cert), ("key", cfg.key), ("cacert", cfg.cacert)) if v)
        raise Fatal(f"Can't load TLS settings ({files or 'defaults'}): {exc}") from None
    return ctx


def _endpoint_options(cfg: CatConfig, url: str, server: bool) -> dict[str, Any]:
    scheme = url.partition("://")[0]
    if scheme in ("wss", "tls+tcp"):
        ctx = _ssl_context(cfg, server)
        if ctx is not None:
            return {"ssl_context": ctx}
    return {}


class Cat:
    """One ``nanopy cat`` run: a socket plus nanocat's loops."""

    def __init__(self, cfg: CatConfig, out: BinaryIO) -> None:
        self.cfg = cfg
        self.out = out
        self.write = None if cfg.format == "no" else FORMATTERS[cfg.format]
        self.write_frames = MULTIPART_FORMATTERS[cfg.format]
        self.sock: Any = None
        self._hint: threading.Timer | None = None

    # -- setup -------------------------------------------------------------------------------
    def open(self) -> None:
        import nanopy

        cfg = self.cfg
        assert cfg.protocol is not None
        try:
            sock = nanopy.Socket(cfg.protocol)
        except (ValueError, nanopy.NanopyError) as exc:
            raise Fatal(f"Can't create socket: {exc}") from None
        self.sock = sock
        try:
            if cfg.send_timeout >= 0:
                sock.send_timeout = cfg.send_timeout
            if cfg.recv_timeout >= 0:
                sock.recv_timeout = cfg.recv_timeout
            if cfg.socket_name:
                sock.name = cfg.socket_name
        except (TypeError, ValueError) as exc:
            raise Fatal(f"Can't set socket option: {exc}") from None
        if cfg.protocol == "sub":
            for topic in cfg.subscriptions or [b""]:
                try:
                    sock.subscribe(topic)
                except nanopy.NanopyError as exc:
                    raise Fatal(f"Can't subscribe: {_reason(exc)}") from None
        for url in cfg.binds:
            try:
                ep = sock.bind(url, **_endpoint_options(cfg, url, server=True))
            except (nanopy.NanopyError, OSError, TypeError, ValueError) as exc:
                raise Fatal(f"Can't bind {url}: {_reason(exc)}") from None
            if cfg.verbose > 0:
                print(f"Listening at: {ep.url}", file=sys.stderr, flush=True)
        for url in cfg.connects:
            try:
                sock.connect(url, **_endpoint_options(cfg, url, server=False))
            except (nanopy.NanopyError, OSError, TypeError, ValueError) as exc:
                raise Fatal(f"Can't connect {url}: {_reason(exc)}") from None
        if cfg.connects or cfg.data is not None:
            # A bound receive-only peer (a server) waits for peers as its job; a dialer or
            # a sender that has never seen one is told, once, where we look for it.
            self._hint = threading.Timer(NO_PEER_HINT_AFTER, self._no_peer_hint)
            self._hint.daemon = True
            self._hint.start()

    def _no_peer_hint(self) -> None:
        sock = self.sock
        if sock is None or sock.closed or sock.stats().connects:
            return
        print(
            f"{PROG}: no peer connected after {NO_PEER_HINT_AFTER:g} s: {_where_peer(self.cfg)} "
            "(still waiting)",
            file=sys.stderr,
            flush=True,
        )

    def close(self, linger: float | None = None) -> None:
        if self._hint is not None:
            self._hint.cancel()
        if self.sock is not None:
            self.sock.close(linger)

    # -- primitives ----------------------------------------------------------------------
    def _print(self, body: bytes) -> None:
        if self.write is not None:
            self.out.write(self.write(body))
            self.out.flush()

    def _print_parts(self, msg: Any) -> None:
        """A message as nanocat prints one; a ZeroMQ multipart message (zmtp+ URLs)
        as one record of its frames, boundaries kept (nanopy/_cli/formats.py)."""
        parts = msg.parts
        if len(parts) == 1:
            self._print(parts[0])
        elif self.write is not None:
            self.out.write(self.write_frames(parts))
            self.out.flush()

    def _send(self) -> None:
        import nanopy

        try:
            self.sock.send(self.cfg.data)
        except nanopy.NanopyError as exc:
            raise Fatal(f"Can't send: {_reason(exc, self.cfg)}") from None

    # -- nanocat's loops ---------------------------------------------------------------
    def run(self) -> None:
        cfg = self.cfg
        if cfg.delay > 0:
            time.sleep(cfg.delay)
        kind = cfg.protocol
        if kind in ("pub", "push"):
            self.send_loop()
        elif kind in ("sub", "pull"):
            self.recv_loop()
        elif kind in ("bus", "pair"):
            if cfg.data is not None:
                self.rw_loop()
            else:
                self.recv_loop()
        elif kind in ("req", "surveyor"):
            self.rw_loop()
        elif cfg.data is not None:  # rep, respondent
            self.reply_loop()
        else:
            self.recv_loop()

    def send_loop(self) -> None:
        interval = self.cfg.interval
        while True:
            start = time.monotonic()
            self._send()
            if interval < 0:
                return
            left = start + interval - time.monotonic()
            if left > 0:
                time.sleep(left)

    def recv_loop(self) -> None:
        import nanopy

        while True:
            try:
                body = self.sock.recv_msg()
            except (nanopy.Timeout, nanopy.ProtocolError):
                return  # no more messages possible
            except nanopy.NanopyError as exc:
                raise Fatal(f"Can't recv: {_reason(exc, self.cfg)}") from None
            self._print_parts(body)

    def rw_loop(self) -> None:
        import nanopy

        interval = self.cfg.interval
        recv_timeout = self.cfg.recv_timeout
        while True:
            start = time.monotonic()
            self._send()
            if interval < 0:
                self.recv_loop()
                return
            while True:
                left = start + interval - time.monotonic()
                if left <= 0:
                    break
                wait = recv_timeout if 0 <= recv_timeout < left else left
                try:
                    body = self.sock.recv_msg(timeout=wait)
                except (nanopy.Timeout, nanopy.ProtocolError):
                    left = start + interval - time.monotonic()
                    if left > 0:
                        time.sleep(left)
                    continue
                except nanopy.NanopyError as exc:
                    raise Fatal(f"Can't recv: {_reason(exc, self.cfg)}") from None
                self._print_parts(body)

    def reply_loop(self) -> None:
        import nanopy

        while True:
            try:
                body = self.sock.recv_msg()
            except nanopy.NanopyError as exc:
                raise Fatal(f"Can't recv: {_reason(exc, self.cfg)}") from None
            self._print_parts(body)
            self._send()


def main(argv: Sequence[str]) -> int:
    """Run ``nanopy cat`` with ``argv`` (the arguments after ``cat``); return the exit status."""
    try:
        cfg = parse(argv)
    except HelpRequested:
        sys.stdout.write(PARSER.help_text(SUMMARY))
        return 0
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return exc.code
    cat = Cat(cfg, sys.stdout.buffer)
    try:
        cat.open()
        cat.run()
    except BrokenPipeError:
        # The reader of stdout went away (| head): end quietly, as a C tool killed
        # by SIGPIPE would. (SIGPIPE itself stays ignored: a dead TCP peer must
        # surface as an error on that pipe, not kill the process.)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        cat.close(linger=0)
        return 128 + 13
    except Fatal as exc:
        print(str(exc), file=sys.stderr)
        cat.close(linger=0)
        return 3
    except KeyboardInterrupt:
        cat.close(linger=0)
        return 130
    cat.close()
    return 0
