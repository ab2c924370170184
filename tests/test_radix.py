"""The radix tree against a brute-force model (a Counter of topics, prefix checks)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nanopy.core import radix as _radix
from nanopy.core.radix import RadixTree, _Node, _Table

# A small alphabet makes shared prefixes, splits and merges common.
small_bytes = st.binary(max_size=6).map(lambda b: bytes(x % 3 for x in b))
any_bytes = st.one_of(small_bytes, st.binary(max_size=40))


def brute_match(topics: Counter[bytes], message: bytes) -> bool:
    return any(message.startswith(t) for t, n in topics.items() if n > 0)


def check_shape(tree: RadixTree) -> None:
    """The structural invariants documented in nanopy/core/radix.py."""
    assert all(len(topic) < 2 and n > 0 for topic, n in tree._short.items())
    root = tree._root
    if isinstance(root, _Table):
        assert len(root) == 1 << 16
        stack = [v for v in root if v is not None]
    else:
        assert all(0 <= key < 1 << 16 for key in root)
        stack = list(root.values())
    while stack:
        node = stack.pop()
        if isinstance(node, bytes):
            continue
        assert isinstance(node, _Node)
        assert node.count >= 1 or len(node) >= 2, "unsubscribed node with fewer than two children"
        assert not (node.count == 1 and not node), "count-1 childless node not stored as a leaf"
        stack.extend(node.values())


def test_basics() -> None:
    t = RadixTree()
    assert not t.match(b"anything") and len(t) == 0
    assert t.add(b"abc") is True
    assert t.add(b"abc") is False
    assert t.count(b"abc") == 2 and len(t) == 1 and t.total == 2
    assert t.match(b"abc") and t.match(b"abcd") and not t.match(b"ab") and not t.match(b"abd")
    assert t.remove(b"abc") is False
    assert t.match(b"abcdef")
    assert t.remove(b"abc") is True
    assert not t.match(b"abcdef") and len(t) == 0 and t.total == 0
    with pytest.raises(KeyError):
        t.remove(b"abc")


def test_empty_topic_matches_everything() -> None:
    t = RadixTree()
    t.add(b"zz")
    t.add(b"")
    assert t.match(b"") and t.match(b"a") and t.match(b"\x00\xff")
    t.remove(b"")
    assert not t.match(b"a") and t.match(b"zzz")


def test_split_and_merge() -> None:
    t = RadixTree()
    for topic in (b"abcdef", b"abcxyz", b"abc", b"ab", b"abcdeg"):
        t.add(topic)
    check_shape(t)
    assert sorted(t) == sorted([b"abcdef", b"abcxyz", b"abc", b"ab", b"abcdeg"])
    for topic in (b"abc", b"abcdeg", b"ab", b"abcxyz"):
        t.remove(topic)
        check_shape(t)
    assert list(t) == [b"abcdef"]
    assert t.match(b"abcdefg") and not t.match(b"abcde")
    t.remove(b"abcdef")
    assert not t._root


def test_unknown_topics_raise_without_changing_anything() -> None:
    t = RadixTree()
    t.add(b"abcd")
    for missing in (b"", b"a", b"abc", b"abcde", b"abce", b"x"):
        with pytest.raises(KeyError):
            t.remove(missing)
    assert list(t.items()) == [(b"abcd", 1)]


@given(st.lists(any_bytes, max_size=30), st.lists(any_bytes, max_size=30))
@settings(max_examples=100, deadline=None)
def test_match_equals_brute_force(topics: list[bytes], messages: list[bytes]) -> None:
    t = RadixTree()
    for topic in topics:
        t.add(topic)
    model = Counter(topics)
    for message in messages + topics + [m + b"\x01" for m in topics]:
        assert t.match(message) == brute_match(model, message)


class RadixMachine(RuleBasedStateMachine):
    """Random subscribe/unsubscribe/match sequences against a Counter model."""

    @initialize()
    def start(self) -> None:
        self.tree = RadixTree()
        self.model: Counter[bytes] = Counter()

    @rule(topic=any_bytes)
    def add(self, topic: bytes) -> None:
        new = self.model[topic] == 0
        self.model[topic] += 1
        assert self.tree.add(topic) is new

    @precondition(lambda self: bool(+self.model))
    @rule(data=st.data())
    def remove_existing(self, data: st.DataObject) -> None:
        topic = data.draw(st.sampled_from(sorted(+self.model)))
        self.model[topic] -= 1
        assert self.tree.remove(topic) is (self.model[topic] == 0)

    @rule(topic=any_bytes)
    def remove_maybe_missing(self, topic: bytes) -> None:
        if self.model[topic] > 0:
            self.model[topic] -= 1
            assert self.tree.remove(topic) is (self.model[topic] == 0)
        else:
            with pytest.raises(KeyError):
                self.tree.remove(topic)

    @rule(message=any_bytes)
    def match(self, message: bytes) -> None:
        assert self.tree.match(message) == brute_match(self.model, message)

    @precondition(lambda self: bool(+self.model))
    @rule(data=st.data(), suffix=small_bytes)
    def match_extension(self, data: st.DataObject, suffix: bytes) -> None:
        topic = data.draw(st.sampled_from(sorted(+self.model)))
        assert self.tree.match(topic + suffix)
        if topic:
            assert self.tree.match(topic[:-1]) == brute_match(self.model, topic[:-1])

    @rule(topic=any_bytes)
    def count(self, topic: bytes) -> None:
        assert self.tree.count(topic) == self.model[topic]
        assert (topic in self.tree) == (self.model[topic] > 0)

    @invariant()
    def sizes_and_shape(self) -> None:
        live = +self.model
        assert len(self.tree) == len(live)
        assert self.tree.total == sum(live.values())
        assert sorted(self.tree) == sorted(live)
        check_shape(self.tree)


RadixMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestRadixMachine = RadixMachine.TestCase


class RadixTableMachine(RadixMachine):
    """The same, with the root switching to its flat-table form almost at once."""

    @initialize()
    def start(self) -> None:
        self.saved = _radix._TABLE_AT
        _radix._TABLE_AT = 2
        super().start()

    def teardown(self) -> None:
        _radix._TABLE_AT = self.saved


# Each step walks the 65,536-slot table: fewer examples keep this quick.
RadixTableMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
TestRadixTableMachine = RadixTableMachine.TestCase


def test_large_tree_uses_the_table_and_matches() -> None:
    import random

    rng = random.Random(7)
    topics = [rng.randbytes(rng.randint(2, 12)) for _ in range(20_000)]
    t = RadixTree()
    for topic in topics:
        t.add(topic)
    assert isinstance(t._root, _Table)
    for topic in topics[:2000]:
        assert t.match(topic + b"tail")
    misses = [rng.randbytes(16) for _ in range(2000)]
    every = tuple(topics)
    assert [t.match(m) for m in misses] == [m.startswith(every) for m in misses]
    for topic in topics:
        t.remove(topic)
    assert len(t) == 0 and t.total == 0 and not list(t)
