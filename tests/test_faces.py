"""The public faces (spark/, metrics/, discovery/, _cli/) use public or documented internal APIs only.

Read from the code (AST), every import and attribute included, at any place:

* no ``obj._private`` attribute and no ``getattr(obj, "_private")`` on anything but
  ``self``/``cls``/``super()`` (a Socket's or driver's private state above all);
* no import of nanopy.testing, and of another layer nothing but its public faces
  (PUBLIC) or a name listed in DOCUMENTED_INTERNAL, each listed in
  docs/architecture.md, "What the faces may use".

Both lists may only name what is used: an entry nothing uses fails the test too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FACES = ("spark", "metrics", "discovery", "_cli")

#: modules whose every public name a face may import (the package's documented API)
PUBLIC = {
    "nanopy", "nanopy.transports", "nanopy.protocols", "nanopy.zmtp", "nanopy.discovery",
    "nanopy.metrics", "nanopy.spark",
    "nanopy.core.errors",   # the exceptions, each re-exported by nanopy
    "nanopy.core.message",  # Message and Multipart (re-exported by nanopy and nanopy.zmtp)
    "nanopy.socket.socket",  # nanopy.Socket's home (a function-level import avoids a cycle)
}

#: (module, name) a face may import beyond PUBLIC: the documented internal APIs
DOCUMENTED_INTERNAL: dict[tuple[str, str], str] = {
    ("nanopy", "_fork"): "fork safety (process_lock, at-fork hooks) for caches and threads",
    ("nanopy", "platform"): "the OS layer: host names, address families, spawn of workers",
    ("nanopy.core.drops", "QUEUE_FULL"): "Spark hub: drop reasons, as docs/metrics.md lists them",
    ("nanopy.core.drops", "UNROUTABLE"): "Spark hub: drop reasons, as docs/metrics.md lists them",
    ("nanopy.core.stats", "GAUGE_FIELDS"): "metrics: which SocketStats fields are gauges",
    ("nanopy.core.stats", "SocketStats"): "metrics: the counters each family reads",
    ("nanopy.socket", "series"): "metrics: the registry of series (socket name, protocol)",
    ("nanopy.socket.series", "Series"): "metrics: one series' summed counters",
    ("nanopy.driver.waiters", "async_waiter"): "discovery: an event a trio or asyncio task awaits",
    ("nanopy.transports.tcp", "sockaddr_host"): "discovery: a host as a URL writes it",
    ("nanopy.transports.tcp", "ipv6_sockaddr"): "discovery: scoped IPv6 addresses",
    ("nanopy.socket.util", "ClosingContext"): "discovery: close() on leaving a with block",
    ("nanopy.socket.util", "run_in_worker_thread"): "discovery: blocking calls from trio/asyncio",
    ("nanopy.discovery.signing", "load_secret"): "CLI: a bad --secret-file is a usage error",
    ("nanopy.transports._registry", "carries_multipart"): "spark: which URLs carry ZeroMQ frames",
}

#: (module, attribute expression) of a private name that is another library's API
FOREIGN_PRIVATE: dict[tuple[str, str], str] = {
    ("nanopy.spark._coordinator", "SparkContext._active_spark_context"): "PySpark's only way to find "
    "the running context without making one",
    ("nanopy.discovery.announcer", "parts._replace"): "a namedtuple's public method",
}


def _module(path: Path) -> tuple[str, bool]:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _face_files() -> list[tuple[str, bool, str, ast.Module]]:
    found = []
    for face in FACES:
        for path in sorted((ROOT / "nanopy" / face).rglob("*.py")):
            name, is_pkg = _module(path)
            found.append((name, is_pkg, face, ast.parse(path.read_text(), str(path))))
    return found


def _imports(name: str, is_pkg: bool, tree: ast.Module) -> list[tuple[str, str]]:
    """(module, name) for each name imported (``import x.y``: (x.y, ""))."""
    package = name.split(".") if is_pkg else name.split(".")[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out += [(target, alias.name) for alias in node.names]
    return out


def _private_accesses(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, expression) of each private attribute reached on another object."""
    def private(attr: str) -> bool:
        return attr.startswith("_") and not attr.startswith("__")

    def own(value: ast.expr) -> bool:
        if isinstance(value, ast.Name) and value.id in ("self", "cls"):
            return True
        return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr) and not own(node.value):
            out.append((node.lineno, ast.unparse(node)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and private(node.args[1].value) and not own(node.args[0])):
            out.append((node.lineno, ast.unparse(node)))
    return out


FILES = _face_files()


def test_faces_touch_no_private_attribute_of_another_object() -> None:
    bad, used = [], set()
    for name, _, _, tree in FILES:
        for line, expr in _private_accesses(tree):
            if (name, expr) in FOREIGN_PRIVATE:
                used.add((name, expr))
            else:
                bad.append(f"{name}:{line}: {expr}")
    assert not bad, ("a face reaches private state; use a public API or a documented internal one "
                     "(docs/architecture.md, 'What the faces may use'):\n" + "\n".join(bad))
    assert used == set(FOREIGN_PRIVATE), f"unused, take off FOREIGN_PRIVATE: {set(FOREIGN_PRIVATE) - used}"


def test_faces_import_only_public_or_documented_internal_apis() -> None:
    bad, used = [], set()
    for name, is_pkg, face, tree in FILES:
        for target, imported in _imports(name, is_pkg, tree):
            if not (target == "nanopy" or target.startswith("nanopy.")):
                continue
            if target.startswith(f"nanopy.{face}") or (target == "nanopy" and imported == face):
                continue  # its own package
            if target.startswith("nanopy.testing") or imported == "testing":
                bad.append(f"{name} imports the testing kit ({target})")
            elif (target, imported) in DOCUMENTED_INTERNAL:
                used.add((target, imported))
            elif target not in PUBLIC or imported.startswith("_") and imported != "__version__":
                bad.append(f"{name} imports {imported or '(module)'} from {target}")
    assert not bad, ("a face imports an internal name that is not a documented internal API "
                     "(add it to DOCUMENTED_INTERNAL and docs/architecture.md, or use the public one):\n"
                     + "\n".join(bad))
    unused = set(DOCUMENTED_INTERNAL) - used
    assert not unused, f"nothing uses them any more, take them off DOCUMENTED_INTERNAL: {unused}"


def test_the_documented_internal_apis_are_listed_in_the_architecture() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert "## What the faces may use" in text
    section = text.split("## What the faces may use", 1)[1].split("\n## ", 1)[0]
    missing = [f"{module}.{name}" for module, name in DOCUMENTED_INTERNAL if f"`{name}`" not in section]
    assert not missing, f"docs/architecture.md, 'What the faces may use', does not name: {missing}"


def test_the_checks_find_what_they_look_for() -> None:
    tree = ast.parse("sock._pipes.values()\ngetattr(sock, '_engine')\nself._x\nsuper()._y()\nobj.__class__\n")
    assert sorted(expr for _, expr in _private_accesses(tree)) == ["getattr(sock, '_engine')", "sock._pipes"]
    tree = ast.parse("from ..testing import wait_pipes\nfrom .. import _fork\nimport nanopy.pipe.driver\n")
    assert _imports("nanopy.spark._sink", False, tree) == [
        ("nanopy.testing", "wait_pipes"), ("nanopy", "_fork"), ("nanopy.pipe.driver", "")]
