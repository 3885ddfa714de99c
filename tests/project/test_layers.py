"""Imports point one way: lessonkit's subpackages are layers, and no module imports a layer above
its own; no circles among modules either, deferred imports included.

An import inside a function hides a circle at import time but does not remove it, so every
``import`` statement counts, wherever it is (only ``if TYPE_CHECKING:`` blocks are left out:
they never run).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "lessonkit"

# Bottom to top. The shared modules at the package's top come first: every layer may use them.
LAYERS = (
    "basics",
    "models",
    "memory",
    "hardware",
    "planning",
    "health",
    "charts",
    "widgets",
    "exercises",
    "cli",
)
BASICS = {"errors", "units", "options", "safe_repr"}


def module_names() -> list[str]:
    """Every module of the package as a dotted name below lessonkit ('memory.estimating')."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and parts[-1] == "__main__":
            continue
        names.append(".".join(parts))
    return names


def layer_of(module: str) -> str:
    """The layer a module belongs to: its subpackage, or 'basics' for the top-level modules."""
    if module == "":
        return "package"
    top = module.split(".")[0]
    if top in BASICS:
        return "basics"
    return top


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The dotted module (below lessonkit) that a relative or absolute from-import names."""
    if node.level == 0:
        return ".".join((node.module or "").split(".")[1:])
    base = module.split(".") if module else []
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join(base + ([node.module] if node.module else []))


def _imported(node: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """lessonkit modules one import statement names (a from-import of a submodule counts as
    that submodule)."""
    found: set[str] = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            parts = alias.name.split(".")
            if parts[0] == "lessonkit" and len(parts) > 1:
                found.add(".".join(parts[1:]))
    elif isinstance(node, ast.ImportFrom):
        if node.level == 0 and (node.module or "").split(".")[0] != "lessonkit":
            return found
        target = _resolve(node, module, is_package)
        for alias in node.names:
            sub = f"{target}.{alias.name}" if target else alias.name
            found.add(sub if sub in known else target)
    return found


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _statements(tree: ast.AST):
    todo = [tree]
    while todo:
        node = todo.pop()
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            yield child
            todo.append(child)


def import_graph() -> dict[str, set[str]]:
    """module -> the lessonkit modules it imports anywhere in its code."""
    known = set(module_names())
    graph: dict[str, set[str]] = {}
    for name in sorted(known):
        if name == "":
            continue  # the package's own __init__ loads everything lazily, by name
        path = PACKAGE / (name.replace(".", "/") + ".py")
        is_package = not path.exists()
        if is_package:
            path = PACKAGE / name.replace(".", "/") / "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        edges: set[str] = set()
        for statement in _statements(tree):
            edges |= _imported(statement, name, is_package, known)
        graph[name] = (edges & known) - {name, ""}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """'a imports b' for every import of a module in a higher layer than the importer's."""
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    wrong = []
    for module, imports in sorted(graph.items()):
        for target in sorted(imports):
            if rank[layer_of(target)] > rank[layer_of(module)]:
                wrong.append(f"{module} ({layer_of(module)}) imports {target} ({layer_of(target)})")
    return wrong


