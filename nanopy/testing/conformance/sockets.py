"""Rules checked through real sockets, the way a user drives a transport: messages,
a stalled reader held by ``send_timeout``, the receive limit, many pipes, reconnects
and subscriptions (T6, T10, T16-T18, C3).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from ...core.errors import Timeout
from ...socket.socket import Socket
from .proxy import wire_address
from .target import Check

#: the stalled-reader check's message size and the socket buffers it runs with
STALL_MESSAGE = 64 * 1024
STALL_BUFFER = 16


@contextmanager
def bound_pair(ck: Check, protocol: str = "pair", peer: str | None = None,
               **options: Any) -> Iterator[tuple[Socket, Socket]]:
    """A ``protocol`` socket bound on a fresh address and a ``peer`` socket (default
    the same protocol) connected to it, their pipe up; both closed after."""
    t = ck.target
    with ExitStack() as stack:
        a = stack.enter_context(Socket(protocol, recv_timeout=t.timeout, send_timeout=t.timeout, **options))
        b = stack.enter_context(Socket(peer or protocol, recv_timeout=t.timeout, send_timeout=t.timeout,
                                       reconnect_interval=0.05, **options))
        b.connect(a.bind(ck.new_url("sock"), **t.bind_options).url, **t.connect_options)
        wait_pipes(ck, (a, b), 1, "a pipe after connect")
        yield a, b


def wait_pipes(ck: Check, sockets: tuple[Socket, ...], n: int, what: str) -> None:
    """Until every socket of ``sockets`` has ``n`` pipes."""
    ck.wait_for(lambda: all(len(s.pipes) == n for s in sockets), what)


def messages(ck: Check) -> None:
    """T6: order, and every size from empty to 4 MiB, both ways."""
    t = ck.target
    with bound_pair(ck, recv_max_size=8 << 20) as (a, b):
        for sender, receiver, way in ((a, b, "bind -> connect"), (b, a, "connect -> bind")):
            for i in range(200):
                sender.send(b"%d" % i)
            got = [_recv(ck, receiver, f"message {i} of 200 {way}") for i in range(200)]
            ck.expect(got == [b"%d" % i for i in range(200)], f"200 messages {way} out of order or changed")
            for size in [0, *(1 << k for k in range(21)), 4 << 20]:
                body = t.payload(size, size)
                sender.send(body)
                ck.expect(_recv(ck, receiver, f"a {size}-byte message {way}") == body,
                          f"a {size}-byte message {way} did not arrive intact")


def _recv(ck: Check, sock: Socket, what: str) -> bytes:
    try:
        return sock.recv()
    except Timeout:
        ck.fail(f"{what} did not arrive within {ck.timeout:g} s")


def stalled_reader(ck: Check) -> None:
    """T10 (socket half): ``send_timeout`` holds a sender whose peer reads nothing,
    after a bounded number of messages; nothing is lost once the peer reads."""
    t = ck.target
    bound = t.buffer_limit // STALL_MESSAGE + 2 * STALL_BUFFER + 4
    with bound_pair(ck, send_buffer=STALL_BUFFER, recv_buffer=STALL_BUFFER) as (a, b):
        sent = 0
        while True:
            try:
                b.send(t.payload(sent, STALL_MESSAGE), timeout=0.25)
            except Timeout:
                break
            sent += 1
            if sent > bound:
                ck.fail(f"{sent} messages of {STALL_MESSAGE >> 10} KiB went to a peer that reads nothing without "
                        f"send_timeout holding the sender (more than buffer_limit {t.buffer_limit >> 20} MiB "
                        "plus the socket buffers: unbounded memory behind a stalled reader)")
        for i in range(sent):
            ck.expect(a.recv() == t.payload(i, STALL_MESSAGE),
                      f"message {i} of {sent} sent to a stalled reader is missing or changed once it reads")
        b.send(b"after the stall")
        ck.expect(a.recv() == b"after the stall", "the sender did not go on after the stalled reader read")


def recv_max_size(ck: Check) -> None:
    """T16 (socket half): the offending pipe closes, counted; the socket goes on."""
    with bound_pair(ck, recv_max_size=1000) as (a, b):
        if wire_address(a.endpoints[0].url) is None:
            ck.skip("an in-memory transport hands payloads over: no wire limit (as in NNG)")
        b.send(b"x" * 1000)
        ck.expect(a.recv() == b"x" * 1000, "a message of exactly recv_max_size was not delivered")
        first = {p.id for p in a.pipes} | {p.id for p in b.pipes}
        b.send(b"y" * 1001)
        ck.wait_for(lambda: a.stats().protocol_errors >= 1, "an oversized message counted in protocol_errors")
        try:
            a.recv(timeout=0)
        except Timeout:
            pass
        else:
            ck.fail("a message over recv_max_size was delivered")
        # (the bad pipe counts its error before it leaves: wait for both ends' new pipe)
        ck.wait_for(lambda: len(a.pipes) == len(b.pipes) == 1 and not {p.id for p in a.pipes + b.pipes} & first,
                    "the dialer's new pipe after the oversized message")
        b.send(b"after")
        ck.expect(a.recv() == b"after", "the socket did not go on after closing a bad pipe")


def many_pipes(ck: Check) -> None:
    """T17: one REP listener, 16 REQ dialers; then half of them leave."""
    t = ck.target
    with ExitStack() as stack:
        rep = stack.enter_context(Socket("rep", recv_timeout=t.timeout, send_timeout=t.timeout))
        url = rep.bind(ck.new_url("many"), **t.bind_options).url
        reqs = [stack.enter_context(Socket("req", recv_timeout=t.timeout, send_timeout=t.timeout))
                for _ in range(16)]
        for req in reqs:
            req.connect(url, **t.connect_options)
        ck.wait_for(lambda: len(rep.pipes) == 16 and all(r.pipes for r in reqs), "16 dialers' pipes")
        _exchange(ck, rep, reqs, "16 dialers at once")
        for req in reqs[8:]:
            req.close()
        ck.wait_for(lambda: len(rep.pipes) == 8, "the listener's pipes after 8 of 16 dialers closed")
        _exchange(ck, rep, reqs[:8], "the 8 dialers left after the others closed")


def _exchange(ck: Check, rep: Socket, reqs: list[Socket], what: str) -> None:
    for i, req in enumerate(reqs):
        req.send(b"request %d" % i)
    for _ in reqs:
        rep.send(b"reply to " + rep.recv())
    for i, req in enumerate(reqs):
        got = req.recv()
        ck.expect(got == b"reply to request %d" % i, f"{what}: requester {i} got {got[:40]!r}")


def reconnect(ck: Check) -> None:
    """T18: a listener's close, a rebind, and a peer's close."""
    t = ck.target
    with bound_pair(ck) as (a, b):
        ep = a.endpoints[0]
        bound = ep.url
        ep.close()
        ck.wait_for(lambda: not a.pipes and not b.pipes, "pipes ended by the listener's close")
        a.bind(bound, **t.bind_options)  # (the same address: the dialer finds it again)
        wait_pipes(ck, (a, b), 1, "the dialer reconnecting after a rebind")
        b.send(b"again")
        ck.expect(a.recv() == b"again", "no message after reconnecting")
        b.close()
        ck.wait_for(lambda: not a.pipes, "the peer's close seen as the pipe's end")


def subscriptions(ck: Check) -> None:
    """C3: PUB/SUB subscriptions made before and after the pipe, and an unsubscribe."""
    t = ck.target
    with ExitStack() as stack:
        pub = stack.enter_context(Socket("pub", send_timeout=t.timeout))
        sub = stack.enter_context(Socket("sub", recv_timeout=t.timeout, reconnect_interval=0.05))
        sub.subscribe(b"a")
        sub.connect(pub.bind(ck.new_url("sub"), **t.bind_options).url, **t.connect_options)
        wait_pipes(ck, (pub, sub), 1, "a pipe after connect")
        _until_heard(ck, pub, sub, b"a", "a subscription made before the pipe")
        sub.subscribe(b"b")
        _until_heard(ck, pub, sub, b"b", "a subscription made after the pipe")
        sub.unsubscribe(b"a")
        _until_heard(ck, pub, sub, b"b", "a message after an unsubscribe", unwanted=b"a")


def _until_heard(ck: Check, pub: Socket, sub: Socket, topic: bytes, what: str, unwanted: bytes = b"") -> None:
    """Publish a probe on ``unwanted`` (if given) and one on ``topic`` per round until
    a round delivers the ``topic`` probe and not the ``unwanted`` one: a subscription
    reaches a filtering peer some time after it is made."""
    for n in range(int(ck.timeout / 0.05)):
        if unwanted:
            pub.send(unwanted + b" %d" % n)
        pub.send(topic + b" %d" % n)
        heard_unwanted = False
        while True:
            try:
                got = sub.recv(timeout=0.05)
            except Timeout:
                break
            ck.expect(got.startswith(topic) or (unwanted and got.startswith(unwanted)),
                      f"{what}: received {got[:40]!r}, on no subscribed topic")
            heard_unwanted = heard_unwanted or bool(unwanted and got == unwanted + b" %d" % n)
            if got == topic + b" %d" % n:
                if not heard_unwanted:
                    return
                break
    ck.fail(f"{what}: no round delivered the probe on {topic!r}"
            + (f" without the one on {unwanted!r}" if unwanted else "") + f" within {ck.timeout:g} s")
