"""The import contract of the packages (docs/architecture.md), checked on the source with ``ast``.

Every import counts, at any depth of a module: top level, inside a function, under
``TYPE_CHECKING``. ``from pkg import name`` is an import of ``pkg.name`` where that is a module and
of ``pkg`` otherwise, as Python resolves it. The layer rules hold for everything a module *reaches*:
what it imports, what those import, and so on, and the ``__init__`` of every package on the way (Python
runs it before any module of the package).

- ``router.core`` (types, errors, config, the profile format, ASGI types, paths) imports nothing
  else of ours.
- ``backends`` (workers) and ``predictor`` (estimators) import only ``router.core`` and
  ``router.state.base`` of the gateway's package.
- ``backends.sim`` (the simulated worker) stands alone: the core, itself, ``backends.listen``.
- The gateway (``router``) and the predictor never import the simulator or the bench; only the CLI
  (``router.cli``) and ``chimera serve`` (``router.serve``) may start the simulator, and only the CLI
  hands over to the bench.
- One named exception: the profiler (``backends.profiling``, `chimera profile`) is a tool outside serving,
  like the bench; its fit replays a burst through the simulator's engine, so it may import ``backends.sim``.
  Nothing serving imports the profiler (only the CLI does).
- Nothing of ours imports ``chimera_bench`` but the CLI.
- No import cycles.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("router", "backends", "predictor", "chimera_bench")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                yield sub if sub in MODULES else module


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = set()
        for target in _imports(name, path):
            # "import a.b.c" imports a.b.c; keep the longest prefix that is one of ours
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


GRAPH = _graph()


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if p in MODULES]


def _reach(module: str) -> set[str]:
    """Every module importing ``module`` runs: its imports, theirs, and each one's parent packages."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        m = todo.pop()
        for nxt in (*GRAPH[m], *_parents(m)):
            if nxt not in seen and nxt != module:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _reach_violations(sources: tuple[str, ...], allowed: tuple[str, ...]) -> list[str]:
    """Modules under ``sources`` that reach one of ours outside ``allowed`` (the top-level packages' own
    ``__init__`` files, which are empty, are always allowed)."""
    tops = {"router", "backends", "predictor", "chimera_bench"}
    return sorted(
        f"{src} reaches {dst}"
        for src in MODULES
        if _within(src, *sources)
        for dst in _reach(src)
        if dst not in tops and not _within(dst, *allowed) and not _within(dst, *sources)
    )


def _within(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _violations(sources: tuple[str, ...], allowed: tuple[str, ...], within: tuple[str, ...]) -> list[str]:
    """Imports from modules under ``sources`` of modules under ``within`` but not under ``allowed``."""
    return sorted(
        f"{src} imports {dst}"
        for src, targets in GRAPH.items()
        if _within(src, *sources)
        for dst in targets
        if _within(dst, *within) and not _within(dst, *allowed)
    )


def test_the_scan_sees_the_packages() -> None:
    assert "router.core.config" in MODULES and "backends.sim.engine" in MODULES
    caught = _violations(("router.core.config",), ("router.core.types",), ("router",))
    assert "router.core.config imports router.core.errors" in caught  # the scan would catch a wrong-way import


def test_the_core_imports_nothing_else_of_ours() -> None:
    assert _violations(("router.core",), ("router.core",), PACKAGES) == []
    assert _reach_violations(("router.core",), ("router.core",)) == []


def test_what_workers_and_predictor_reach_is_the_core_and_the_fleet_state() -> None:
    allowed = ("router.core", "router.state", "backends", "predictor")
    assert _reach_violations(("backends", "predictor"), allowed) == []
    assert _reach_violations(("router.state",), ("router.core", "router.state")) == []


def test_the_reach_sees_package_inits() -> None:
    assert "router.state" in _reach("backends.prober")  # importing router.state.base runs router/state/__init__
    assert "router.state.memory" in _reach("backends.prober")


def test_workers_and_predictor_import_only_the_core_of_the_gateway() -> None:
    allowed = ("router.core", "router.state.base")
    assert _violations(("backends", "predictor"), allowed, ("router", "chimera_bench")) == []


def test_the_simulator_stands_alone() -> None:
    allowed = ("router.core", "backends.sim", "backends.listen")
    assert _violations(("backends.sim",), allowed, PACKAGES) == []
    assert _reach_violations(("backends.sim",), allowed) == []


#: Tools outside serving that may use the simulator (docs/architecture.md): the profiler replays through its engine.
SIM_TOOLS = ("backends.profiling",)


@pytest.mark.parametrize("package", ["router", "predictor", "backends"])
def test_nothing_serving_imports_the_simulator_or_the_bench(package: str) -> None:
    starters = ("router.cli", "router.serve")
    found = [v for v in _violations((package,), ("backends.sim",), ("backends.sim", "chimera_bench"))
             if not _within(v.split()[0], "backends.sim")]  # fmt: skip
    found = [v for v in found if not (_within(v.split()[0], *SIM_TOOLS) and _within(v.split()[2], "backends.sim"))]
    found = [v for v in found if not (_within(v.split()[0], *starters) and "backends.sim" in v.split()[2])]
    found = [v for v in found if not (v.split()[0] == "router.cli" and _within(v.split()[2], "chimera_bench"))]
    assert found == []


def test_only_the_cli_imports_the_profiler() -> None:
    importers = sorted({src for src, targets in GRAPH.items() for dst in targets
                        if _within(dst, *SIM_TOOLS) and not _within(src, *SIM_TOOLS)})  # fmt: skip
    assert importers == ["router.cli"]
    assert "backends.sim.engine" in _reach("backends.profiling.fit")  # (the exception is in use)


def test_no_import_cycles() -> None:
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)
    assert [" -> ".join(c) for c in cycles] == []
