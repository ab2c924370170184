"""The layer rules of docs/architecture.md, read from every import in nanopy/.

Every ``import`` and ``from ... import`` counts: at module level, under
``if TYPE_CHECKING:`` and inside functions. A layer is a subpackage of nanopy
(``nanopy.core``, ``nanopy.pipe``, ...; ``nanopy.transports.zmtp`` is one of its
own) or a module at the root (``nanopy._fork``).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NANOPY = ROOT / "nanopy"

#: what each layer may import of nanopy besides itself (None: no rule beyond "no cycle")
MAY_IMPORT: dict[str, set[str] | None] = {
    # Sans-I/O: protocol core bases, queues, the SP codec, messages, errors, options, stats
    "core": set(),
    "protocols": {"core", "_plugins"},
    # the OS-specific operations (nanopy/platform): nothing of nanopy
    "platform": set(),
    # the process-wide leaves: nothing of nanopy but the platform
    "_fork": {"platform"},
    "_plugins": {"_fork"},
    "engine": {"_fork", "platform"},
    # the pipe side sees the socket side only through the seam
    "pipe": {"core", "engine", "transports", "_fork", "platform", "_seam"},
    "driver": {"core", "engine", "transports", "platform", "_seam"},
    "_seam": {"core"},
}

#: the modules of ``core`` a transport may use: the wire codec, messages, errors
TRANSPORT_MAY_USE = {"nanopy.core.wire", "nanopy.core.message", "nanopy.core.errors"}
#: the layers a transport may use whole: its own, the platform layer and fork safety
TRANSPORT_MAY_USE_LAYERS = ("transports", "transports.zmtp", "_fork", "platform")
#: the transport modules that are the registry's face, not a transport
TRANSPORT_REGISTRY = {"nanopy.transports", "nanopy.transports._registry"}

#: imports that break a rule above, each to be removed by the issue-33 step named
#: (the list may only shrink: a listed import that is gone fails the test too)
KNOWN_BREACHES: dict[tuple[str, str], str] = {
}

#: the most private modules the package root may hold
MAX_ROOT_PRIVATE = 15


def _module_name(path: Path) -> tuple[str, bool]:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for path in sorted(NANOPY.rglob("*.py")):
        name, is_pkg = _module_name(path)
        found[name] = (path, is_pkg)
    return found


MODULES = _modules()


def import_from_target(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` in ``module`` names (relative ones resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _imports(name: str, path: Path, is_pkg: bool) -> set[str]:
    """Every nanopy module ``name`` imports, at any place in its code."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            target = import_from_target(name, is_pkg, node)
            if not (target == "nanopy" or target.startswith("nanopy.")):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in MODULES else target)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("nanopy.")}
    out.discard(name)
    return out


def _breaches_tolerated(module: str, target: str) -> bool:
    return (module, target) in KNOWN_BREACHES


GRAPH = {name: _imports(name, path, is_pkg) for name, (path, is_pkg) in MODULES.items()}


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "nanopy"
    if parts[1] == "transports" and len(parts) > 2 and parts[2] == "zmtp":
        return "transports.zmtp"
    return parts[1]


def _layer_edges() -> dict[str, dict[str, list[str]]]:
    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for module, targets in GRAPH.items():
        for target in targets:
            a, b = layer_of(module), layer_of(target)
            if a != b and not _breaches_tolerated(module, target):
                edges[a][b].append(f"{module} -> {target}")
    return edges


def test_no_import_cycle_between_layers() -> None:
    edges = _layer_edges()
    # "nanopy" (the package's face) may import anything; nothing below imports it back
    # but the faces that need its version (metrics) or its names (the CLI)
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, {})):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                detail = "; ".join(edges[a][b][0] for a, b in zip(cycle, cycle[1:]))
                raise AssertionError(f"import cycle between layers: {' -> '.join(cycle)} ({detail})")
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


def test_each_layer_imports_only_what_it_may() -> None:
    bad = []
    for a, targets in _layer_edges().items():
        allowed = MAY_IMPORT.get(a)
        if allowed is None:
            continue
        for b, where in targets.items():
            if b not in allowed:
                bad.append(f"{a} may not import {b}: {where[0]}")
    assert not bad, "\n".join(bad)


def test_transports_use_only_the_codec_errors_and_their_base() -> None:
    bad = []
    for module, targets in GRAPH.items():
        if layer_of(module) not in ("transports", "transports.zmtp") or module in TRANSPORT_REGISTRY:
            continue
        for target in targets:
            if layer_of(target) in TRANSPORT_MAY_USE_LAYERS or target in TRANSPORT_MAY_USE:
                continue
            if _breaches_tolerated(module, target):
                continue
            bad.append(f"{module} imports {target}")
    assert not bad, ("a transport may import only nanopy.core's wire codec, messages and errors (and the "
                     "platform, _fork):\n" + "\n".join(bad))


def test_no_library_module_imports_the_testing_kit() -> None:
    users = [m for m, targets in GRAPH.items() if layer_of(m) != "testing"
             and any(layer_of(t) == "testing" and not _breaches_tolerated(m, t) for t in targets)]
    assert not users, f"library code must not import nanopy.testing: {users}"


