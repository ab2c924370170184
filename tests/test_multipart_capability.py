"""Multipart is a capability of the transport, not a URL prefix or a class swap (issue 33).

``Transport.carries_multipart`` says a transport's messages may have several
frames; the socket learns it per pipe when the pipe joins. A plug-in transport
that declares it (here ZMTP over TCP under a scheme without the ``zmtp+``
prefix) is treated as the built-in ZMTP ones are, and a socket's class never
changes when such a pipe joins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from conftest import wait_until

import nanopy
import nanopy.transports
from nanopy.socket.device import _frames_lost
from nanopy.testing import wait_pipes
from nanopy.transports._registry import carries_multipart
from nanopy.transports.zmtp._transport import ZmtpTcpTransport
from nanopy.zmtp import Multipart

pytestmark = pytest.mark.timeout(60)

MakeSocket = Callable[..., nanopy.Socket]
SCHEME = "frames+tcp"  # (no "zmtp+" prefix: only the capability can tell)


class FramesTransport(ZmtpTcpTransport):
    """A plug-in-style transport: ZMTP's wire under its own scheme, declaring the capability."""

    schemes = (SCHEME,)
    carries_multipart = True


@pytest.fixture
def plugin() -> Iterator[str]:
    nanopy.transports.register(SCHEME, FramesTransport)
    try:
        yield SCHEME
    finally:
        nanopy.transports.unregister(SCHEME)


def test_carries_multipart_looks_the_scheme_up_in_the_registry(plugin: str) -> None:
    assert carries_multipart("zmtp+tcp://127.0.0.1:5555")
    assert carries_multipart("zmtp+ipc:///tmp/x")
    assert carries_multipart(f"{plugin}://127.0.0.1:5555")
    assert not carries_multipart("tcp://127.0.0.1:5555")
    assert not carries_multipart("inproc://x")
    assert not carries_multipart("nosuchscheme://x")  # (bind/connect report an unknown scheme)
    assert not carries_multipart("not a url")
    assert nanopy.transports.Transport.carries_multipart is False  # the default, for plug-ins


def _pair(make_socket: MakeSocket, scheme: str) -> tuple[nanopy.Socket, nanopy.Socket]:
    pull = make_socket("pull", recv_timeout=10)
    push = make_socket("push", send_timeout=10)
    url = pull.bind(f"{scheme}://127.0.0.1:0").url
    push.connect(url)
    wait_pipes(pull)
    wait_pipes(push)
    return push, pull


@pytest.mark.parametrize("scheme", ["zmtp+tcp", SCHEME])
def test_a_declaring_transport_carries_frames_and_the_class_never_changes(
    make_socket: MakeSocket, plugin: str, scheme: str
) -> None:
    pull_class = type(make_socket("pull"))
    push, pull = _pair(make_socket, scheme)
    assert type(pull) is pull_class is nanopy.Socket and type(push) is nanopy.Socket
    # plain messages around multipart ones: runs stop before each multipart message
    sent = [[b"a"], [b"b"], [b"k", b"v"], [b"c"], [b"x", b"y", b"z"], [b"d"], [b"e"]]
    for frames in sent:
        push.send_multipart(frames) if len(frames) > 1 else push.send(frames[0])
    queue = pull._driver.core.body_queue
    wait_until(lambda: queue.queued() == len(sent), 10)  # (all queued: the receives below take runs)
    assert pull.recv() == b"a" and pull.recv() == b"b"
    for _ in range(2):  # refused, and still first in line
        with pytest.raises(nanopy.ProtocolError, match="recv_multipart"):
            pull.recv()
    assert pull.recv_multipart() == [b"k", b"v"]
    assert pull.recv() == b"c"
    with pytest.raises(nanopy.ProtocolError):
        pull.recv()
    got = pull.recv_batch(10)
    assert isinstance(got[0], Multipart) and list(got[0].parts) == [b"x", b"y", b"z"]
    while len(got) < 3:
        got += pull.recv_batch(10)
    assert got[1:] == [b"d", b"e"] and all(b.__class__ is bytes for b in got[1:])
    assert type(pull) is nanopy.Socket and type(push) is nanopy.Socket
    stats = pull.stats()
    assert stats.messages_received == len(sent)  # (the refused one counted once)


def test_a_transport_without_the_capability_refuses_multipart(make_socket: MakeSocket) -> None:
    push, _ = _pair(make_socket, "tcp")
    with pytest.raises(nanopy.ProtocolError, match="SP pipes carry one frame"):
        push.send_multipart([b"k", b"v"])
    assert type(push) is nanopy.Socket


def test_a_device_treats_a_declaring_transport_like_zmtp(make_socket: MakeSocket, plugin: str) -> None:
    """A pump from a frames-carrying socket to an SP one would lose frames: refused, as for zmtp+."""
    front = make_socket("pull", raw=True)
    back = make_socket("push", raw=True)
    front.bind(f"{plugin}://127.0.0.1:0")
    back.bind("tcp://127.0.0.1:0")
    assert "frames would be lost" in _frames_lost([(front, back)])
    back2 = make_socket("push", raw=True)
    back2.bind(f"{plugin}://127.0.0.1:0")
    assert _frames_lost([(front, back2)]) == ""
