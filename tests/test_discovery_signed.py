"""Signed discovery on loopback: the formats, the replay window, secrets and key files, a
signed group among forgers, the open-group warning and the CLI's --secret-file.

Across namespaced hosts with a hostile host, see tests/test_multihost_discovery.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import re
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from test_discovery_beacon import LOOPBACK_BROADCAST, beaconing, cli_beacon_round_trip, listening, send, until

import nanopy
from nanopy.discovery import Announcer, Discovery, encode_answer, signing
from nanopy.discovery.beacon import Beacon, decode_beacon, encode_beacon
from nanopy.discovery.signing import (
    KIND_ANSWER,
    KIND_BEACON,
    KIND_SURVEY,
    MAX_SKEW,
    Dropped,
    Signer,
    Verifier,
    load_secret,
    split_signed,
)

KEY = b"correct horse battery staple 42"
WRONG = b"an attacker's guess at the key!"


@pytest.fixture
def port() -> int:
    """A UDP port nobody else uses right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "discovery.key"
    path.write_bytes(KEY + b"\n")
    path.chmod(0o600)
    return path


# -- the formats and the replay window ---------------------------------------------------------------


def test_signed_beacon_bytes_are_as_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    now = int(time.time() * 1000)
    monkeypatch.setattr(signing, "_now_ms", lambda: now)
    beacon = Beacon(bytes(range(8)), 5600, 1.0, "tcp", "prod")
    data = encode_beacon(beacon, Signer(KEY, beacon.instance))
    body = (b"SPDB" + b"\x02" + b"\x00" + b"\x15\xe0" + b"\x00\x00\x03\xe8" + bytes(range(8))
            + b"\x03tcp" + b"\x04prod" + b"\x00")
    stamped = body + struct.pack("!QQ", now, 1)
    mac = hmac.new(KEY, b"nanopy discovery v2\x00B" + stamped, hashlib.sha256).digest()
    assert data == stamped + mac
    assert len(encode_beacon(Beacon(b"i" * 8, 5600, 1.0), Signer(KEY, b"i" * 8))) == 26 + 48
    assert decode_beacon(data) == beacon  # a reader without a secret takes it unchecked
    verifier = Verifier(KEY)
    assert decode_beacon(data, verifier) == beacon
    with pytest.raises(Dropped, match="replayed"):
        decode_beacon(data, verifier)  # the same counter again
    assert verifier.drops(KIND_BEACON)["replayed"] == 1


def test_beacons_that_do_not_verify_are_dropped_by_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    verifier = Verifier(KEY)
    instance = os.urandom(8)
    good = encode_beacon(Beacon(instance, 5600, 1.0), Signer(KEY, instance))
    bye = bytearray(good)
    bye[5] |= 0x01  # the bye flag set on a real beacon: the signature no longer matches
    cases = {
        "unsigned": encode_beacon(Beacon(instance, 5600, 1.0, bye=True)),  # version 1
        "bad_signature": bytes(bye),
    }
    for reason, data in cases.items():
        with pytest.raises(Dropped, match=reason):
            decode_beacon(data, verifier)
    wrong = encode_beacon(Beacon(instance, 5600, 1.0), Signer(WRONG, instance))
    with pytest.raises(Dropped, match="bad_signature"):
        decode_beacon(wrong, verifier)
    monkeypatch.setattr(signing, "_now_ms", lambda: int((time.time() - MAX_SKEW - 1) * 1000))
    stale = encode_beacon(Beacon(instance, 5600, 1.0), Signer(KEY, instance))
    monkeypatch.undo()
    with pytest.raises(Dropped, match="stale"):
        decode_beacon(stale, verifier)
    assert decode_beacon(good, verifier).instance == instance  # none of the above hurt the real one
    assert verifier.drops(KIND_BEACON) == {"unsigned": 1, "bad_signature": 2, "stale": 1, "replayed": 0,
                                           "wrong_survey": 0}


