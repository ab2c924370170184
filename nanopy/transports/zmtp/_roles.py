"""What each nanopy socket type does on a ZMTP pipe (RFC 28, 29, 30, 31).

The protocol cores speak SP payloads (header + body). A role translates at the
pipe's edge, so no core knows about ZeroMQ:

* PUSH, PULL, PAIR: a message is its frames; a single-frame message is the body.
* PUB: keeps the peer's subscriptions (a radix tree per pipe) and writes only
  the messages they match -- ZeroMQ filters at the publisher.
* SUB: tells the peer what the socket is subscribed to (SUBSCRIBE/CANCEL
  commands to 3.1 peers, ``0x01``/``0x00`` messages to 3.0 peers), when the pipe
  comes up and whenever a subscription changes.
* REQ: an SP request is ``id + body``; on the wire it is an empty delimiter and
  the body, as libzmq's REQ sends it. The wire has no id, so one request is in
  flight per pipe: the role's write window (``WriteWindow``) is one request, and
  the others wait in the pipe's outbox until the reply opens it again.
* REP: keeps every envelope (the frames up to the delimiter) under a 4-byte
  token it hands the core as the backtrace, and writes the envelope back in
  front of the reply.
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from ...core.errors import AddressError
from ...core.message import Multipart
from .._base import DROP_CANCELLED as CANCELLED
from .._base import DROP_MALFORMED as MALFORMED
from .._base import DROP_UNROUTABLE as UNROUTABLE
from ._codec import DELIMITER, encode_batch, encode_command, encode_message, encode_single, frame_header

log = logging.getLogger("nanopy")

#: a function that queues a frame ahead of payloads, after what it queued before
SendControl = Callable[[bytes], Any]
#: counts messages a role discarded: ``count_drop(reason, n)``, a reason of nanopy.core.drops
CountDrop = Callable[[str, int], Any]


def _uncounted(reason: str, n: int) -> None:
    """Until its pipe joins a socket (``ZmtpConnection.count_drops_with``)."""

#: at most this many REP envelopes wait for their replies per pipe (the oldest go first)
MAX_ENVELOPES = 65536
#: a REQ pipe remembers this many of the requests it wrote (resends of them are not written)
WRITTEN_KEPT = 64
#: the window of a role that never limits its writes
UNLIMITED = sys.maxsize


def _unwatched() -> None:
    """Until the pipe watches the window (``ReqRole.watch_window``)."""


def frames_of(payload: bytes) -> list[bytes]:
    """The frames of a body: a :class:`Multipart`'s parts, else the body alone."""
    if payload.__class__ is bytes:
        return [payload]
    parts = getattr(payload, "parts", None)
    return list(parts) if parts is not None else [bytes(payload)]


def encode_body(payload: bytes) -> bytes:
    """A body as its frames (several for a :class:`Multipart`)."""
    if payload.__class__ is bytes:
        return encode_single(payload)
    return encode_message(frames_of(payload))


def encode_bodies(payloads: list[bytes]) -> bytes:
    if len(payloads) == 1:
        return encode_body(payloads[0])
    return encode_batch(payloads, encode_body)


class Role:
    """The plain role (PUSH, PULL, PAIR): a message is its frames."""

    zmq_type = b""
    peers: frozenset[bytes] = frozenset()
    #: what a single-frame message becomes (see ZmtpDecoder.single); None: the
    #: body as it is, parsed by the decoder's inner loop
    single: Callable[[bytes], bytes | None] | None = None

    def __init__(self) -> None:
        self.send_control: SendControl = lambda frame: None
        self.count_drop: CountDrop = _uncounted
        self.minor = 1  # the peer's ZMTP minor version (0: 3.0)

    def window(self) -> int:
        """How many more messages this pipe may write now (WriteWindow)."""
        return UNLIMITED

    def watch_window(self, moved: Callable[[], None]) -> bool:
        """Tell ``moved`` when the window moves; False: this role has none."""
        return False

    def frame(self, payloads: list[bytes]) -> bytes:
        """The wire data of a batch of SP payloads."""
        return encode_bodies(payloads)

    def multi(self, frames: list[bytes]) -> bytes | None:
        """A received message of several frames; the SP payload to deliver, or None."""
        return Multipart(frames)

    def command(self, name: bytes, data: bytes) -> bool:
        """A role-specific command; False if the role does not know it."""
        return False

    def subscriptions(self, topics: frozenset[bytes]) -> None:
        """The socket's subscriptions now (SubscriptionForwarding; a socket round)."""


class PushRole(Role):
    zmq_type = b"PUSH"
    peers = frozenset({b"PULL"})


class PullRole(Role):
    zmq_type = b"PULL"
    peers = frozenset({b"PUSH"})


class PairRole(Role):
    zmq_type = b"PAIR"
    peers = frozenset({b"PAIR"})


