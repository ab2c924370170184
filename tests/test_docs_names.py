"""Docs that cannot go stale: every code name the docs mention exists.

Checked in docs/*.md and README.md, inside backticks:

* dotted names under ``nanopy`` (``nanopy.testing.check_transport``): imported
  and looked up attribute by attribute;
* module paths (``nanopy/driver/socket_driver.py``, ``nanopy/protocols/*.py``): files (or
  globs matching at least one file) in the repository;
* ``Class.attribute`` where ``Class`` is a class defined in nanopy
  (``SocketDriver.execute``, ``PipeDriver.transmit``): some class of that name
  has the attribute (a method, a property, a class attribute, or an instance
  attribute assigned as ``self.attribute`` in its code).

A rename that leaves a doc behind fails here, with the file and the name.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import nanopy
from nanopy.metrics.families import FAMILIES

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]

_CODE = re.compile(r"`([^`\n]+)`")
_DOTTED = re.compile(r"\bnanopy(?:\.[A-Za-z_]\w*)+")
_PATH = re.compile(r"\bnanopy/[\w/*]*(?:\.py|\*)")  # (not benchmark labels such as nanopy/trio)
# Metric names (docs/metrics.md) are dotted too: the exported families (nanopy/metrics/families.py).
_METRICS = {family.otel for family in FAMILIES}
_MEMBER = re.compile(r"^([A-Z]\w*)\.([A-Za-z_]\w*)(?:\(.*\))?$")


def _spans() -> list[tuple[str, str]]:
    """(doc file name, text inside one pair of backticks)."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        # (fenced blocks are code examples, checked by running them: tests/test_docs.py)
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        out += [(doc.name, m.group(1).strip()) for m in _CODE.finditer(text)]
    return out


def _resolve(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def _classes() -> dict[str, list[type]]:
    """Every class defined in a nanopy module (optional extras' modules that do not import are skipped)."""
    found: dict[str, list[type]] = {}
    for info in pkgutil.walk_packages(nanopy.__path__, "nanopy."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:
            continue
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and obj.__module__ == module.__name__:
                found.setdefault(name, []).append(obj)
    return found


def _instance_attributes(cls: type) -> set[str]:
    """Names assigned as ``self.name`` (or declared) in the class and its nanopy bases."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("nanopy"):
            continue
        names.update(getattr(klass, "__annotations__", {}))
        try:
            tree = ast.parse(inspect.getsource(klass))
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
    return names


def test_dotted_names_and_paths_in_the_docs_exist() -> None:
    missing = []
    for doc, span in _spans():
        for dotted in _DOTTED.findall(span):
            if dotted not in _METRICS and not _resolve(dotted):
                missing.append(f"{doc}: {dotted}")
        for path in _PATH.findall(span):
            if not (ROOT / path).exists() and not list(ROOT.glob(path)):
                missing.append(f"{doc}: {path}")
    assert not missing, "names in docs/ that do not exist:\n" + "\n".join(sorted(set(missing)))


def test_class_members_in_the_docs_exist() -> None:
    classes = _classes()
    missing = []
    for doc, span in _spans():
        match = _MEMBER.match(span)
        if match is None or match.group(1) not in classes:
            continue
        cls_name, attr = match.groups()
        if not any(hasattr(cls, attr) or attr in _instance_attributes(cls) for cls in classes[cls_name]):
            missing.append(f"{doc}: {cls_name}.{attr}")
    assert not missing, "class members in docs/ that do not exist:\n" + "\n".join(sorted(set(missing)))


@pytest.mark.parametrize("name", ["nanopy.Socket", "nanopy.testing", "nanopy.transports"])
def test_the_resolver_finds_real_names(name: str) -> None:
    assert _resolve(name)
    assert not _resolve(name + ".no_such_name")
