"""The layering, read from the source: imports run one way and never in a circle.

The layers are ARCHITECTURE.md's ``layers`` block, read here: each part may import the
parts its line names and, through them, everything further down; every part of the
package is in the block. Every ``import`` statement counts, including those inside
functions (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import bamctl

PACKAGE = Path(bamctl.__file__).parent
ARCHITECTURE = PACKAGE.parent / "ARCHITECTURE.md"


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


def _declared_layers() -> dict[str, set[str]]:
    """ARCHITECTURE.md's ``layers`` block: part -> the parts it may import directly."""
    block = re.search(r"^```layers\n(.*?)^```", ARCHITECTURE.read_text(encoding="utf-8"), re.S | re.M)
    assert block, "ARCHITECTURE.md has no ```layers block"
    declared = {}
    for line in block.group(1).splitlines():
        part, _, below = line.partition("->")
        assert part.split() and part.strip() not in declared, line
        declared[part.strip()] = set(below.split())
    return declared


def _part(module: str) -> str:
    """The part of the layers a module belongs to: ``bamctl.engine.stream`` -> ``engine``."""
    return module.split(".")[1] if "." in module else module


def _layer_violations(graph: dict[str, set[str]], declared: dict[str, set[str]]) -> list[str]:
    allowed = {part: _reaches(part, declared) for part in declared}
    return [
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in sorted(targets)
        if _part(target) != _part(module) and _part(target) not in allowed[_part(module)]
    ]


def test_the_declared_layers_cover_every_part_and_form_no_cycle():
    declared = _declared_layers()
    assert {_part(m) for m in MODULES} == set(declared)
    assert all(below <= set(declared) for below in declared.values())
    assert _cycles(declared) == []


def test_every_import_follows_the_declared_layers():
    assert _layer_violations(_graph(), _declared_layers()) == []


def test_the_layer_check_finds_a_backward_import():
    """The imports this layering once had: the model's priors and the model reaching into the engine."""
    graph = {**_graph(), "bamctl.positional": {"bamctl.engine.attention"}, "bamctl.interpret": {"bamctl.results.plots"}}
    assert _layer_violations(graph, _declared_layers()) == [
        "bamctl.interpret -> bamctl.results.plots", "bamctl.positional -> bamctl.engine.attention"]
    assert _layer_violations({"bamctl.tasks.ruler": {"bamctl.model"}}, _declared_layers()) == ["bamctl.tasks.ruler -> bamctl.model"]


def test_option_types_and_devices_import_nothing_heavy():
    """The CLI checks options and devices before loading torch-heavy modules."""
    graph = _graph()
    for module in ("bamctl.backends.base", "bamctl.devices"):
        assert graph[module] <= {"bamctl.errors", "bamctl.code_version"}, module
    # the compute-version leaf reads source files with the standard library only (and names a changed one with a BamctlError)
    outside = {name for name in _imports("bamctl.code_version") if name.split(".")[0] not in sys.stdlib_module_names}
    assert outside == {"bamctl.errors"}, outside


def test_results_know_no_torch():
    for module in _under("bamctl.results"):
        assert not any(n.split(".")[0] == "torch" for n in _imports(module)), module


def test_every_back_end_reaches_the_engine_only_through_its_own_module():
    """External back-ends (hf, vllm) never import the native engine, even for a result type."""
    graph = _graph()
    for module in ("bamctl.backends.hf", "bamctl.backends.vllm", "bamctl.backends.hf_common"):
        assert not any(t.startswith("bamctl.engine") for t in _reaches(module, graph)), module
