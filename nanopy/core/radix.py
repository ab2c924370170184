"""A radix tree (path-compressed trie) of byte strings for SUB topic matching.

``match(message)`` answers "is any subscribed topic a prefix of ``message``?" by
walking down the tree once, so its cost grows with the length of the message's
matching path, never with the number of subscriptions (NNG and mangos scan a
list instead).

Representation, chosen to stay compact at millions of topics and to keep the
walk short (each level costs a dict lookup and, once the tree outgrows the CPU
caches, a memory access or two):

* The root branches on the first **two** bytes at once, keyed by
  ``message[0] << 8 | message[1]``. That spares a level for every message (a
  level-compressed root, as in LC-tries); topics shorter than two bytes live in a
  small side dict ``_short`` that ``match`` consults only when it is non-empty.
  The root starts as a dict; past ``_TABLE_AT`` keys it becomes a flat list of
  65,536 slots (512 KiB), which costs one cache line per lookup instead of the
  two or three a large dict needs.
* An inner node is a ``_Node``: a ``dict`` subclass mapping the next byte (an
  ``int``) to the child, with two slots: ``prefix`` (the bytes this node adds
  after its parent's branch byte) and ``count`` (how many times exactly this
  string was subscribed; 0 if it only joins branches). Being the dict itself
  saves an object and a pointer hop per level, which matters once the tree no
  longer fits in the CPU caches.
* A leaf that was subscribed exactly once is not a node at all: the parent's
  dict maps the branch byte straight to the leaf's remaining ``bytes``. Most
  subscriptions are such leaves, so they cost one bytes object and one dict slot.

Invariants kept by ``add``/``remove`` (below the root): a node has ``count >= 1``
or at least two children (single-child, unsubscribed nodes are merged into their
child), and a node with ``count == 1`` and no children is stored as a bytes leaf.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["RadixTree"]


class _Node(dict):  # type: ignore[type-arg]
    """An inner node: the dict maps the next byte to a child ``_Node`` or leaf ``bytes``."""

    __slots__ = ("prefix", "count")

    def __init__(self, prefix: bytes, count: int) -> None:
        self.prefix = prefix
        self.count = count


class _Table(list):  # type: ignore[type-arg]
    """The root of a large tree: 65,536 slots, ``None`` where no topic starts."""

    __slots__ = ()

    get = list.__getitem__  # the dict interface the tree code uses

    def __delitem__(self, key: int) -> None:  # type: ignore[override]
        self[key] = None

    def items(self) -> Iterator[tuple[int, _Node | bytes]]:
        return ((k, v) for k, v in enumerate(self) if v is not None)


# Root keys at which the root dict turns into a _Table (the dict is then ~1/2 its size).
_TABLE_AT = 12_000


def _common(a: bytes, b: bytes, start: int) -> int:
    """Length of the common prefix of ``a`` and ``b[start:]``."""
    n = min(len(a), len(b) - start)
    i = 0
    while i < n and a[i] == b[start + i]:
        i += 1
    return i


class RadixTree:
    """A multiset of byte-string topics with a fast "any topic prefixes this?" test.

    ``add`` the same topic twice and it takes two ``remove`` calls to forget it.
    The empty topic ``b""`` is a prefix of everything. Not thread-safe: the SUB
    core calls it under its socket's lock.
    """

    __slots__ = ("_root", "_short", "_distinct", "_total")

    def __init__(self) -> None:
        self._root: dict[int, _Node | bytes] | _Table = {}  # first two bytes -> subtree
        self._short: dict[bytes, int] = {}  # topics of 0 or 1 byte -> count
        self._distinct = 0  # distinct topics
        self._total = 0  # subscriptions, counting repeats

    # -- queries -------------------------------------------------------------------
    def __len__(self) -> int:
        """The number of distinct topics."""
        return self._distinct

    @property
    def total(self) -> int:
        """The number of subscriptions, counting repeated topics once per ``add``."""
        return self._total

    def __contains__(self, topic: bytes) -> bool:
        return self.count(topic) > 0

    def match(self, message: bytes) -> bool:
        """True if some topic in the tree is a prefix of ``message``.

        ``message`` may be any bytes-like object (a transport hands ``bytes``; a
        ``bytearray`` or ``memoryview`` is matched the same way, never an error).
        """
        if message.__class__ is not bytes:
            message = bytes(message)
        short = self._short
        if short and (b"" in short or message[:1] in short):
            return True
        if len(message) < 2:
            return False
        child = self._root.get(message[0] << 8 | message[1])
        pos = 2
        while child is not None:
            if child.__class__ is bytes:
                return message.startswith(child, pos)
            prefix = child.prefix  # type: ignore[union-attr]
            if prefix:
                if not message.startswith(prefix, pos):
                    return False
                pos += len(prefix)
            if child.count:
                return True
            if pos >= len(message):
                return False
            child = child.get(message[pos])  # type: ignore[union-attr]
            pos += 1
        return False

    def count(self, topic: bytes) -> int:
        """How many times ``topic`` is currently subscribed (0 if not at all)."""
        topic = bytes(topic)
        if len(topic) < 2:
            return self._short.get(topic, 0)
        found = self._locate(topic)
        if found is None:
            return 0
        child = found[1]
        return child.count if isinstance(child, _Node) else 1  # (a leaf: once)

    def _locate(self, topic: bytes) -> tuple[list[tuple[dict[int, Any], int]], _Node | bytes] | None:
        """Where ``topic`` (2 bytes or more) ends in the tree: the (parent, key)
        steps from the root, the last holding it, and what it holds there (a node
        whose prefix ends with the topic, or a leaf, the topic's rest). None: no
        such place (the topic is not subscribed)."""
        path: list[tuple[dict[int, Any], int]] = []
        parent: dict[int, _Node | bytes] = self._root  # type: ignore[assignment]
        key = topic[0] << 8 | topic[1]
        pos = 2
        end = len(topic)
        while True:
            child = parent.get(key)
            if child is None:
                return None
            path.append((parent, key))
            if child.__class__ is bytes:
                return (path, child) if topic[pos:] == child else None
            assert isinstance(child, _Node)
            prefix = child.prefix
            if not topic.startswith(prefix, pos):
                return None
            pos += len(prefix)
            if pos == end:
                return path, child
            parent = child
            key = topic[pos]
            pos += 1

    def __iter__(self) -> Iterator[bytes]:
        """Every distinct topic (in no particular order)."""
        yield from self._short
        stack: list[tuple[bytes, _Node | bytes]] = [
            (bytes((key >> 8, key & 0xFF)), child) for key, child in self._root.items()
        ]
        while stack:
            path, node = stack.pop()
            if node.__class__ is bytes:
                yield path + node
                continue
            assert isinstance(node, _Node)
            path += node.prefix
            if node.count:
                yield path
            for byte, child in node.items():
                stack.append((path + bytes((byte,)), child))

    def items(self) -> Iterator[tuple[bytes, int]]:
        """``(topic, count)`` for every distinct topic."""
        for topic in self:
            yield topic, self.count(topic)

    # -- updates ---------------------------------------------------------------------
    def add(self, topic: bytes) -> bool:
        """Subscribe ``topic`` once more; True if it was not subscribed before."""
        topic = bytes(topic)  # stored and hashed: never a mutable buffer
        self._total += 1
        end = len(topic)
        if end < 2:
            n = self._short.get(topic, 0)
            self._short[topic] = n + 1
            if n == 0:
                self._distinct += 1
            return n == 0
        parent: dict[int, _Node | bytes] = self._root  # type: ignore[assignment]
        key = topic[0] << 8 | topic[1]
        pos = 2
        while True:
            # parent[key] holds (or will hold) the subtree for topic[pos:].
            child = parent.get(key)
            if child is None:
                parent[key] = topic[pos:]
                self._distinct += 1
                if parent.__class__ is dict and len(parent) >= _TABLE_AT and parent is self._root:
                    table = _Table([None] * (1 << 16))
                    for k, v in parent.items():
                        table[k] = v
                    self._root = table
                return True
            if child.__class__ is bytes:
                if topic[pos:] == child:
                    parent[key] = _Node(child, 2)
                    return False
                # Unfold the leaf into a node and split it below.
                child = parent[key] = _Node(child, 1)
            assert isinstance(child, _Node)
            prefix = child.prefix
            common = _common(prefix, topic, pos)
            if common < len(prefix):
                self._split(child, common)
            pos += common
            if pos == end:
                child.count += 1
                if child.count == 1:
                    self._distinct += 1
                    return True
                return False
            parent = child
            key = topic[pos]
            pos += 1

    @staticmethod
    def _split(node: _Node, at: int) -> None:
        """Cut ``node.prefix`` at ``at``: ``node`` keeps the head, a new child the rest."""
        prefix = node.prefix
        rest = prefix[at + 1 :]
        if node.count == 1 and not node:
            lower: _Node | bytes = rest
        else:
            lower = _Node(rest, node.count)
            lower.update(node)
            node.clear()
        node.prefix = prefix[:at]
        node.count = 0
        node[prefix[at]] = lower

    def remove(self, topic: bytes) -> bool:
        """Drop one subscription to ``topic``; True if that was its last one.

        Raises:
            KeyError: ``topic`` is not subscribed.
        """
        topic = bytes(topic)
        if len(topic) < 2:
            n = self._short.get(topic, 0)
            if n == 0:
                raise KeyError(topic)
            self._total -= 1
            if n == 1:
                del self._short[topic]
                self._distinct -= 1
                return True
            self._short[topic] = n - 1
            return False
        found = self._locate(topic)
        if found is None:
            raise KeyError(topic)
        path, child = found
        if child.__class__ is bytes:
            parent, key = path.pop()
            del parent[key]
            self._total -= 1
            self._distinct -= 1
            if path:
                self._tidy(parent, path)  # type: ignore[arg-type]
            return True
        assert isinstance(child, _Node)
        if child.count == 0:
            raise KeyError(topic)
        self._total -= 1
        child.count -= 1
        last = child.count == 0
        if last:
            self._distinct -= 1
        self._tidy(child, path)  # count 1 and childless: back to a bytes leaf
        return last

    @staticmethod
    def _tidy(node: _Node, path: list[tuple[dict[int, Any], int]]) -> None:
        """Restore the invariants at ``node`` (and its parent) after a removal."""
        while path:
            parent, key = path.pop()
            if node.count == 0 and not node:
                del parent[key]
                if not path:  # the parent is the root: nothing to tidy there
                    return
                node = parent  # type: ignore[assignment]  # it lost a child: check it too
                continue
            if node.count == 0 and len(node) == 1:
                ((byte, only),) = node.items()
                head = node.prefix + bytes((byte,))
                if only.__class__ is bytes:
                    parent[key] = head + only
                else:
                    only.prefix = head + only.prefix
                    parent[key] = only
            elif node.count == 1 and not node:
                parent[key] = node.prefix
            return

    def clear(self) -> None:
        """Forget every topic."""
        self._root = {}
        self._short.clear()
        self._distinct = self._total = 0
