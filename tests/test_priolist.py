"""PrioList: nanomsg's priority list (16 priorities, round robin within one)."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanopy.core.priolist import DEFAULT_PRIORITY, NUM_PRIORITIES, PrioList


def served(pl: PrioList, n: int) -> list[object]:
    """The next ``n`` pipes in turn (current, then advance)."""
    out = []
    for _ in range(n):
        out.append(pl.current())
        pl.advance()
    return out


def test_empty() -> None:
    pl = PrioList()
    assert pl.current() is None
    assert not pl
    assert len(pl) == 0
    assert pl.active() == []
    pl.advance()  # harmless
    pl.deactivate("nobody")  # harmless
    assert pl.current() is None


def test_constants() -> None:
    assert NUM_PRIORITIES == 16
    assert DEFAULT_PRIORITY == 8


def test_round_robin_within_a_priority() -> None:
    pl = PrioList()
    for pid in (1, 2, 3):
        pl.activate(pid, 8)
    assert served(pl, 7) == [1, 2, 3, 1, 2, 3, 1]
    assert len(pl) == 3 and 2 in pl and 9 not in pl
    assert sorted(pl.active()) == [1, 2, 3]  # type: ignore[type-var]


def test_activate_twice_is_a_no_op() -> None:
    pl = PrioList()
    pl.activate(1, 8)
    pl.activate(2, 8)
    pl.activate(1, 8)
    pl.activate(1, 3)  # an active pipe keeps its priority
    assert len(pl) == 2
    assert served(pl, 4) == [1, 2, 1, 2]


def test_newly_activated_pipe_is_served_after_the_others() -> None:
    pl = PrioList()
    for pid in "abc":
        pl.activate(pid, 8)
    assert served(pl, 1) == ["a"]  # current is now b
    pl.activate("d", 8)
    assert served(pl, 4) == ["b", "c", "a", "d"]


def test_more_preferred_pipe_takes_over_at_once_and_gives_back() -> None:
    pl = PrioList()
    pl.activate("low", 9)
    pl.activate("low2", 9)
    assert pl.current() == "low"
    pl.activate("high", 2)
    assert served(pl, 3) == ["high"] * 3  # strict priority
    pl.deactivate("high")
    assert pl.current() == "low"
    pl.activate("mid", 5)
    pl.deactivate("mid")
    assert served(pl, 2) == ["low", "low2"]


def test_less_preferred_activation_does_not_take_over() -> None:
    pl = PrioList()
    pl.activate("a", 1)
    pl.activate("z", 16)
    assert served(pl, 3) == ["a", "a", "a"]


def test_deactivate_current_moves_to_the_next() -> None:
    pl = PrioList()
    for pid in (1, 2, 3, 4):
        pl.activate(pid, 8)
    pl.advance()  # current 2
    pl.deactivate(2)
    assert served(pl, 3) == [3, 4, 1]
    pl.deactivate(4)  # before nothing: current (3) keeps its turn
    assert served(pl, 3) == [3, 1, 3]


def test_deactivate_before_the_cursor_keeps_the_current() -> None:
    pl = PrioList()
    for pid in (1, 2, 3):
        pl.activate(pid, 8)
    served(pl, 2)  # current 3
    pl.deactivate(1)
    assert served(pl, 3) == [3, 2, 3]


def test_deactivate_last_of_a_slot_wraps_cursor() -> None:
    pl = PrioList()
    for pid in (1, 2, 3):
        pl.activate(pid, 8)
    served(pl, 2)  # current 3 (last position)
    pl.deactivate(3)
    assert served(pl, 3) == [1, 2, 1]


def test_emptying_the_best_slot_falls_back_to_the_next_one() -> None:
    pl = PrioList()
    pl.activate("p1", 1)
    pl.activate("p4", 4)
    pl.activate("p16", 16)
    pl.deactivate("p1")
    assert pl.current() == "p4"
    pl.deactivate("p4")
    assert pl.current() == "p16"
    pl.deactivate("p16")
    assert pl.current() is None and not pl


def test_advance_only_rotates_the_best_slot() -> None:
    pl = PrioList()
    pl.activate("a", 3)
    pl.activate("b", 3)
    pl.activate("x", 7)
    pl.activate("y", 7)
    served(pl, 3)  # a b a -> current b
    pl.deactivate("a")
    pl.deactivate("b")
    assert served(pl, 2) == ["x", "y"]  # slot 7 was never advanced


@pytest.mark.parametrize("priority", [1, 8, 16])
def test_single_pipe_any_priority(priority: int) -> None:
    pl = PrioList()
    pl.activate("only", priority)
    assert served(pl, 3) == ["only"] * 3
    pl.deactivate("only")
    assert pl.current() is None


class Model:
    """Reference model: per priority a deque whose front is the pipe to use now."""

    def __init__(self) -> None:
        self.slots: dict[int, deque[int]] = {p: deque() for p in range(1, NUM_PRIORITIES + 1)}
        self.where: dict[int, int] = {}

    def activate(self, pid: int, prio: int) -> None:
        if pid not in self.where:
            self.where[pid] = prio
            self.slots[prio].append(pid)

    def deactivate(self, pid: int) -> None:
        prio = self.where.pop(pid, None)
        if prio is not None:
            self.slots[prio].remove(pid)

    def best(self) -> deque[int] | None:
        for p in range(1, NUM_PRIORITIES + 1):
            if self.slots[p]:
                return self.slots[p]
        return None

    def current(self) -> int | None:
        slot = self.best()
        return slot[0] if slot else None

    def advance(self) -> None:
        slot = self.best()
        if slot:
            slot.rotate(-1)


ops = st.lists(
    st.tuples(
        st.sampled_from(["activate", "deactivate", "advance", "take"]),
        st.integers(min_value=0, max_value=7),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, prios=st.lists(st.integers(min_value=1, max_value=16), min_size=8, max_size=8))
def test_matches_reference_model(ops: list[tuple[str, int]], prios: list[int]) -> None:
    pl = PrioList()
    model = Model()
    for op, pid in ops:
        if op == "activate":
            pl.activate(pid, prios[pid])
            model.activate(pid, prios[pid])
        elif op == "deactivate":
            pl.deactivate(pid)
            model.deactivate(pid)
        elif op == "advance":
            pl.advance()
            model.advance()
        else:  # take: what load balancing does (use the current pipe, then advance)
            assert pl.current() == model.current()
            pl.advance()
            model.advance()
        assert pl.current() == model.current()
        assert len(pl) == len(model.where)
        assert bool(pl) == bool(model.where)
        assert sorted(pl.active()) == sorted(model.where)  # type: ignore[type-var]
