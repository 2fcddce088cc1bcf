"""The import layers of the package: cli -> tuning -> tracking -> service -> runtime -> strategy_run ->
strategies -> context -> engine/pool -> executors/block_runners/partition/planners -> core/platform. An
import may point down or sideways within its layer, never up, and no set of modules may import each other
in a circle. Every import counts: module level, inside functions (lazy) and under TYPE_CHECKING."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "autohet"

LAYERS = [
    ["autohet.core", "autohet.platform"],
    ["autohet.executors", "autohet.partition", "autohet.planners", "autohet.block_runners"],
    ["autohet.pool", "autohet.engine"],
    ["autohet.context"],
    ["autohet.strategies"],
    ["autohet.strategy_run", "autohet.config"],
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


TARGET = re.compile(r"autohet(\.\w+)+(:\w+)?")  # a registry's "autohet.pkg.module:Class" string


def imports(module: str, modules: dict[str, Path], by_name: bool = False) -> set[str]:
    """What ``module`` imports: its import statements and, with ``by_name``, what it imports by name at
    run time: a registry's "module:Class" strings, an f-string's "autohet.pkg.{name}" (the package), the
    private modules a package front hands out (``lazy_exports``). The layers count both (a lazy import
    cannot hide an upward arrow); circles count the statements only (a registry names its members by
    string and its members import its base types: a circle by design, broken at run time)."""
    tree = ast.parse(modules[module].read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        elif not by_name:
            continue
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and TARGET.fullmatch(node.value):
            names = [node.value.split(":")[0]]
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant) \
                and str(node.values[0].value).startswith("autohet."):
            names = [str(node.values[0].value).rstrip(".")]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_exports" and len(node.args) > 1 \
                and isinstance(node.args[1], ast.Dict):
            names = [f"{module}.{v.value}" for v in node.args[1].values if isinstance(v, ast.Constant)]
        else:
            continue
        out |= {resolve(n, modules) for n in names if n.startswith("autohet.")}
    out.discard(module)
    return out


def import_graph(modules: dict[str, Path], by_name: bool = False) -> dict[str, set[str]]:
    return {m: imports(m, modules, by_name) for m in modules if m != "autohet"}


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
BY_NAME = import_graph(MODULES, by_name=True)


def test_every_module_has_a_layer() -> None:
    for module in GRAPH:
        layer(module)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_down(module: str) -> None:
    up = upward(BY_NAME, module)
    assert not up, f"{module} (layer {layer(module)}) imports {up} from a higher layer"


def test_no_import_circles() -> None:
    circles = import_circles(GRAPH)
    assert not circles, f"import circles: {circles}"


def test_the_checker_reports_upward_lazy_type_only_imports_and_circles(tmp_path) -> None:
    """The checker run on a crafted package: an upward import inside a function, one under
    TYPE_CHECKING and one at module level are each reported; a downward one is not; a circle is found."""
    pkg = tmp_path / "autohet"
    for sub in ("tuning", "pool", "core", "platform"):
        (pkg / sub).mkdir(parents=True)
    files = {
        "__init__.py": "",
        "core/__init__.py": "",
        "platform/__init__.py": "",
        "core/errors.py": "import autohet.core.workload\n",  # sideways, same layer: fine
        "core/workload.py": "import autohet.core.errors\n",  # closes a circle with errors
        "core/measurement.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                "    from autohet.tuning import tuner\ndef f():\n    from autohet.cli import main\n"),
        "platform/gc_control.py": "from autohet.pool.spec import PoolSpec\n",  # module level
        "platform/registry.py": 'TARGETS = {"x": "autohet.tuning.tuner:Tuner"}\n',  # by name, at run time
        "context.py": "from autohet.core.errors import UserError\n",  # downward: fine
        "cli.py": "",
        "tuning/__init__.py": "",
        "tuning/tuner.py": "",
        "pool/__init__.py": "",
        "pool/spec.py": "",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(find_modules(pkg))
    assert upward(graph, "autohet.core.measurement") == ["autohet.cli", "autohet.tuning.tuner"]
    assert upward(graph, "autohet.platform.gc_control") == ["autohet.pool.spec"]
    assert upward(graph, "autohet.platform.registry") == []  # by name: only where asked for
    by_name = import_graph(find_modules(pkg), by_name=True)
    assert upward(by_name, "autohet.platform.registry") == ["autohet.tuning.tuner"]
    assert upward(graph, "autohet.context") == upward(graph, "autohet.core.errors") == []
    assert import_circles(graph) == [["autohet.core.errors", "autohet.core.workload"]]


# the service reaches devices and the cluster through the runtime (``autohet.load``, ``runtime.hosting``)
SERVICE_MAY_NOT_IMPORT = ("autohet.executors", "autohet.pool", "autohet.block_runners", "autohet.engine")


@pytest.mark.parametrize("module", sorted(m for m in BY_NAME if m.startswith("autohet.service")))
def test_the_service_reaches_devices_through_the_runtime(module: str) -> None:
    direct = sorted(t for t in BY_NAME[module] if t.startswith(SERVICE_MAY_NOT_IMPORT))
    assert not direct, f"{module} imports {direct}; go through autohet.load or autohet.runtime.hosting"