def test_answers_are_bound_to_their_survey() -> None:
    discovery, announcer = Signer(KEY, b"d" * 8), Signer(KEY, b"a" * 8)
    verifier = Verifier(KEY)
    payload = encode_answer("echo", "tcp://192.0.2.1:7000")
    survey = discovery.sign(KIND_SURVEY, b'{"v":1,"survey":"services"}', b"n" * 16)
    opened = verifier.open(KIND_SURVEY, survey)
    assert (opened.instance, opened.nonce) == (b"d" * 8, b"n" * 16)
    answer = announcer.sign(KIND_ANSWER, payload, opened.nonce)
    assert verifier.open(KIND_ANSWER, answer, b"n" * 16).payload == payload
    with pytest.raises(Dropped, match="wrong_survey"):
        verifier.open(KIND_ANSWER, announcer.sign(KIND_ANSWER, payload, b"n" * 16), b"m" * 16)
    with pytest.raises(Dropped, match="replayed"):
        verifier.open(KIND_SURVEY, survey)  # a rogue replaying a captured survey
    with pytest.raises(Dropped, match="bad_signature"):
        verifier.open(KIND_ANSWER, survey)  # a survey never passes for an answer
    with pytest.raises(Dropped, match="unsigned"):
        verifier.open(KIND_ANSWER, payload, b"n" * 16)
    with pytest.raises(Dropped, match="bad_signature"):
        verifier.open(KIND_ANSWER, Signer(WRONG, b"x" * 8).sign(KIND_ANSWER, payload, b"n" * 16), b"n" * 16)
    assert split_signed(answer).payload == payload  # what a reader without a secret takes
    assert split_signed(payload).payload == payload


# -- secrets and key files --------------------------------------------------------------------------


def test_secrets_and_key_files(key_file: Path) -> None:
    assert load_secret(None) is None
    assert load_secret(KEY) == KEY
    assert load_secret(key_file) == KEY == load_secret(str(key_file))  # the final newline stripped
    key_file.chmod(0o640)  # a group may read it (a service's group), not write it
    assert load_secret(key_file) == KEY
    for mode in (0o644, 0o604, 0o660, 0o666):
        key_file.chmod(mode)
        with pytest.raises(ValueError, match=rf"permissions {mode:04o} .* are too open.*chmod 600"):
            load_secret(key_file)
        with pytest.raises(ValueError, match="too open"):
            Discovery("tcp://127.0.0.1:0", secret=key_file)
    with pytest.raises(ValueError, match="at least 16"):
        load_secret(b"short")
    with pytest.raises(TypeError, match="bytes or the path"):
        load_secret(1234)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="pass bytes for the secret itself"):
        load_secret("correct horse battery staple")  # a key given as str: taken for a path, and said so
    big = key_file.parent / "bundle.pem"
    big.write_bytes(b"x" * 5000)
    big.chmod(0o600)
    with pytest.raises(ValueError, match="larger than 4096 bytes"):
        load_secret(big)


