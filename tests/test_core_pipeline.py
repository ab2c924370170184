"""PAIR v0 and PUSH/PULL protocol cores driven directly: no sockets, no I/O, no engine."""

from __future__ import annotations

from typing import Any

import pytest

from nanopy import Message, ProtocolError
from nanopy.core.base import CLOSE_PIPE, RESUME_READ, TRANSMIT, Core, FairQueue, LoadBalancer, PipeInfo
from nanopy.core.errors import WouldBlock
from nanopy.core.options import new_options
from nanopy.protocols.pair import Pair0
from nanopy.protocols.pipeline import Pull0, Push0


def make(cls: type[Core], **opts: Any) -> Core:
    options = new_options(cls.name)
    for key, value in opts.items():
        setattr(options, key, value)
    return cls(options)


def add(core: Core, pid: int, credit: int = 10, prio: int = 8, rprio: int = 8) -> PipeInfo:
    info = PipeInfo(pid, f"token-{pid}", prio, rprio)
    core.add_pipe(info, credit)
    return info


def drain(core: Core) -> list[tuple]:
    out = list(core.actions)
    core.actions.clear()
    return out


def sends(core: Core, bodies: list[bytes]) -> list[int]:
    """Send each body; the pipe ids the TRANSMIT actions name, in order."""
    pids = []
    for body in bodies:
        core.send(body)
        (action,) = drain(core)
        assert action[0] == TRANSMIT and action[2] == body
        pids.append(action[1])
    return pids


def recv_all(core: Core) -> list[Message]:
    out = []
    while core.can_recv():
        out.append(core.recv())
    with pytest.raises(WouldBlock):
        core.recv()
    return out


# -- identity --------------------------------------------------------------------------


def test_protocol_identities() -> None:
    assert (Push0.protocol_id, Push0.peer_id, Push0.name, Push0.peer_name) == (0x50, 0x51, "push", "pull")
    assert (Pull0.protocol_id, Pull0.peer_id, Pull0.name, Pull0.peer_name) == (0x51, 0x50, "pull", "push")
    assert (Pair0.protocol_id, Pair0.peer_id, Pair0.name, Pair0.peer_name) == (0x10, 0x10, "pair", "pair")
    assert Push0.sends and not Push0.receives
    assert Pull0.receives and not Pull0.sends


# -- PUSH --------------------------------------------------------------------------------


def test_push_without_pipes_would_block() -> None:
    push = make(Push0)
    assert not push.can_send()
    with pytest.raises(WouldBlock):
        push.send(b"x")
    assert push.actions == []


def test_push_credits_limit_and_return() -> None:
    push = make(Push0)
    add(push, 1, credit=2)
    assert push.can_send()
    assert sends(push, [b"a", b"b"]) == [1, 1]
    assert not push.can_send()
    with pytest.raises(WouldBlock):
        push.send(b"c")
    assert push.actions == []  # nothing emitted, nothing dropped
    push.pipe_credit(1, 1)
    assert push.can_send()
    assert sends(push, [b"c"]) == [1]
    assert push.dropped == 0


def test_push_pipe_added_with_no_credit_waits_for_it() -> None:
    push = make(Push0)
    add(push, 1, credit=0)
    assert not push.can_send()
    push.pipe_credit(1, 3)
    assert sends(push, [b"1", b"2", b"3"]) == [1, 1, 1]


def test_push_round_robin_over_equal_pipes() -> None:
    push = make(Push0)
    for pid in (1, 2, 3):
        add(push, pid)
    assert sends(push, [b"%d" % i for i in range(7)]) == [1, 2, 3, 1, 2, 3, 1]


def test_push_skips_pipes_without_credit() -> None:
    push = make(Push0)
    add(push, 1, credit=1)
    add(push, 2, credit=5)
    assert sends(push, [b"x"] * 4) == [1, 2, 2, 2]
    push.pipe_credit(1, 1)
    assert set(sends(push, [b"y"] * 2)) == {1, 2}


def test_push_prefers_the_higher_priority_pipe_and_falls_back_under_back_pressure() -> None:
    push = make(Push0)
    add(push, 1, credit=10, prio=8)
    add(push, 2, credit=2, prio=1)
    assert sends(push, [b"x"] * 4) == [2, 2, 1, 1]
    push.pipe_credit(2, 1)
    assert sends(push, [b"x"] * 2) == [2, 1]


def test_push_removed_pipe_is_never_used_and_its_credit_ignored() -> None:
    push = make(Push0)
    add(push, 1)
    add(push, 2)
    push.remove_pipe(1)
    assert sends(push, [b"x"] * 3) == [2, 2, 2]
    push.pipe_credit(1, 5)  # late credit for a gone pipe: ignored
    assert sends(push, [b"x"] * 2) == [2, 2]
    push.remove_pipe(2)
    push.remove_pipe(2)  # twice is harmless
    assert not push.can_send()
    with pytest.raises(WouldBlock):
        push.send(b"x")


