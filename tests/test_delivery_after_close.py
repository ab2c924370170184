"""A message that arrived before its pipe went away stays readable (issue 10, defect 3).

The sender writes, then closes normally (with linger); by the time the receiver
sees the pipe gone, everything the sender wrote has arrived. Every protocol where
the message can still be delivered must deliver it: the whole family, over every
socket-level transport.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import bind_url

import nanopy
from nanopy.testing import wait_no_pipes, wait_pipes

MakeSocket = Callable[..., nanopy.Socket]
BODIES = [b"", b"x", b"three", b"a longer message" * 100]

# (sender, receiver, raw): one-way traffic read after the sender left.
ONE_WAY = [
    ("push", "pull", False),
    ("pair", "pair", False),
    ("pair1", "pair1", False),
    ("pair1", "pair1", True),
    ("bus", "bus", False),
    ("bus", "bus", True),
    ("pub", "sub", False),
    ("req", "rep", False),  # requests: readable (the reply to a gone pipe is dropped)
    ("surveyor", "respondent", False),
]


@pytest.mark.parametrize(("sender_proto", "receiver_proto", "raw"), ONE_WAY)
def test_messages_stay_readable_after_the_sender_closes(
    make_socket: MakeSocket, transport: str, sender_proto: str, receiver_proto: str, raw: bool
) -> None:
    receiver = make_socket(receiver_proto, raw=raw, recv_timeout=5)
    if receiver_proto == "sub":
        receiver.subscribe(b"")
    url = receiver.bind(bind_url(transport)).url
    sender = make_socket(sender_proto, connect=url, linger=5)
    wait_pipes(receiver)
    wait_pipes(sender)
    bodies = BODIES[:1] if sender_proto in ("req", "surveyor") else BODIES  # one outstanding
    for body in bodies:
        sender.send(body, timeout=5)
    sender.close()  # normal close: linger flushes
    wait_no_pipes(receiver)
    got = [receiver.recv_msg(timeout=5).body for _ in bodies]
    assert got == bodies  # nothing lost, duplicated or reordered
    with pytest.raises(nanopy.Timeout):
        receiver.recv(timeout=0)


@pytest.mark.parametrize(("requester_proto", "replier_proto"), [("req", "rep"), ("surveyor", "respondent")])
def test_replies_stay_readable_after_the_replier_closes(
    make_socket: MakeSocket, transport: str, requester_proto: str, replier_proto: str
) -> None:
    requester = make_socket(requester_proto, recv_timeout=5, survey_deadline=30) if requester_proto == "surveyor" \
        else make_socket(requester_proto, recv_timeout=5)
    url = requester.bind(bind_url(transport)).url
    replier = make_socket(replier_proto, connect=url, linger=5, recv_timeout=5)
    wait_pipes(requester)
    wait_pipes(replier)
    requester.send(b"question")
    assert replier.recv() == b"question"
    replier.send(b"answer")
    replier.close()
    wait_no_pipes(requester)
    assert requester.recv() == b"answer"
