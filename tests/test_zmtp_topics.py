"""A ZMTP publisher pipe's subscriptions (``TopicFilter``) match as the core's radix tree does.

The transport keeps its own small matcher (a transport imports nothing of the
core but its codec, messages and errors); it must answer every question the
publisher asks exactly as nanopy.core.radix.RadixTree would.
"""

from __future__ import annotations

import random

import pytest

from nanopy.core.radix import RadixTree
from nanopy.transports.zmtp._roles import TopicFilter


def test_a_topic_is_counted_per_subscription() -> None:
    topics = TopicFilter()
    topics.add(b"ab")
    topics.add(b"ab")
    topics.remove(b"ab")
    assert b"ab" in topics and topics.match(b"abc")
    topics.remove(b"ab")
    assert b"ab" not in topics and not topics and not topics.match(b"abc")
    with pytest.raises(KeyError):
        topics.remove(b"ab")


def test_matches_as_the_radix_tree_does() -> None:
    rng = random.Random(33)
    mine, tree = TopicFilter(), RadixTree()
    alphabet = b"ab\x00"
    for _ in range(3000):
        topic = bytes(rng.choice(alphabet) for _ in range(rng.randrange(5)))
        if rng.random() < 0.6:
            mine.add(topic)
            tree.add(topic)
        elif topic in tree:
            mine.remove(topic)
            tree.remove(topic)
        frame = bytes(rng.choice(alphabet) for _ in range(rng.randrange(7)))
        assert mine.match(frame) == tree.match(frame), (frame, sorted(tree))
        assert len(mine) == len(tree) and (b"" in mine) == (b"" in tree)
