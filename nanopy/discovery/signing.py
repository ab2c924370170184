"""Signed discovery: the group secret, HMAC-SHA256 signatures and the replay window.

Owns: loading a secret (bytes, or a key file whose permissions are checked), the
signed trailer appended to surveys and answers, the signature of version-2 beacons,
and :class:`Verifier`, which checks signatures, timestamps and counters and counts
every drop by reason. The formats are documented in ``docs/discovery.md`` ("Signed
discovery") and the threats they answer in ``docs/security.md``.

May call: the standard library only.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import logging
import os
import stat
import struct
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Union

log = logging.getLogger("nanopy.discovery")

MIN_SECRET = 16
"""Bytes a secret must have, at least (a key file's content after stripping whitespace)."""
MAX_KEY_FILE = 4096  # bytes; a larger file is not a key (a certificate bundle, a log...)
MAX_SKEW = 30.0
"""Seconds a signed message's timestamp may differ from this host's clock (either way)."""
MAX_SENDERS = 65536  # counters remembered per kind; only holders of the secret add to them
MAC_SIZE = 32
TRAILER_MAGIC = b"SPDS"  # "SP discovery signature"
_TRAILER = struct.Struct("!4sc8sQQ16s")  # magic, kind, instance, stamp (ms since the epoch), counter, nonce
TRAILER_SIZE = _TRAILER.size + MAC_SIZE  # 77 bytes
BEACON_STAMP = struct.Struct("!QQ")  # a v2 beacon's stamp and counter, before its MAC
KIND_BEACON, KIND_SURVEY, KIND_ANSWER = b"B", b"S", b"A"
_DOMAIN = b"nanopy discovery v2\x00"  # signatures of this protocol and of nothing else

#: why a datagram, survey or answer was dropped (the keys of the ``dropped`` counters)
REASONS = ("unsigned", "bad_signature", "stale", "replayed", "wrong_survey")

SecretSource = Union[bytes, str, "os.PathLike[str]"]


class Dropped(ValueError):
    """A message that fails verification; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def load_secret(secret: SecretSource | None) -> bytes | None:
    """The group secret from ``bytes`` or from the path of a key file (``None``: an open group).

    A key file holds the secret itself; surrounding whitespace (a final newline) is
    removed. It must not be readable or writable by other users, nor writable by
    the group (``chmod 600 key``), like ssh's private keys.

    Raises:
        TypeError: neither bytes nor a path.
        ValueError: shorter than :data:`MIN_SECRET` bytes, a key file that others may
            read, or one larger than :data:`MAX_KEY_FILE` bytes.
        OSError: the key file cannot be read (FileNotFoundError: there is none).
    """
    if secret is None:
        return None
    if isinstance(secret, (bytes, bytearray, memoryview)):
        key = bytes(secret)
        where = "the secret"
    elif isinstance(secret, (str, os.PathLike)):
        path = os.fspath(secret)
        try:
            _check_key_file(path)
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, "no such key file (a str secret is the path of a key file; "
                                    "pass bytes for the secret itself)", path) from None
        with open(path, "rb") as file:
            key = file.read(MAX_KEY_FILE + 1)
        if len(key) > MAX_KEY_FILE:
            raise ValueError(f"the key file {path} is larger than {MAX_KEY_FILE} bytes: not a discovery key")
        key = key.strip()
        where = f"the key file {path}"
    else:
        raise TypeError(f"secret must be bytes or the path of a key file, not {type(secret).__name__}")
    if len(key) < MIN_SECRET:
        raise ValueError(f"{where} holds {len(key)} bytes; a discovery secret needs at least {MIN_SECRET} "
                         "(make one with: head -c 32 /dev/urandom | base64 > key; chmod 600 key)")
    return key


def _check_key_file(path: str) -> None:
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if os.name == "nt":  # (no POSIX permission bits there: the file's ACL decides)
        return
    if mode & (stat.S_IROTH | stat.S_IWOTH | stat.S_IWGRP):
        raise ValueError(f"permissions {mode:04o} for the key file {path} are too open: other users may "
                         f"read or change the discovery secret; run: chmod 600 {path}")


_warned_open: list[bool] = []  # (a list: appended to, never rebound)


def warn_open_group(what: str) -> None:
    """Log once per process that discovery runs without a secret."""
    if _warned_open:
        return
    _warned_open.append(True)
    log.warning("%s has no secret: its discovery group is open, anyone on the network can announce "
                "services, delist them or learn them; pass secret= (or --secret-file) to sign it "
                "(see docs/security.md)", what)


def group_keys(secret: SecretSource | None, what: str, instance: bytes) -> tuple[Signer | None, Verifier | None]:
    """The signer and verifier of a discovery object named ``what`` (both None, and the
    open-group warning, without a secret)."""
    key = load_secret(secret)
    if key is None:
        warn_open_group(what)
        return None, None
    return Signer(key, instance), Verifier(key)


def _mac(key: bytes, kind: bytes, signed: bytes) -> bytes:
    return hmac.new(key, _DOMAIN + kind + signed, hashlib.sha256).digest()


def _now_ms() -> int:
    return int(time.time() * 1000)


class Signer:
    """Signs one sender's messages: its instance id, a counter that only grows, the clock."""

    def __init__(self, key: bytes, instance: bytes) -> None:
        self._key, self.instance = key, instance
        self._counter = 0
        self._lock = threading.Lock()

    def _next(self) -> int:
        with self._lock:
            self._counter += 1
            return self._counter

    def beacon_tail(self, body: bytes) -> bytes:
        """What follows a v2 beacon's fields: stamp, counter and the MAC over all of it."""
        signed = body + BEACON_STAMP.pack(_now_ms(), self._next())
        return signed[len(body):] + _mac(self._key, KIND_BEACON, signed)

    def sign(self, kind: bytes, payload: bytes, nonce: bytes) -> bytes:
        """``payload`` with the signed trailer (a survey's own nonce, or the survey an answer answers)."""
        signed = payload + _TRAILER.pack(TRAILER_MAGIC, kind, self.instance, _now_ms(), self._next(), nonce)
        return signed + _mac(self._key, kind, signed)


@dataclass(frozen=True)
class Signed:
    """A verified (or, without a secret, merely parsed) survey or answer."""

    payload: bytes
    instance: bytes = b""
    nonce: bytes = b""
    signed: bool = False


def split_signed(data: bytes) -> Signed:
    """The payload of ``data`` and its trailer's fields, unchecked (for a reader without a secret)."""
    if len(data) >= TRAILER_SIZE and data[-TRAILER_SIZE:-TRAILER_SIZE + 4] == TRAILER_MAGIC:
        _, _, instance, _, _, nonce = _TRAILER.unpack_from(data, len(data) - TRAILER_SIZE)
        return Signed(data[:-TRAILER_SIZE], instance, nonce, True)
    return Signed(data)


class Verifier:
    """Checks signatures, timestamps and counters with one secret; counts drops by reason.

    The replay window: a message is taken only when its timestamp is within
    :data:`MAX_SKEW` seconds of this host's clock and its counter is greater than
    the last one taken from the same sender instance (per kind). Counters older than
    the window are forgotten: the timestamp check alone refuses their replays.
    Thread-safe (a listener thread and a socket thread share one).
    """

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._lock = threading.Lock()
        self._last: dict[bytes, dict[bytes, tuple[int, float]]] = {}  # kind -> instance -> (counter, when)
        self.dropped: dict[bytes, dict[str, int]] = {}  # kind -> reason -> count
        self.verified: dict[bytes, int] = {}

    def drops(self, kind: bytes) -> dict[str, int]:
        """Drops of one kind, by reason (every reason present, zeros included)."""
        with self._lock:
            counts = self.dropped.get(kind, {})
            return {reason: counts.get(reason, 0) for reason in REASONS}

    def drop(self, kind: bytes, reason: str, detail: str) -> Dropped:
        """Count a drop; returns the exception to raise."""
        with self._lock:
            counts = self.dropped.setdefault(kind, {})
            counts[reason] = counts.get(reason, 0) + 1
        return Dropped(reason, detail)

    def check(self, kind: bytes, instance: bytes, stamp_ms: int, counter: int, signed: bytes, mac: bytes) -> None:
        """Raise :class:`Dropped` (counted) unless the MAC, the timestamp and the counter are good."""
        self._check_mac(kind, signed, mac)
        self._check_fresh(kind, instance, stamp_ms, counter)

    def _check_mac(self, kind: bytes, signed: bytes, mac: bytes) -> None:
        if not hmac.compare_digest(mac, _mac(self._key, kind, signed)):
            raise self.drop(kind, "bad_signature", "the HMAC does not match this group's secret")

    def _check_fresh(self, kind: bytes, instance: bytes, stamp_ms: int, counter: int) -> None:
        skew = stamp_ms / 1000 - time.time()
        if abs(skew) > MAX_SKEW:
            raise self.drop(kind, "stale", f"timestamp {skew:+.1f}s from this host's clock")
        now = time.monotonic()
        with self._lock:
            seen = self._last.setdefault(kind, {})
            last = seen.get(instance)
            replayed = last is not None and counter <= last[0]
            if not replayed:
                if last is None and len(seen) >= MAX_SENDERS:
                    self._forget_old(seen, now)
                seen[instance] = (counter, now)
                self.verified[kind] = self.verified.get(kind, 0) + 1
        if replayed:
            raise self.drop(kind, "replayed", f"counter {counter} already seen from this sender")

    @staticmethod
    def _forget_old(seen: dict[bytes, tuple[int, float]], now: float) -> None:
        """Make room (lock held): counters older than the window first, else the oldest half."""
        for instance, (_, when) in list(seen.items()):
            if now - when > 2 * MAX_SKEW:
                del seen[instance]
        if len(seen) >= MAX_SENDERS:
            for instance, _ in sorted(seen.items(), key=lambda item: item[1][1])[: len(seen) // 2]:
                del seen[instance]

    def check_beacon(self, instance: bytes, body: bytes, tail: bytes) -> None:
        """Verify a v2 beacon: ``body`` is its fields, ``tail`` its stamp, counter and MAC."""
        if len(tail) != BEACON_STAMP.size + MAC_SIZE:
            raise self.drop(KIND_BEACON, "bad_signature", "the signature is truncated")
        stamp, counter = BEACON_STAMP.unpack_from(tail)
        self.check(KIND_BEACON, instance, stamp, counter, body + tail[:BEACON_STAMP.size], tail[BEACON_STAMP.size:])

    def open(self, kind: bytes, data: bytes, nonce: bytes | None = None) -> Signed:
        """Verify a signed survey or answer; ``nonce``: the survey an answer must belong to."""
        if len(data) < TRAILER_SIZE or data[-TRAILER_SIZE:-TRAILER_SIZE + 4] != TRAILER_MAGIC:
            raise self.drop(kind, "unsigned", "no signature")
        signed, mac = data[:-MAC_SIZE], data[-MAC_SIZE:]
        self._check_mac(kind, signed, mac)  # (the kind is signed too: a survey never passes as an answer)
        _, _, instance, stamp, counter, their_nonce = _TRAILER.unpack_from(data, len(data) - TRAILER_SIZE)
        if nonce is not None and not hmac.compare_digest(their_nonce, nonce):
            raise self.drop(kind, "wrong_survey", "an answer to another survey")
        self._check_fresh(kind, instance, stamp, counter)
        return Signed(data[:-TRAILER_SIZE], instance, their_nonce, True)


def drop_counts(verifier: Verifier | None, kind: bytes) -> Mapping[str, int]:
    """Zeros without a secret, else the verifier's drops of ``kind``."""
    return dict.fromkeys(REASONS, 0) if verifier is None else verifier.drops(kind)
