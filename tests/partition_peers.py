"""Peers for the multi-host partition tests (tests/test_multihost_partitions.py) and
the figures script (benchmarks/partitions.py): run inside a netns host with
``Host.python(PEERS, role, ...)``; every event is one stdout line that starts with
a word and ends with the time on the system's monotonic clock (the same clock in
every namespace), so the test can measure from the moment it cut a link.

Roles (``argv[1]``)::

    server NAME ADDR TIMEOUT CLIENT REP, PULL, RESPONDENT, PAIR on tcp (56x1) and ws (56x2),
                                    and SUBs dialing the client's PUBs at CLIENT; with
                                    NP_TLS_DIR set, REP on tls+tcp (5603) and wss (5604) too
    req URLS TIMEOUT T_REQ          request(timeout=T_REQ) in a loop, 10 a second
    push URLS TIMEOUT               send(seq) at 10 a second
    surveyor URLS TIMEOUT           a survey every 0.5 s (survey_deadline 0.4)
    pub BIND TIMEOUT                publish seq at 10 a second
    idle URLS TIMEOUT               a PAIR that sends nothing; reports pipes coming and going
    pull BIND TIMEOUT               one PULL bound at BIND; reports each message's sequence number
    flood URLS TIMEOUT RATE RESEND SEED
                                    PUSH at RATE messages a second (resend_unacked=RESEND, 0 or 1):
                                    "SEQ " and 0..3000 bytes of padding, sizes drawn from SEED

URLS are ``url@priority,url@priority``; TIMEOUT is dead_peer_timeout ("default"
for the library's default, "none" for None). NP_TLS_DIR (environment) holds
``server.pem`` (key and chain for every host's address) and ``ca.pem``, for the TLS
schemes. Every role answers "stats" on stdin with a ``stats {json}`` line and
"stop" by stopping its traffic (``stopped N``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import ssl
import sys
import threading
import time

import nanopy

now = time.monotonic
_print_lock = threading.Lock()


def say(*words: object) -> None:
    with _print_lock:
        print(*words, f"{now():.3f}", flush=True)


def socket(protocol: str, timeout: str, **options: object) -> nanopy.Socket:
    sock = nanopy.Socket(protocol, **options)  # type: ignore[arg-type]
    if timeout != "default":
        sock.dead_peer_timeout = None if timeout == "none" else float(timeout)
    return sock


def tls_context(server: bool) -> ssl.SSLContext:
    folder = os.environ["NP_TLS_DIR"]
    if server:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(os.path.join(folder, "server.pem"))
    else:
        ctx = ssl.create_default_context(cafile=os.path.join(folder, "ca.pem"))
    return ctx


def connect_all(sock: nanopy.Socket, urls: str) -> None:
    for item in urls.split(","):
        url, _, prio = item.rpartition("@")
        if url.startswith(("tls+tcp:", "wss:")):
            sock.connect(url, priority=int(prio), ssl_context=tls_context(server=False))
        else:
            sock.connect(url, priority=int(prio))


def control(socks: dict[str, nanopy.Socket], stop: threading.Event) -> None:
    """Answer stdin commands: stats, stop."""
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "stats":
            out = {name: dataclasses.asdict(s.stats()) for name, s in socks.items()}
            with _print_lock:
                print("stats", json.dumps(out), flush=True)
        elif cmd == "stop":
            stop.set()


def host_of(body: bytes) -> str:
    return body.decode().rpartition("@")[2]


def server(name: str, addr: str, timeout: str, client: str) -> None:
    socks: dict[str, nanopy.Socket] = {}

    def serve(kind: str, port: int, loop: object) -> None:
        for scheme, p in (("tcp", port), ("ws", port + 1)):
            sock = socket(kind, timeout)
            sock.bind(f"{scheme}://{addr}:{p}")
            socks[f"{kind}-{scheme}"] = sock
            threading.Thread(target=loop, args=(sock, scheme), daemon=True).start()

    def rep(sock: nanopy.Socket, scheme: str) -> None:
        while True:
            msg = sock.recv_msg()
            msg.reply(msg.body + b"@" + name.encode())

    def pull(sock: nanopy.Socket, scheme: str) -> None:
        while True:
            say("pull", scheme, sock.recv().decode())

    def respondent(sock: nanopy.Socket, scheme: str) -> None:
        while True:
            sock.recv()
            sock.send(name.encode())

    def idle(sock: nanopy.Socket, scheme: str) -> None:
        sock.recv()

    serve("rep", 5601, rep)
    if os.environ.get("NP_TLS_DIR"):
        for scheme, p in (("tls+tcp", 5603), ("wss", 5604)):
            sock = socket("rep", timeout)
            sock.bind(f"{scheme}://{addr}:{p}", ssl_context=tls_context(server=True))
            socks[f"rep-{scheme}"] = sock
            threading.Thread(target=rep, args=(sock, scheme), daemon=True).start()
    serve("pull", 5611, pull)
    serve("respondent", 5631, respondent)
    serve("pair", 5641, idle)
    for scheme, port in (("tcp", 5621), ("ws", 5622)):
        sub = socket("sub", timeout)
        sub.subscribe(b"")
        sub.connect(f"{scheme}://{client}:{port}")
        socks[f"sub-{scheme}"] = sub
        threading.Thread(target=lambda s=sub, sc=scheme: [say("sub", sc, s.recv().decode()) for _ in iter(int, 1)],
                         daemon=True).start()
    say("bound", name)
    control(socks, threading.Event())


def watch_pipes(sock: nanopy.Socket) -> None:
    sock.on_pipe_added(lambda p: say("added", p.remote_address))
    sock.on_pipe_removed(lambda p: say("removed", p.remote_address))


def run(sock: nanopy.Socket, step: object, period: float) -> None:
    """Call ``step(n)`` every ``period`` seconds until "stop"; then keep answering "stats"."""
    watch_pipes(sock)
    stop = threading.Event()
    threading.Thread(target=control, args=({sock.name: sock}, stop), daemon=True).start()
    say("ready")
    n = 0
    start = now()
    while not stop.is_set():
        n += 1
        step(n)  # type: ignore[operator]
        time.sleep(max(0.0, start + n * period - now()))
    say("stopped", n)
    stop.clear()
    stop.wait()


def req(urls: str, timeout: str, t_req: str) -> None:
    sock = socket("req", timeout, resend_interval=60.0)
    connect_all(sock, urls)

    def step(n: int) -> None:
        sent = now()
        try:
            answer = sock.request(b"%d" % n, timeout=float(t_req))
            say("answer", host_of(answer), f"{sent:.3f}")
        except nanopy.Timeout:
            say("timeout", f"{sent:.3f}")

    run(sock, step, 0.1)


def push(urls: str, timeout: str) -> None:
    sock = socket("push", timeout)
    connect_all(sock, urls)
    run(sock, lambda n: sock.send(b"%d" % n), 0.1)


def surveyor(urls: str, timeout: str) -> None:
    sock = socket("surveyor", timeout, survey_deadline=0.4)
    connect_all(sock, urls)

    def step(n: int) -> None:
        sent = now()
        hosts = sorted(a.decode() for a in sock.survey(b"who"))
        say("survey", "+".join(hosts) or "-", f"{sent:.3f}")

    run(sock, step, 0.5)


def pub(binds: str, timeout: str) -> None:
    sock = socket("pub", timeout)
    for url in binds.split(","):
        sock.bind(url)
    run(sock, lambda n: sock.send(b"%d" % n), 0.1)


def idle(urls: str, timeout: str) -> None:
    sock = socket("pair", timeout)
    watch_pipes(sock)
    connect_all(sock, urls)
    say("ready")
    control({"pair": sock}, threading.Event())


def pull(bind: str, timeout: str) -> None:
    sock = socket("pull", timeout)
    sock.bind(bind)
    threading.Thread(target=control, args=({"pull": sock}, threading.Event()), daemon=True).start()
    say("bound", bind)
    while True:
        say("pull", sock.recv().split(b" ", 1)[0].decode())


def flood(urls: str, timeout: str, rate: str, resend: str, seed: str) -> None:
    sock = socket("push", timeout, resend_unacked=resend == "1")
    connect_all(sock, urls)
    sizes = random.Random(int(seed))
    run(sock, lambda n: sock.send(b"%d " % n + b"x" * sizes.randrange(3001)), 1 / float(rate))


if __name__ == "__main__":
    role, args = sys.argv[1], sys.argv[2:]
    roles = {"server": server, "req": req, "push": push, "surveyor": surveyor, "pub": pub, "idle": idle,
             "pull": pull, "flood": flood}
    roles[role](*args)
