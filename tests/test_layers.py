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


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def find_modules(root: Path) -> dict[str, Path]:
    return {module_name(p, root): p for p in root.rglob("*.py")}


MODULES = find_modules(ROOT)


def layer(module: str) -> int:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    raise AssertionError(f"{module} is in no layer: add it to tests/test_layers.py LAYERS")


def resolve(name: str, modules: dict[str, Path]) -> str:
    """The module an import names: the longest known module prefix of it."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports(module: str, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(modules[module].read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out |= {resolve(n, modules) for n in names if n.startswith("autohet.")}
    out.discard(module)
    return out


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    return {m: imports(m, modules) for m in modules if m != "autohet"}


def upward(graph: dict[str, set[str]], module: str) -> list[str]:
    """The modules ``module`` imports from a higher layer."""
    return sorted(t for t in graph[module] if t != "autohet" and layer(t) > layer(module))


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other in a circle (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


GRAPH = import_graph(MODULES)


def test_every_module_has_a_layer() -> None:
    for module in GRAPH:
        layer(module)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_down(module: str) -> None:
    up = upward(GRAPH, module)
    assert not up, f"{module} (layer {layer(module)}) imports {up} from a higher layer"


def test_no_import_circles() -> None:
    circles = import_circles(GRAPH)
    assert not circles, f"import circles: {circles}"


def test_the_checker_reports_upward_lazy_type_only_imports_and_circles(tmp_path) -> None:
    """The checker run on a crafted package: an upward import inside a function, one under
    TYPE_CHECKING and one at module level are each reported; a downward one is not; a circle is found."""
    pkg = tmp_path / "autohet"
    for sub in ("tuning", "pool"):
        (pkg / sub).mkdir(parents=True)
    files = {
        "__init__.py": "",
        "errors.py": "import autohet.workload\n",  # sideways, same layer: fine
        "workload.py": "import autohet.errors\n",  # closes a circle with errors
        "measurement.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from autohet.tuning import tuner\n"
                           "def f():\n    from autohet.cli import main\n"),
        "heap.py": "from autohet.pool.spec import PoolSpec\n",  # module level
        "context.py": "from autohet.errors import UserError\n",  # downward: fine
        "cli.py": "",
        "tuning/__init__.py": "",
        "tuning/tuner.py": "",
        "pool/__init__.py": "",
        "pool/spec.py": "",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(find_modules(pkg))
    assert upward(graph, "autohet.measurement") == ["autohet.cli", "autohet.tuning.tuner"]
    assert upward(graph, "autohet.heap") == ["autohet.pool.spec"]
    assert upward(graph, "autohet.context") == upward(graph, "autohet.errors") == []
    assert import_circles(graph) == [["autohet.errors", "autohet.workload"]]