def test_the_root_holds_few_private_modules() -> None:
    private = sorted(p.name for p in NANOPY.glob("_*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(private) <= MAX_ROOT_PRIVATE, f"{len(private)} private modules at nanopy/'s root: {private}"


def test_every_known_breach_is_still_there() -> None:
    gone = [pair for pair in KNOWN_BREACHES if pair[1] not in GRAPH.get(pair[0], set())]
    assert not gone, f"fixed: take them off KNOWN_BREACHES: {gone}"


# -- the seam: socket-side code never writes a pipe's fields ---------------------------------

#: annotations that make a parameter or local a pipe (or a part of one)
PIPE_TYPES = ("PipeDriver", "PipeHandle", "PipeT", "ReadRole", "PipeReader")
#: attributes whose value is a pipe (``driver.lane``) or a collection of pipes
PIPE_ATTRS = {"lane"}
PIPES_ATTRS = {"pipes", "_pipes", "_fan_pipes", "_flush_pipes", "pipe_drivers"}
#: a pipe's parts: ``pipe.reader.paused = ...`` writes the pipe as much as ``pipe.x = ...``
PIPE_PARTS = {"reader", "resend", "liveness"}
#: writes of a pipe's field by socket-side code still to move behind the seam (may only shrink)
KNOWN_PIPE_WRITES: dict[tuple[str, str], str] = {}


def _mentions_pipes(expr: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr in PIPES_ATTRS for n in ast.walk(expr))


def _is_pipe(expr: ast.AST, names: set[str]) -> bool:
    """Whether ``expr`` stands for a pipe or a part of one, given the pipe-bound ``names``."""
    if isinstance(expr, ast.Name):
        return expr.id in names
    if isinstance(expr, ast.Attribute):
        return expr.attr in PIPE_ATTRS or (expr.attr in PIPE_PARTS and _is_pipe(expr.value, names))
    if isinstance(expr, ast.Subscript):  # self.pipes[pid]
        return _mentions_pipes(expr.value)
    if isinstance(expr, ast.Call):
        func = expr.func
        if isinstance(func, ast.Name):
            return func.id == "PipeDriver"
        if isinstance(func, ast.Attribute) and func.attr in ("get", "pop"):  # self.pipes.get(pid)
            return _mentions_pipes(func.value)
    return False


def _pipe_names(fn: ast.AST, by_name: bool) -> set[str]:
    """The local names of ``fn`` bound to pipes (``by_name``: ``pipe`` always is one)."""
    names = {"pipe"} if by_name else set()
    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = fn.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            if arg.annotation is not None and any(t in ast.unparse(arg.annotation) for t in PIPE_TYPES):
                names.add(arg.arg)
    for _ in range(3):  # (a name bound from another: to a fixpoint, in practice)
        for node in ast.walk(fn):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign) and _is_pipe(node.value, names):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign) and (
                any(t in ast.unparse(node.annotation) for t in PIPE_TYPES)
                or (node.value is not None and _is_pipe(node.value, names))
            ):
                targets = [node.target]
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) and _mentions_pipes(node.iter):
                targets = [node.target]
            for target in targets:
                names |= _bound_names(target)
    return names


def _bound_names(target: ast.expr) -> set[str]:
    """The plain names an assignment target binds (``a``, ``a, b``; not ``self.x``)."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*map(_bound_names, target.elts))
    if isinstance(target, ast.Starred):
        return _bound_names(target.value)
    return set()


def pipe_writes(module: str, tree: ast.AST) -> list[str]:
    """``module:line name.field`` of each assignment to a field of a pipe (or of one
    of its parts) in ``tree``, one function at a time."""
    found = []
    by_name = layer_of(module) == "driver"  # (in socket/, ``pipe`` may be the public Pipe)
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        names = _pipe_names(fn, by_name)
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            else:
                continue
            for target in targets:
                for attr in ast.walk(target):
                    if not (isinstance(attr, ast.Attribute) and isinstance(attr.ctx, ast.Store)):
                        continue
                    if _is_pipe(attr.value, names):
                        found.append(f"{module}:{node.lineno} {ast.unparse(attr)}")
    return sorted(set(found))


def test_the_pipe_write_scan_finds_writes() -> None:
    code = (
        "def f(self, pipe, other: PipeHandle):\n"
        "    pipe.closed = True\n"
        "    pipe.resend.due = True\n"
        "    other.lane_credit += 1\n"
        "    p = self.pipes.get(1)\n"
        "    p.reader.paused = True\n"
        "    self.lane.lane_bytes = 0\n"
        "    for q in self._driver.pipe_drivers():\n"
        "        q.withdrawn = True\n"
        "    self.pipes[1].rx_msgs = 0\n"
        "    self.sent = 1\n"  # (the socket's own fields: fine)
        "    pipe.grant_lane(1)\n"
    )
    found = sorted(w.split(" ", 1)[1] for w in pipe_writes("nanopy.driver.x", ast.parse(code)))
    assert found == sorted(["pipe.closed", "pipe.resend.due", "other.lane_credit", "p.reader.paused",
                            "self.lane.lane_bytes", "q.withdrawn", "self.pipes[1].rx_msgs"])


def test_socket_side_code_writes_no_pipe_field() -> None:
    found = []
    for module, (path, _) in MODULES.items():
        if layer_of(module) not in ("driver", "socket"):
            continue
        for write in pipe_writes(module, ast.parse(path.read_text())):
            where, what = write.split(" ", 1)
            if (module, what) not in KNOWN_PIPE_WRITES:
                found.append(write)
    assert not found, ("socket-side code changes a pipe only through its calls (PipeHandle, "
                       "nanopy/_seam.py):\n" + "\n".join(found))


def test_every_known_pipe_write_is_still_there() -> None:
    found = {(m, w.split(" ", 1)[1]) for m, (p, _) in MODULES.items() if layer_of(m) in ("driver", "socket")
             for w in pipe_writes(m, ast.parse(p.read_text()))}
    gone = [pair for pair in KNOWN_PIPE_WRITES if pair not in found]
    assert not gone, f"fixed: take them off KNOWN_PIPE_WRITES: {gone}"