class LockedRole(Role):
    """A role whose state the pipe's reader and the socket's senders both touch,
    from different threads: ``_lock`` guards it."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()


class TopicFilter:
    """A publisher pipe's subscriptions: a multiset of topics (a topic subscribed
    twice needs two CANCELs) and the test "some topic prefixes this frame".

    The test looks up the frame's prefix of each length a topic has, one dict
    lookup per distinct length: few, as topics go.
    """

    def __init__(self) -> None:
        self._counts: dict[bytes, int] = {}  # topic -> subscriptions
        self._lengths: dict[int, int] = {}  # a topic length -> distinct topics of it

    def __len__(self) -> int:
        return len(self._counts)

    def __contains__(self, topic: bytes) -> bool:
        return topic in self._counts

    def add(self, topic: bytes) -> None:
        counts = self._counts
        n = counts.get(topic, 0)
        counts[topic] = n + 1
        if not n:
            self._lengths[len(topic)] = self._lengths.get(len(topic), 0) + 1

    def remove(self, topic: bytes) -> None:
        """Drop one subscription to ``topic`` (KeyError if none)."""
        counts = self._counts
        n = counts[topic] - 1
        if n:
            counts[topic] = n
            return
        del counts[topic]
        lengths = self._lengths
        left = lengths[len(topic)] - 1
        if left:
            lengths[len(topic)] = left
        else:
            del lengths[len(topic)]

    def match(self, frame: bytes) -> bool:
        counts = self._counts
        size = len(frame)
        return any(n <= size and frame[:n] in counts for n in self._lengths)


class PubRole(LockedRole):
    """Filters at the publisher: a message goes out if a peer subscription matches
    its first frame (RFC 29)."""

    zmq_type = b"PUB"
    peers = frozenset({b"SUB", b"XSUB"})

    def __init__(self) -> None:
        super().__init__()
        self.topics = TopicFilter()  # the reader changes it, senders read it (under _lock)

    def frame(self, payloads: list[bytes]) -> bytes:
        with self._lock:
            topics = self.topics
            if b"" in topics:
                kept = payloads
            elif not topics:
                return b""
            else:
                match = topics.match
                kept = [p for p in payloads if match(p if p.__class__ is bytes else frames_of(p)[0])]
        return encode_bodies(kept) if kept else b""

    def _subscription(self, subscribe: bool, topic: bytes) -> None:
        with self._lock:
            if subscribe:
                self.topics.add(topic)
            else:
                try:
                    self.topics.remove(topic)
                except KeyError:
                    pass  # a CANCEL of nothing: libzmq ignores it too

    def single(self, body: bytes) -> bytes | None:
        # ZMTP 3.0 subscriptions are messages: 0x01 topic / 0x00 topic; other data is dropped.
        if body[:1] == b"\x01":
            self._subscription(True, body[1:])
        elif body[:1] == b"\x00":
            self._subscription(False, body[1:])
        return None

    def multi(self, frames: list[bytes]) -> bytes | None:
        return None  # a SUB has nothing to say in several frames

    def command(self, name: bytes, data: bytes) -> bool:
        if name == b"SUBSCRIBE":
            self._subscription(True, data)
        elif name == b"CANCEL":
            self._subscription(False, data)
        else:
            return False
        return True


class SubRole(Role):
    """Keeps the peer told of this socket's subscriptions: the difference between
    what the core holds and what was told goes out whenever either may change.

    A topic is told once however often the socket subscribed to it, and cancelled
    when its last subscription goes, as libzmq's SUB does (its publishers keep a
    set per pipe, although RFC 37 counts).
    """

    zmq_type = b"SUB"
    peers = frozenset({b"PUB", b"XPUB"})

    def __init__(self) -> None:
        super().__init__()
        self._told: frozenset[bytes] = frozenset()

    def subscriptions(self, want: frozenset[bytes]) -> None:
        """In a round of the socket: send what changed since the last call."""
        told = self._told
        out = [self._encode(True, t) for t in want - told] + [self._encode(False, t) for t in told - want]
        self._told = want
        if out:
            self.send_control(b"".join(out))

    def _encode(self, subscribe: bool, topic: bytes) -> bytes:
        if self.minor >= 1:
            return encode_command(b"SUBSCRIBE" if subscribe else b"CANCEL", topic)
        return encode_single((b"\x01" if subscribe else b"\x00") + topic)


class ReqRole(LockedRole):
    """One request in flight per pipe (the wire carries no request id): a write
    window of one request, open again when its reply comes."""

    zmq_type = b"REQ"
    peers = frozenset({b"REP", b"ROUTER"})

    def __init__(self) -> None:
        super().__init__()
        self._inflight: bytes | None = None  # the id of the request on the wire
        # The ids of the latest requests written here: a resend of one is not
        # written again (a ZMTP pipe loses nothing; the copy could only bring a
        # second reply). Oldest first, at most WRITTEN_KEPT.
        self._written: dict[bytes, None] = {}
        self._moved: Callable[[], None] = _unwatched

    def window(self) -> int:
        return 0 if self._inflight is not None else 1

    def watch_window(self, moved: Callable[[], None]) -> bool:
        self._moved = moved
        return True

    def frame(self, payloads: list[bytes]) -> bytes:
        out = b""
        over = 0
        with self._lock:
            written = self._written
            for p in payloads:
                rid = p[:4]
                if rid in written:
                    continue  # a resend of a request this pipe wrote already
                if self._inflight is not None:
                    over += 1  # past the window (a pipe never hands these): not written
                    continue
                self._inflight = rid
                written[rid] = None
                if len(written) > WRITTEN_KEPT:
                    del written[next(iter(written))]
                out = DELIMITER + encode_body(p[4:])
        if out:
            self._moved()  # shut (after the role's lock: the hook takes the pipe's)
        if over:
            self.count_drop(CANCELLED, over)  # the core sends it again (resend_interval)
        return out

    def single(self, body: bytes) -> bytes | None:
        self.count_drop(MALFORMED, 1)  # a reply without the delimiter: dropped, as libzmq's REQ does
        return None

    def multi(self, frames: list[bytes]) -> bytes | None:
        if frames[0]:
            self.count_drop(MALFORMED, 1)  # no delimiter first: not a reply
            return None
        with self._lock:
            rid = self._inflight
            self._inflight = None
        if rid is None:
            self.count_drop(CANCELLED, 1)  # no request in flight: a duplicate or stale reply
            return None
        self._moved()  # the window is open: the next request in the outbox may go
        return rid + (frames[1] if len(frames) == 2 else Multipart(frames[1:]))


class RepRole(LockedRole):
    """Envelopes kept per pipe under a token that the core carries as the backtrace."""

    zmq_type = b"REP"
    peers = frozenset({b"REQ", b"DEALER"})

    def __init__(self) -> None:
        super().__init__()
        self._envelopes: dict[bytes, list[bytes]] = {}
        self._ids = itertools.count(1)

    def single(self, body: bytes) -> bytes | None:
        self.count_drop(MALFORMED, 1)  # no envelope, no way back: dropped, as libzmq's REP does
        return None

    def multi(self, frames: list[bytes]) -> bytes | None:
        try:
            end = frames.index(b"")
        except ValueError:
            end = len(frames)
        body = frames[end + 1 :]
        if not body:
            self.count_drop(MALFORMED, 1)  # no delimiter, or nothing after it: dropped
            return None
        token = ((next(self._ids) & 0x7FFFFFFF) | 0x80000000).to_bytes(4, "big")
        with self._lock:
            envelopes = self._envelopes
            envelopes[token] = frames[:end]
            if len(envelopes) > MAX_ENVELOPES:
                del envelopes[next(iter(envelopes))]
        return token + (body[0] if len(body) == 1 else Multipart(body))

    def frame(self, payloads: list[bytes]) -> bytes:
        out: list[bytes] = []
        lost = 0
        with self._lock:
            for p in payloads:
                envelope = self._envelopes.pop(p[:4], None)
                if envelope is None:
                    lost += 1  # its envelope is gone (pushed out past MAX_ENVELOPES, or used): no way back
                    continue
                out.extend(frame_header(len(f), 1) + f for f in envelope)
                out.append(DELIMITER)
                out.append(encode_body(p[4:]))
        if lost:
            self.count_drop(UNROUTABLE, lost)
        return b"".join(out)


ROLES: dict[str, type[Role]] = {
    "pair": PairRole,
    "push": PushRole,
    "pull": PullRole,
    "pub": PubRole,
    "sub": SubRole,
    "req": ReqRole,
    "rep": RepRole,
}


#: raw sockets (devices) whose messages have no header, so a ZMTP pipe carries them as they are
RAW_ROLES = ("pair", "push", "pull", "pub", "sub")


def check_protocol(scheme: str, name: str, raw: bool) -> None:
    """Refuse a socket that has no ZeroMQ counterpart (bind/connect, at once)."""
    if name not in ROLES or (raw and name not in RAW_ROLES):
        kind = f"raw {name}" if raw else name
        raise AddressError(
            f"{scheme}:// speaks ZeroMQ's ZMTP, which has no counterpart of a {kind} socket; "
            f"it works with cooked {', '.join(ROLES)} sockets and raw {', '.join(RAW_ROLES)} ones"
        )


def make_role(name: str) -> Role:
    return ROLES[name]()


def describe_peers(role: Role) -> str:
    return " or ".join(sorted(p.decode() for p in role.peers))