def test_push_cannot_receive() -> None:
    push = make(Push0)
    add(push, 1)
    assert not push.can_recv()
    with pytest.raises(ProtocolError, match="PUSH"):
        push.recv()


def test_push_closes_a_peer_that_sends_data() -> None:
    push = make(Push0)
    add(push, 1)
    assert push.messages_received(1, [b"unexpected"]) is False
    assert drain(push) == [(CLOSE_PIPE, 1, "a PULL peer sent data to PUSH")]
    assert push.protocol_errors == 1


# -- PULL --------------------------------------------------------------------------------


def test_pull_queues_in_order_with_the_pipe_token() -> None:
    pull = make(Pull0)
    add(pull, 7)
    assert not pull.can_recv()
    with pytest.raises(WouldBlock):
        pull.recv()
    assert pull.messages_received(7, [b"a", b"", b"c"]) is True
    msgs = recv_all(pull)
    assert [m.body for m in msgs] == [b"a", b"", b"c"]
    assert {m.pipe for m in msgs} == {"token-7"}
    assert all(m.header == b"" for m in msgs)


def test_pull_empty_batch_is_harmless() -> None:
    pull = make(Pull0)
    add(pull, 1)
    assert pull.messages_received(1, []) is True
    assert not pull.can_recv()


def test_pull_fair_queues_between_pipes() -> None:
    pull = make(Pull0)
    add(pull, 1)
    add(pull, 2)
    pull.messages_received(1, [b"a1", b"a2", b"a3", b"a4"])
    pull.messages_received(2, [b"b1", b"b2"])
    bodies = [m.body for m in recv_all(pull)]
    assert bodies == [b"a1", b"b1", b"a2", b"b2", b"a3", b"a4"]


def test_pull_serves_a_pipe_that_became_ready_after_the_others() -> None:
    pull = make(Pull0)
    for pid in (1, 2, 3):
        add(pull, pid)
    pull.messages_received(1, [b"1a", b"1b", b"1c"])
    pull.messages_received(2, [b"2a", b"2b"])
    assert pull.recv().body == b"1a"
    pull.messages_received(3, [b"3a"])
    bodies = [m.body for m in recv_all(pull)]
    # Turn order was 2, 1 when pipe 3 became ready: it joins at the end of the turn.
    assert bodies == [b"2a", b"1b", b"3a", b"2b", b"1c"]


def test_pull_receive_priority_is_strict() -> None:
    pull = make(Pull0)
    add(pull, 1, rprio=8)
    add(pull, 2, rprio=2)
    pull.messages_received(1, [b"low1", b"low2"])
    pull.messages_received(2, [b"high1", b"high2"])
    assert [m.body for m in recv_all(pull)] == [b"high1", b"high2", b"low1", b"low2"]


def test_pull_pauses_a_full_pipe_and_resumes_at_half() -> None:
    pull = make(Pull0, recv_buffer=4)
    add(pull, 1)
    assert pull.messages_received(1, [b"1", b"2", b"3"]) is True
    assert pull.messages_received(1, [b"4"]) is False  # full: stop reading
    assert drain(pull) == []
    assert pull.recv().body == b"1"
    assert drain(pull) == []  # 3 left > 4 // 2
    assert pull.recv().body == b"2"
    assert drain(pull) == [(RESUME_READ, 1)]
    assert pull.recv().body == b"3"
    assert drain(pull) == []  # resumed once only
    assert pull.messages_received(1, [b"5"]) is True


def test_pull_pause_with_buffer_of_one() -> None:
    pull = make(Pull0, recv_buffer=1)
    add(pull, 1)
    assert pull.messages_received(1, [b"a"]) is False
    assert pull.recv().body == b"a"
    assert drain(pull) == [(RESUME_READ, 1)]


def test_pull_pause_is_per_pipe() -> None:
    pull = make(Pull0, recv_buffer=2)
    add(pull, 1)
    add(pull, 2)
    assert pull.messages_received(1, [b"a", b"b"]) is False
    assert pull.messages_received(2, [b"c"]) is True


def test_pull_keeps_what_a_removed_pipe_delivered() -> None:
    # A PUSH that sends and disconnects must not lose what PULL already has.
    pull = make(Pull0, recv_buffer=2)
    add(pull, 1)
    add(pull, 2)
    assert pull.messages_received(1, [b"a", b"b"]) is False  # paused
    pull.messages_received(2, [b"c"])
    pull.remove_pipe(1)
    assert pull.messages_received(1, [b"late"]) is False  # a gone pipe delivers nothing
    msgs = recv_all(pull)
    assert [m.body for m in msgs] == [b"a", b"c", b"b"]
    assert [m.pipe for m in msgs] == ["token-1", "token-2", "token-1"]
    assert drain(pull) == []  # no RESUME_READ for a gone pipe
    # The drained pipe is forgotten (at the next removal at the latest).
    pull.remove_pipe(2)
    assert pull.pipes == {}
    assert not pull._fq.holds(1) and not pull._fq.holds(2)


