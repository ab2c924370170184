"""A radix tree (path-compressed trie) of byte strings for SUB topic matching.

``match(message)`` answers "is any subscribed topic a prefix of ``message``?" by
walking down the tree once, so its cost grows with the length of the message's
matching path, never with the number of subscriptions (NNG and mangos scan a
list instead).

Representation, chosen to stay compact at millions of topics:

* An inner node is a ``_Node`` with three slots: ``prefix`` (the bytes this node
  adds after its parent's branch byte), ``count`` (how many times exactly this
  string was subscribed; 0 if it only joins branches) and ``children`` (a dict
  from the next byte, an ``int``, to the child, or ``None``).
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


class _Node:
    __slots__ = ("prefix", "count", "children")

    def __init__(self, prefix: bytes, count: int, children: dict[int, _Node | bytes] | None) -> None:
        self.prefix = prefix
        self.count = count
        self.children = children


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
    The empty topic ``b""`` is a prefix of everything.
    """

    __slots__ = ("_root", "_distinct", "_total")

    def __init__(self) -> None:
        self._root = _Node(b"", 0, None)
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
        while True:
            children = node.children
            if children is None or pos >= end:
                return False
            child = children.get(message[pos])
            if child is None:
                return False
            pos += 1
            if child.__class__ is bytes:
                return message.startswith(child, pos)  # type: ignore[arg-type]
            node = child  # type: ignore[assignment]
            prefix = node.prefix
            if prefix:
                if not message.startswith(prefix, pos):
                    return False
                pos += len(prefix)
            if node.count:
                return True

    def count(self, topic: bytes) -> int:
        """How many times ``topic`` is currently subscribed (0 if not at all)."""
        node = self._root
        pos = 0
        end = len(topic)
        while True:
            if pos == end:
                return node.count
            children = node.children
            if children is None:
                return 0
            child = children.get(topic[pos])
            if child is None:
                return 0
            pos += 1
            if child.__class__ is bytes:
                return 1 if topic[pos:] == child else 0
            node = child  # type: ignore[assignment]
            prefix = node.prefix
            if not topic.startswith(prefix, pos):
                return 0
            pos += len(prefix)

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
            if node.children:
                for byte, child in node.children.items():
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
            children = node.children
            if children is None:
                children = node.children = {}
            byte = topic[pos]
            child = children.get(byte)
            pos += 1
            if child is None:
                children[byte] = topic[pos:]
                self._distinct += 1
                return True
            if child.__class__ is bytes:
                if topic[pos:] == child:
                    children[byte] = _Node(child, 2, None)  # type: ignore[arg-type]
                    return False
                # Unfold the leaf into a node and split it below.
                child = children[byte] = _Node(child, 1, None)  # type: ignore[arg-type]
            assert isinstance(child, _Node)
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
        if node.count == 1 and not node.children:
            lower: _Node | bytes = rest
        else:
            lower = _Node(rest, node.count, node.children)
        node.prefix = prefix[:at]
        node.count = 0
        node.children = {prefix[at]: lower}

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
            children = node.children
            child = children.get(topic[pos]) if children else None
            if child is None:
                raise KeyError(topic)
            byte = topic[pos]
            pos += 1
            if child.__class__ is bytes:
                if topic[pos:] != child:
                    raise KeyError(topic)
                del children[byte]  # type: ignore[union-attr]
                self._gone()
                self._tidy(node, path)
                return True
            assert isinstance(child, _Node)
            prefix = child.prefix
            if end - pos < len(prefix) or not topic.startswith(prefix, pos):
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

    def _gone(self) -> None:
        self._total -= 1
        self._distinct -= 1

    def _tidy(self, node: _Node, path: list[tuple[_Node, int]]) -> None:
        """Restore the invariants at ``node`` (and its parent) after a removal."""
        while True:
            children = node.children
            if children is not None and not children:
                children = node.children = None
            if not path:  # the root stays a node
                return
            parent, byte = path.pop()
            siblings = parent.children
            assert siblings is not None
            if node.count == 0 and children is None:
                del siblings[byte]
                node = parent  # the parent lost a child: check it too
                continue
            if node.count == 0 and len(children) == 1:  # type: ignore[arg-type]
                (key, only), = children.items()  # type: ignore[union-attr]
                head = node.prefix + bytes((key,))
                if only.__class__ is bytes:
                    siblings[byte] = head + only  # type: ignore[operator]
                else:
                    only.prefix = head + only.prefix  # type: ignore[union-attr]
                    siblings[byte] = only
            elif node.count == 1 and children is None:
                siblings[byte] = node.prefix
            return

    def clear(self) -> None:
        """Forget every topic."""
        self._root = _Node(b"", 0, None)
        self._distinct = self._total = 0
