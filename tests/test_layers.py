"""The import layers of the package: cli -> tuning -> tracking -> service -> runtime -> running -> strategies -> context
-> engine/pool -> executors/backends/partition/planners -> base. An import may point down or sideways
within its layer, never up, and no set of modules may import each other in a circle. Every import
counts: module level, inside functions (lazy) and under TYPE_CHECKING."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "autohet"

LAYERS = [
    ["autohet.errors", "autohet.yaml_files", "autohet._tv", "autohet._lazy", "autohet.params", "autohet.objectives",
     "autohet.measurement", "autohet.workload", "autohet.models", "autohet.platform_info", "autohet.ray_runtime",
     "autohet.telemetry", "autohet.heap", "autohet.host_copy"],
    ["autohet.executors", "autohet.partition", "autohet.planners", "autohet.backends"],
    ["autohet.pool", "autohet.engine"],
    ["autohet.context"],
    ["autohet.strategies"],
    ["autohet.running", "autohet.config"],
    ["autohet.runtime"],
    ["autohet.service"],
    ["autohet.tracking"],
    ["autohet.tuning"],
    ["autohet.commands", "autohet.cli", "autohet.testing"],
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def layer(module: str) -> int:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    raise AssertionError(f"{module} is in no layer: add it to tests/test_layers.py LAYERS")


def resolve(name: str) -> str:
    """The module an import names: the longest known module prefix of it."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports(module: str) -> set[str]:
    tree = ast.parse(MODULES[module].read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out |= {resolve(n) for n in names if n.startswith("autohet.")}
    out.discard(module)
    return out


GRAPH = {m: imports(m) for m in MODULES if m != "autohet"}


def test_every_module_has_a_layer() -> None:
    for module in GRAPH:
        layer(module)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_down(module: str) -> None:
    up = sorted(t for t in GRAPH[module] if t != "autohet" and layer(t) > layer(module))
    assert not up, f"{module} (layer {layer(module)}) imports {up} from a higher layer"


def test_no_import_circles() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH.get(v, ()):
            if w not in GRAPH:
                continue
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
                circles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_the_checker_sees_lazy_and_type_only_imports(tmp_path) -> None:
    """A known upward import inside a function and one under TYPE_CHECKING are both found."""
    code = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from autohet.tuning import tuner\n"
            "def f():\n    from autohet.cli import main\n")
    tree = ast.parse(code)
    found = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module.startswith("autohet")}
    assert found == {"autohet.tuning", "autohet.cli"}
