"""A radix tree (path-compressed trie) of byte strings for SUB topic matching.

``match(message)`` answers "is any subscribed topic a prefix of ``message``?" by
walking down the tree once, so its cost grows with the length of the message's
matching path, never with the number of subscriptions (NNG and mangos scan a
list instead).

Representation, chosen to stay compact at millions of topics:

* An inner node is a ``_Node``: a ``dict`` subclass mapping the next byte (an
  ``int``) to the child, with two slots: ``prefix`` (the bytes this node adds
  after its parent's branch byte) and ``count`` (how many times exactly this
  string was subscribed; 0 if it only joins branches). Being the dict itself
  saves an object and a pointer hop per level, which matters once the tree no
  longer fits in the CPU caches.
* A leaf that was subscribed exactly once is not a node at all: the parent's
  dict maps the branch byte straight to the leaf's remaining ``bytes``. Most
  subscriptions are such leaves, so they cost one bytes object and one dict slot.

Invariants kept by ``add``/``remove`` (besides the root, which is always a node):
a node has ``count >= 1`` or at least two children (single-child, unsubscribed
nodes are merged into their child), and a node with ``count == 1`` and no
children is stored as a bytes leaf.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["RadixTree"]


class _Node(dict):  # type: ignore[type-arg]
    """An inner node: the dict maps the next byte to a child ``_Node`` or leaf ``bytes``."""

    __slots__ = ("prefix", "count")

    def __init__(self, prefix: bytes, count: int) -> None:
        self.prefix = prefix
        self.count = count


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

    __slots__ = ("_root", "_distinct", "_total")

    def __init__(self) -> None:
        self._root = _Node(b"", 0)
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
        """True if some topic in the tree is a prefix of ``message``."""
        node = self._root
        if node.count:
            return True
        pos = 0
        end = len(message)
        while pos < end:
            child = node.get(message[pos])
            if child is None:
                return False
            pos += 1
            if child.__class__ is bytes:
                return message.startswith(child, pos)
            node = child
            prefix = node.prefix
            if prefix:
                if not message.startswith(prefix, pos):
                    return False
                pos += len(prefix)
            if node.count:
                return True
        return False

    def count(self, topic: bytes) -> int:
        """How many times ``topic`` is currently subscribed (0 if not at all)."""
        node = self._root
        pos = 0
        end = len(topic)
        while pos < end:
            child = node.get(topic[pos])
            if child is None:
                return 0
            pos += 1
            if child.__class__ is bytes:
                return 1 if topic[pos:] == child else 0
            node = child
            prefix = node.prefix
            if not topic.startswith(prefix, pos):
                return 0
            pos += len(prefix)
        return node.count

    def __iter__(self) -> Iterator[bytes]:
        """Every distinct topic (in no particular order)."""
        stack: list[tuple[bytes, _Node | bytes]] = [(b"", self._root)]
        while stack:
            path, node = stack.pop()
            if node.__class__ is bytes:
                yield path + node  # type: ignore[operator]
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
        self._total += 1
        node = self._root
        pos = 0
        end = len(topic)
        while True:
            # Here topic[:pos] spells the path down to and including node.prefix.
            if pos == end:
                node.count += 1
                if node.count == 1:
                    self._distinct += 1
                    return True
                return False
            byte = topic[pos]
            child = node.get(byte)
            pos += 1
            if child is None:
                node[byte] = topic[pos:]
                self._distinct += 1
                return True
            if child.__class__ is bytes:
                if topic[pos:] == child:
                    node[byte] = _Node(child, 2)
                    return False
                # Unfold the leaf into a node and split it below.
                child = node[byte] = _Node(child, 1)
            prefix = child.prefix
            common = _common(prefix, topic, pos)
            if common < len(prefix):
                self._split(child, common)
            node = child
            pos += common

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
        path: list[tuple[_Node, int]] = []  # (parent, branch byte) down to node
        node = self._root
        pos = 0
        end = len(topic)
        while pos < end:
            byte = topic[pos]
            child = node.get(byte)
            if child is None:
                raise KeyError(topic)
            pos += 1
            if child.__class__ is bytes:
                if topic[pos:] != child:
                    raise KeyError(topic)
                del node[byte]
                self._total -= 1
                self._distinct -= 1
                self._tidy(node, path)
                return True
            prefix = child.prefix
            if not topic.startswith(prefix, pos):
                raise KeyError(topic)
            path.append((node, byte))
            node = child
            pos += len(prefix)
        if node.count == 0:
            raise KeyError(topic)
        self._total -= 1
        node.count -= 1
        last = node.count == 0
        if last:
            self._distinct -= 1
        self._tidy(node, path)  # count 1 and childless: back to a bytes leaf
        return last

    @staticmethod
    def _tidy(node: _Node, path: list[tuple[_Node, int]]) -> None:
        """Restore the invariants at ``node`` (and its parent) after a removal."""
        while path:  # the root always stays a node
            parent, byte = path.pop()
            if node.count == 0 and not node:
                del parent[byte]
                node = parent  # the parent lost a child: check it too
                continue
            if node.count == 0 and len(node) == 1:
                ((key, only),) = node.items()
                head = node.prefix + bytes((key,))
                if only.__class__ is bytes:
                    parent[byte] = head + only
                else:
                    only.prefix = head + only.prefix
                    parent[byte] = only
            elif node.count == 1 and not node:
                parent[byte] = node.prefix
            return

    def clear(self) -> None:
        """Forget every topic."""
        self._root = _Node(b"", 0)
        self._distinct = self._total = 0