def test_an_open_group_warns_once_per_process(caplog: pytest.LogCaptureFixture,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signing, "_warned_open", [])
    with caplog.at_level(logging.WARNING, logger="nanopy.discovery"):
        with Discovery("tcp://127.0.0.1:0") as disco, Announcer("echo", "tcp://192.0.2.1:7000", connect=disco.url):
            pass
        with Discovery("tcp://127.0.0.1:0", secret=KEY):
            pass
    warnings = [r for r in caplog.records if "group is open" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "docs/security.md" in warnings[0].getMessage()


# -- a signed group among forgers -----------------------------------------------------------------


@contextlib.contextmanager
def forging(url: str) -> Iterator[None]:
    """A RESPONDENT answering every survey with a priority-1 answer signed with the wrong key, but
    bound to the right survey (its nonce copied): the best forgery short of the secret."""
    signer = Signer(WRONG, b"f" * 8)
    answer = encode_answer("echo", "tcp://127.0.0.66:7000", priority=1)

    def serve() -> None:
        while True:
            try:
                msg = sock.recv_msg()
            except nanopy.Closed:
                return
            msg.reply(signer.sign(KIND_ANSWER, answer, split_signed(msg.body).nonce))

    with nanopy.Socket("respondent", connect=url) as sock:
        thread = threading.Thread(target=serve)
        thread.start()
        try:
            yield
        finally:
            sock.close()
            thread.join(5)


def test_signed_group_ignores_forgers_and_rogues(port: int) -> None:
    with beaconing(port, secret=KEY) as disco, \
            listening("echo", "tcp://0.0.0.0:7000", port, secret=KEY) as ann, \
            Announcer("echo", "tcp://127.0.0.66:7000", connect=disco.url, priority=1) as unsigned, \
            forging(disco.url), beaconing(port) as rogue, beaconing(port, secret=WRONG) as wrong_rogue:
        assert disco.resolve("echo", timeout=5.0) == "tcp://127.0.0.1:7000"
        until(lambda: disco.stats()["dropped"]["unsigned"] >= 2 and disco.stats()["dropped"]["bad_signature"] >= 2)
        until(lambda: ann.stats()["beacons_dropped"]["unsigned"] >= 2
              and ann.stats()["beacons_dropped"]["bad_signature"] >= 2)
        assert [disco.resolve("echo") for _ in range(20)] == ["tcp://127.0.0.1:7000"] * 20
        assert disco.services() == {"echo": ["tcp://127.0.0.1:7000"]}
        assert unsigned.answered >= 2  # it did answer: the answers were dropped
        assert ann.discoveries == [disco.url]  # the rogues were never dialled...
        assert rogue.services() == wrong_rogue.services() == {}  # ...so they learned nothing
        stats = ann.stats()
        assert stats["signed"] and stats["discoveries"] == 1 and stats["surveys_dropped"]["unsigned"] == 0


def test_signed_announcer_answers_no_unsigned_surveyor(port: int) -> None:
    """A rogue surveyor the announcer dials anyway (connect=) learns nothing; the drops are counted."""
    with Discovery("tcp://127.0.0.1:0", interval=0.1) as rogue, \
            Discovery("tcp://127.0.0.1:0", interval=0.1, secret=WRONG) as wrong_rogue, \
            Announcer("echo", "tcp://192.0.2.1:7000", connect=[rogue.url, wrong_rogue.url], secret=KEY) as ann:
        until(lambda: ann.stats()["surveys_dropped"]["unsigned"] >= 3
              and ann.stats()["surveys_dropped"]["bad_signature"] >= 3)
        assert ann.answered == 0
        assert rogue.services() == wrong_rogue.services() == {}
        assert rogue.stats()["answers"] == wrong_rogue.stats()["answers"] == 0


def test_a_spoofed_bye_delists_nothing_in_a_signed_group(port: int) -> None:
    with beaconing(port, secret=KEY) as disco, listening("echo", "tcp://0.0.0.0:7000", port, secret=KEY) as ann:
        until(lambda: ann.discoveries == [disco.url])
        assert disco._beacon is not None
        instance = disco._beacon.beacon.instance  # an attacker reads it from any beacon
        forged = encode_beacon(replace(disco._beacon.beacon, bye=True), Signer(WRONG, instance))
        send(port, *[encode_beacon(Beacon(instance, 1, 1.0, bye=True))] * 50, *[forged] * 50)
        until(lambda: sum(ann.stats()["beacons_dropped"].values()) >= 100)
        assert ann.discoveries == [disco.url]


def test_the_real_bye_is_honoured(port: int) -> None:
    with listening("echo", "tcp://0.0.0.0:7000", port, secret=KEY) as ann:
        disco = beaconing(port, secret=KEY, interval=5.0)  # silence alone would take 15 s
        until(lambda: ann.discoveries == [disco.url])
        disco.close()
        until(lambda: ann.discoveries == [], timeout=3.0)


def test_open_group_takes_a_forged_answer_as_documented(port: int) -> None:
    """Without a secret, docs/security.md says a forged priority-1 answer wins: it does."""
    with Discovery("tcp://127.0.0.1:0", interval=0.2) as disco, \
            Announcer("echo", "tcp://127.0.0.1:7000", connect=disco.url), \
            Announcer("echo", "tcp://127.0.0.66:7000", connect=disco.url, priority=1):
        until(lambda: len(disco.services().get("echo", [])) == 2)
        assert {disco.resolve("echo") for _ in range(10)} == {"tcp://127.0.0.66:7000"}


# -- the command line ----------------------------------------------------------------------------------


def test_cli_secret_file(port: int, key_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from nanopy._cli.discover import discover_main

    with Announcer("old", "tcp://192.0.2.1:80", beacon=True, beacon_port=port, group="cli",
                   beacon_bind=LOOPBACK_BROADCAST):  # no secret: follows, answers, is dropped
        (status,), err = cli_beacon_round_trip(port, capsys, "--secret-file", str(key_file))
    assert status.rstrip().endswith("(signed)")  # (and no open-group warning before it)
    assert re.search(r"nanopy discover: dropped answers that did not verify: unsigned \d+$", err.strip())
    key_file.chmod(0o644)
    with pytest.raises(SystemExit) as exit_:
        discover_main(["--bind", "tcp://127.0.0.1:0", "--secret-file", str(key_file)])
    assert exit_.value.code == 2
    assert "--secret-file: permissions 0644" in capsys.readouterr().err


def test_a_relayed_beacon_heard_first_is_outgrown(port: int) -> None:
    """An announcer that hears a real beacon first from another address (a relay) dials there,
    gets no signed survey, and redials at the real beacons' address after about two intervals."""
    with beaconing(port, secret=KEY, interval=0.5) as disco:
        assert disco._beacon is not None and disco._signer is not None
        until(lambda: disco.beacons_sent >= 1)  # the first beacon is gone, unheard; the next in 0.5 s
        relayed = encode_beacon(disco._beacon.beacon, disco._signer)  # newer than any beacon sent so far
        with listening("echo", "tcp://192.0.2.1:7000", port, secret=KEY) as ann, \
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as relay:
            relay.bind(("127.0.0.2", 0))
            relay.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
            relay.sendto(relayed, (LOOPBACK_BROADCAST, port))
            until(lambda: ann.discoveries != [])
            assert ann.discoveries == [disco.url.replace("127.0.0.1", "127.0.0.2")]
            until(lambda: ann.discoveries == [disco.url], timeout=5.0)
            assert ann.stats()["redialled"] == 1
            assert disco.resolve("echo", timeout=5.0) == "tcp://192.0.2.1:7000"


def test_copies_of_one_round_are_no_replays(port: int) -> None:
    """A beacon round sent to two targets that one announcer hears both of (IPv4 and IPv6, two
    interfaces on one LAN): each copy is signed on its own, so no drop is counted."""
    with Discovery("tcp://127.0.0.1:0", interval=0.1, beacon=True, beacon_port=port,
                   beacon_to=[LOOPBACK_BROADCAST, LOOPBACK_BROADCAST], secret=KEY) as disco, \
            listening("echo", "tcp://192.0.2.1:7000", port, secret=KEY) as ann:
        until(lambda: ann.beacons_heard >= 6)
        assert disco.beacons_sent >= 6
        assert ann.stats()["beacons_dropped"] == dict.fromkeys(signing.REASONS, 0)
        assert ann.discoveries == [disco.url]


def test_a_mixed_group_shows_in_the_counters(port: int) -> None:
    """One side without the secret: nothing is listed, and the counters say why."""
    with beaconing(port, secret=KEY) as signed_disco, listening("old", "tcp://192.0.2.1:7000", port) as unsigned:
        until(lambda: unsigned.discoveries == [signed_disco.url])  # v2 beacons read, unchecked...
        until(lambda: signed_disco.stats()["dropped"]["unsigned"] >= 1)  # ...its answers dropped
        assert signed_disco.services() == {}
    with beaconing(port) as unsigned_disco, listening("new", "tcp://192.0.2.1:7000", port, secret=KEY) as signed:
        until(lambda: signed.stats()["beacons_dropped"]["unsigned"] >= 2)  # v1 beacons: not followed
        assert signed.discoveries == [] and unsigned_disco.services() == {}