# ----- the checker checked ------------------------------------------------------------------
def test_the_import_reader_sees_deferred_and_relative_imports():
    known = {
        "memory",
        "memory.report",
        "memory.timeline",
        "units",
        "models",
        "models.spec",
        "planning",
        "planning.fitting",
    }
    source = (
        "import os\nfrom .report import MemoryReport\nfrom .. import units\n\n"
        "def f():\n    from ..planning.fitting import x\n    import lessonkit.models.spec\n"
        "\nif TYPE_CHECKING:\n    from .timeline import Timeline\n"
    )
    names: set[str] = set()
    for statement in _statements(ast.parse(source)):
        names |= _imported(statement, "memory.estimating", False, known)
    assert names == {"memory.report", "units", "planning.fitting", "models.spec"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_layer_check_catches_an_upward_import():
    graph = {
        "memory.estimating": {"planning.fitting", "units"},
        "planning.fitting": {"memory.estimating"},
        "units": set(),
        "errors": {"models.spec"},
        "models.spec": set(),
    }
    assert upward_imports(graph) == [
        "errors (basics) imports models.spec (models)",
        "memory.estimating (memory) imports planning.fitting (planning)",
    ]


# ----- the package ---------------------------------------------------------------------------
def test_every_module_sits_in_a_known_layer():
    assert {layer_of(m) for m in module_names()} - {"package"} <= set(LAYERS)
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert subpackages == set(LAYERS) - {"basics"}
    assert {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"} == BASICS


def test_no_module_imports_a_layer_above_its_own():
    assert upward_imports(import_graph()) == []


def test_no_import_circles_in_the_package():
    assert cycles(import_graph()) == []


def test_models_read_configs_through_hf_config_and_not_the_other_way():
    graph = import_graph()
    assert "models.hf_config" in graph["models.spec"]
    assert "models.spec" not in graph["models.hf_config"]


@pytest.mark.parametrize("layer", [layer for layer in LAYERS if layer != "basics"])
def test_each_layer_says_what_it_holds_and_exports_what_it_lists(layer):
    package = importlib.import_module(f"lessonkit.{layer}")
    assert package.__doc__ and len(package.__doc__.split()) >= 15, layer
    assert "import" in package.__doc__, f"{layer}'s docstring should say what it may import"
    for name in package.__all__:
        assert hasattr(package, name), f"lessonkit.{layer}.{name}"


# ----- what notebooks may import -------------------------------------------------------------
NOTEBOOK_FOLDERS = ("notebooks", "solutions", "exercises")


def _public_names(module_name: str) -> set[str]:
    module = importlib.import_module(module_name)
    if hasattr(module, "__all__"):
        return set(module.__all__)
    return {n for n in vars(module) if not n.startswith("_")}


def _notebook_code(path: Path) -> str:
    import json

    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    lines = []
    for cell in cells:
        if cell["cell_type"] == "code":
            source = "".join(cell["source"])
            lines += [
                line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))
            ]
    return "\n".join(lines)


def private_uses(code: str) -> list[str]:
    """What a notebook's code takes from lessonkit that is not public: a from-import of a name
    outside its module's __all__, an import of a module that is not a layer or a shared module,
    or ``lk.x``/``lessonkit.x``/``charts.x`` of a name the package does not export."""
    public_modules = {"lessonkit"} | {f"lessonkit.{layer}" for layer in LAYERS if layer != "basics"}
    public_modules |= {f"lessonkit.{name}" for name in BASICS}
    wrong: list[str] = []
    aliases: dict[str, str] = {}
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "lessonkit":
            module = node.module or ""
            if module not in public_modules:
                wrong.append(f"from {module} import ...")
                continue
            allowed = _public_names(module)
            if module == "lessonkit":
                allowed |= {layer for layer in LAYERS if layer != "basics"} | BASICS
            for alias in node.names:
                if alias.name not in allowed:
                    wrong.append(f"from {module} import {alias.name}")
                elif module == "lessonkit" and f"lessonkit.{alias.name}" in public_modules:
                    aliases[alias.asname or alias.name] = f"lessonkit.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "lessonkit":
                    continue
                if alias.name not in public_modules:
                    wrong.append(f"import {alias.name}")
                elif alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    aliases["lessonkit"] = "lessonkit"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id)
            if module is None:
                continue
            allowed = _public_names(module)
            if module == "lessonkit":
                allowed |= {layer for layer in LAYERS if layer != "basics"} | BASICS
            if node.attr not in allowed:
                wrong.append(f"{node.value.id}.{node.attr}")
    return sorted(set(wrong))


def test_the_notebook_import_check_catches_private_names():
    code = (
        "import lessonkit as lk\nfrom lessonkit import charts\n"
        "from lessonkit.memory.estimating import estimate\n"
        "from lessonkit.planning import find_fit, _estimate\n"
        "lk.estimate('7B'); lk.vram; charts.draw_breakdown; charts.LABELS\n"
    )
    assert private_uses(code) == [
        "charts.LABELS",
        "from lessonkit.memory.estimating import ...",
        "from lessonkit.planning import _estimate",
        "lk.vram",
    ]


@pytest.mark.parametrize(
    "path",
    sorted(p for folder in NOTEBOOK_FOLDERS for p in (PACKAGE.parent / folder).glob("*.ipynb")),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_notebooks_use_only_public_names(path):
    assert private_uses(_notebook_code(path)) == []
