"""The layering, read from the source: imports run one way and never in a circle.

cli -> evaluate -> backends -> engine -> model -> positional; tasks know no model,
the engine knows no task, results know no torch. Every ``import`` statement counts,
including those inside functions (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import bamctl

PACKAGE = Path(bamctl.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    """Every module name ``module`` imports (bamctl's and others'), as written."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                names.add(full if full in MODULES else base)
    return names


def _graph() -> dict[str, set[str]]:
    graph = {}
    for module in MODULES:
        targets = {_resolve(n) for n in _imports(module) if n.split(".")[0] == "bamctl"}
        graph[module] = {t for t in targets if t and t != module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_inside_bamctl():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {**_graph(), "bamctl.errors": {"bamctl.cli"}}  # errors -> cli -> ... -> errors
    assert any("bamctl.errors" in c for c in _cycles(graph))


def _reaches(start: str, graph: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph[todo.pop()]:
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def _under(prefix: str) -> list[str]:
    return [m for m in MODULES if m == prefix or m.startswith(prefix + ".")]


def test_layers_point_one_way():
    graph = _graph()
    forbidden = {
        "bamctl.backends.base": lambda t: t not in ("bamctl.errors",),
        "bamctl.devices": lambda t: t not in ("bamctl.errors",),
        "bamctl.engine": lambda t: t.startswith(("bamctl.backends", "bamctl.evaluate", "bamctl.cli", "bamctl.tasks", "bamctl.results", "bamctl.train")),
        "bamctl.model": lambda t: t.startswith(("bamctl.backends", "bamctl.evaluate", "bamctl.cli", "bamctl.tasks", "bamctl.engine.stream")),
        "bamctl.tasks": lambda t: t.startswith(("bamctl.backends", "bamctl.evaluate", "bamctl.cli", "bamctl.engine", "bamctl.model", "bamctl.results", "bamctl.train")),
        "bamctl.results": lambda t: t.startswith(("bamctl.backends", "bamctl.evaluate", "bamctl.cli", "bamctl.engine", "bamctl.model", "bamctl.train")),
        "bamctl.backends": lambda t: t.startswith(("bamctl.evaluate", "bamctl.cli", "bamctl.results")),
    }
    wrong = []
    for layer, bad in forbidden.items():
        for module in _under(layer):
            wrong += [f"{module} -> {t}" for t in sorted(graph[module]) if bad(t)]
    assert wrong == []


def test_results_know_no_torch():
    for module in _under("bamctl.results"):
        assert not any(n.split(".")[0] == "torch" for n in _imports(module)), module


def test_every_back_end_reaches_the_engine_only_through_its_own_module():
    """External back-ends (hf, vllm) never import the native engine, even for a result type."""
    graph = _graph()
    for module in ("bamctl.backends.hf", "bamctl.backends.vllm", "bamctl.backends.hf_common"):
        assert not any(t.startswith("bamctl.engine") for t in _reaches(module, graph)), module