def test_pull_removed_empty_pipe_is_forgotten_at_once() -> None:
    pull = make(Pull0)
    add(pull, 1)
    pull.remove_pipe(1)
    assert pull.pipes == {} and not pull._fq.holds(1)
    pull.remove_pipe(1)  # twice is harmless


def test_pull_removed_pipe_body_only_path() -> None:
    pull = make(Pull0)
    add(pull, 1)
    pull.messages_received(1, [b"x", b"y"])
    pull.remove_pipe(1)
    assert pull.recv_body() == b"x" and pull.recv_body() == b"y"
    assert not pull.can_recv() and not pull._fq.holds(1)


def test_pull_cannot_send() -> None:
    pull = make(Pull0)
    add(pull, 1)
    assert not pull.can_send()
    with pytest.raises(ProtocolError, match="PULL"):
        pull.send(b"x")
    assert pull.actions == []


# -- PAIR v0 ------------------------------------------------------------------------------


def test_pair_first_pipe_is_the_peer_and_a_second_is_refused() -> None:
    pair = make(Pair0)
    add(pair, 1)
    assert drain(pair) == []
    add(pair, 2)
    (action,) = drain(pair)
    assert action[:2] == (CLOSE_PIPE, 2)
    assert pair.peer == 1
    # Data from the refused pipe is not delivered.
    assert pair.messages_received(2, [b"intruder"]) is False
    assert not pair.can_recv()
    # Removing the refused pipe does not disturb the peer.
    pair.remove_pipe(2)
    assert pair.peer == 1 and pair.can_send()
    assert sends(pair, [b"x"]) == [1]


def test_pair_new_peer_after_the_old_one_left() -> None:
    pair = make(Pair0)
    add(pair, 1)
    pair.messages_received(1, [b"old"])
    pair.remove_pipe(1)
    assert pair.peer is None
    assert not pair.can_send()
    with pytest.raises(WouldBlock):
        pair.send(b"x")
    add(pair, 2)
    assert drain(pair) == []
    assert sends(pair, [b"y"]) == [2]
    pair.messages_received(2, [b"new"])
    # What the old peer sent before leaving is still delivered.
    msgs = recv_all(pair)
    assert sorted((m.body, m.pipe) for m in msgs) == [(b"new", "token-2"), (b"old", "token-1")]


def test_pair_send_and_receive_with_credits() -> None:
    pair = make(Pair0)
    add(pair, 1, credit=1)
    assert sends(pair, [b"a"]) == [1]
    with pytest.raises(WouldBlock):
        pair.send(b"b")
    pair.pipe_credit(1, 1)
    assert sends(pair, [b"b"]) == [1]
    assert pair.messages_received(1, [b"r1", b"r2"]) is True
    msgs = recv_all(pair)
    assert [m.body for m in msgs] == [b"r1", b"r2"]
    assert msgs[0].pipe == "token-1"


def test_pair_pauses_when_full() -> None:
    pair = make(Pair0, recv_buffer=2)
    add(pair, 1)
    assert pair.messages_received(1, [b"a", b"b"]) is False
    pair.recv()
    assert drain(pair) == [(RESUME_READ, 1)]


def test_pair_credit_for_unknown_pipe_is_ignored() -> None:
    pair = make(Pair0)
    pair.pipe_credit(99, 4)
    assert not pair.can_send()


# -- shared parts and the base class ------------------------------------------------------


def test_base_core_refuses_user_operations() -> None:
    class Nothing(Core):
        protocol_id = peer_id = 0x7777
        name = peer_name = "nothing"

    core = make(Nothing)
    with pytest.raises(ProtocolError):
        core.send(b"x")
    with pytest.raises(ProtocolError):
        core.recv()
    assert not core.can_send() and not core.can_recv()
    core.protocol_violation(3, "bad")
    assert core.protocol_errors == 1
    assert drain(core) == [(CLOSE_PIPE, 3, "bad")]
    core.close()
    assert core.closed


def test_load_balancer_take_pipe() -> None:
    lb = LoadBalancer()
    lb.add(1, 8, 2)
    lb.add(2, 8, 1)
    assert lb.take_pipe(2) is True
    assert lb.take_pipe(2) is False  # out of credit
    assert lb.take_pipe(99) is False
    assert lb.ready() == [1]
    assert lb.take() == 1 and lb.take() == 1
    assert lb.take() is None and not lb
    lb.give(2, 1)
    assert lb.take() == 2
    lb.give(99, 1)  # unknown: ignored


def test_fair_queue_counts_and_unknown_pipe() -> None:
    opts = new_options("pull")
    actions: list[tuple] = []
    fq = FairQueue(actions, opts)
    assert fq.push(5, [Message(b"x")]) is False  # unknown pipe
    fq.add(1, 8)
    fq.push(1, [Message(b"a"), Message(b"b")])
    assert fq.queued() == 2 and fq
    assert fq.pop().body == b"a"
    fq.remove(1)
    assert fq.queued() == 0 and not fq
    with pytest.raises(WouldBlock):
        fq.pop()
