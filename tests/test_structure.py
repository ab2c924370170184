"""The size rules of docs/architecture.md, read from the source of nanopy/.

* No module is longer than ``MAX_LINES`` lines.
* No internal class has more than ``MAX_METHODS`` methods, counting the ones it
  inherits from nanopy classes (its own ``def``s and those of every nanopy base,
  each name once; stubs under ``if TYPE_CHECKING:`` are declarations, not methods,
  and are not counted). Bases are resolved by name through each module's imports.
* A public class (one ``nanopy.__all__`` names, such as ``Socket``) is exempt when
  it only groups its API: every method it has, inherited ones included, delegates
  -- at most ``DELEGATE_STATEMENTS`` statements besides its docstring. A public
  class whose methods do more is counted like any other.

Today's offenders are listed in ``ALLOWED`` (and ``ALLOWED_LONG``) with their count, to be split up by the
steps of issue 33. The list may only shrink: a listed class that grew fails, and
so does one that no longer needs its entry (take it off, or lower its count).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from test_layers import import_from_target

ROOT = Path(__file__).resolve().parents[1]
NANOPY = ROOT / "nanopy"

MAX_LINES = 600
MAX_METHODS = 30
DELEGATE_STATEMENTS = 3

#: classes over ``MAX_METHODS`` today, with their count: may only shrink
ALLOWED: dict[str, int] = {
}

#: modules over ``MAX_LINES`` today, with their length: may only shrink
ALLOWED_LONG: dict[str, int] = {}


@dataclass
class _Class:
    module: str
    name: str
    methods: dict[str, int] = field(default_factory=dict)  # name -> statements besides a docstring
    bases: list[str] = field(default_factory=list)  # names as written (``X`` or ``mod.X``)


def _module_name(path: Path) -> tuple[str, bool]:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return len(body)


def _class_methods(node: ast.ClassDef) -> dict[str, int]:
    found: dict[str, int] = {}
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[item.name] = _statements(item)
    return found


def _base_name(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Subscript):  # Generic[T], Protocol[T]
        expr = expr.value
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        return f"{expr.value.id}.{expr.attr}"
    return None


def _scan() -> tuple[dict[str, _Class], dict[str, dict[str, str]], dict[str, int]]:
    """Every class of nanopy (by ``module.Name``), each module's imported names
    (local name -> ``module.name``), and each module's line count."""
    classes: dict[str, _Class] = {}
    imports: dict[str, dict[str, str]] = {}
    lines: dict[str, int] = {}
    for path in sorted(NANOPY.rglob("*.py")):
        module, is_pkg = _module_name(path)
        text = path.read_text()
        lines[module] = len(text.splitlines())
        tree = ast.parse(text)
        names: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = import_from_target(module, is_pkg, node)
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{target}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    head = alias.name.split(".")[0]
                    names[alias.asname or head] = alias.name if alias.asname else head
        imports[module] = names
        for node in tree.body:
            _collect(module, node, classes)
    return classes, imports, lines


def _collect(module: str, node: ast.stmt, classes: dict[str, _Class]) -> None:
    if isinstance(node, ast.ClassDef):
        bases = [b for b in map(_base_name, node.bases) if b is not None]
        classes[f"{module}.{node.name}"] = _Class(module, node.name, _class_methods(node), bases)
    elif isinstance(node, ast.If) and not _is_type_checking(node):
        for inner in [*node.body, *node.orelse]:
            _collect(module, inner, classes)


CLASSES, IMPORTS, LINES = _scan()


def _resolve(module: str, name: str, depth: int = 0) -> str | None:
    """The ``module.Class`` key a base name written in ``module`` stands for."""
    if depth > 10:
        return None
    head, _, rest = name.partition(".")
    if not rest:
        if f"{module}.{name}" in CLASSES:
            return f"{module}.{name}"
        target = IMPORTS.get(module, {}).get(name)
        if target is None:
            return None
        if target in CLASSES:
            return target
        owner, _, attr = target.rpartition(".")
        return _resolve(owner, attr, depth + 1) if owner in IMPORTS else None
    target = IMPORTS.get(module, {}).get(head)
    if target is None:
        return None
    return _resolve(target, rest, depth + 1) if target in IMPORTS else None


def all_methods(key: str) -> dict[str, int]:
    """The methods of class ``key`` and of all its nanopy bases (the nearest definition wins)."""
    out: dict[str, int] = {}
    seen: set[str] = set()
    todo = [key]
    while todo:
        current = todo.pop(0)
        if current in seen:
            continue
        seen.add(current)
        cls = CLASSES[current]
        for name, size in cls.methods.items():
            out.setdefault(name, size)
        for base in cls.bases:
            resolved = _resolve(cls.module, base)
            if resolved is not None:
                todo.append(resolved)
    return out


def _public_names() -> set[str]:
    tree = ast.parse((NANOPY / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return {e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


PUBLIC = {_resolve("nanopy", name) for name in _public_names()} - {None}


def method_counts() -> dict[str, int]:
    """The counted classes over ``MAX_METHODS`` (public classes that only delegate left out)."""
    over: dict[str, int] = {}
    for key in CLASSES:
        methods = all_methods(key)
        if len(methods) <= MAX_METHODS:
            continue
        if key in PUBLIC and all(size <= DELEGATE_STATEMENTS for size in methods.values()):
            continue  # a public API grouped over parts that do the work
        over[key] = len(methods)
    return over


def test_no_module_over_the_line_limit() -> None:
    long = {m: n for m, n in LINES.items() if n > MAX_LINES and n > ALLOWED_LONG.get(m, 0)}
    assert not long, f"modules over {MAX_LINES} lines (split them by what they own): {long}"
    stale = {m: (n, LINES.get(m)) for m, n in ALLOWED_LONG.items() if LINES.get(m, 0) < n}
    assert not stale, f"shrunk: lower or drop their ALLOWED_LONG entries (allowed, now): {stale}"


def test_no_class_over_the_method_limit() -> None:
    over = method_counts()
    new = {k: n for k, n in over.items() if k not in ALLOWED}
    grown = {k: (ALLOWED[k], n) for k, n in over.items() if k in ALLOWED and n > ALLOWED[k]}
    assert not new, f"classes over {MAX_METHODS} methods, inherited ones counted: {new}"
    assert not grown, f"allowed classes that grew (allowed, now): {grown}"


def test_the_allow_list_only_shrinks() -> None:
    over = method_counts()
    stale = {k: (n, over.get(k)) for k, n in ALLOWED.items() if over.get(k, 0) < n}
    assert not stale, f"shrunk or fixed: lower or drop their ALLOWED entries (allowed, now): {stale}"


def test_the_counter_sees_inherited_methods() -> None:
    # the counter itself: a class and its bases resolved through imports
    assert "nanopy.pipe.driver.PipeDriver" in CLASSES
    assert "transmit" in all_methods("nanopy.pipe.driver.PipeDriver")
    assert "take_batch" in all_methods("nanopy.pipe.driver.PipeDriver")  # from Outbox
    assert "nanopy.socket.socket.Socket" in PUBLIC
    assert len(all_methods("nanopy.driver.socket_driver.SocketDriver")) > len(
        CLASSES["nanopy.driver.socket_driver.SocketDriver"].methods
    )
