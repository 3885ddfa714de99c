"""Imports point one way: no circles among lessonkit's modules, deferred imports included.

An import inside a function hides a circle at import time but does not remove it, so every
``import`` statement counts, wherever it is (only ``if TYPE_CHECKING:`` blocks are left out:
they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lessonkit"


def _imported(node: ast.AST) -> set[str]:
    """lessonkit modules one import statement names."""
    found = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            parts = alias.name.split(".")
            if parts[0] == "lessonkit" and len(parts) > 1:
                found.add(parts[1])
    elif isinstance(node, ast.ImportFrom):
        if node.level == 1 or (node.level == 0 and node.module and
                               node.module.split(".")[0] == "lessonkit"):
            parts = (node.module or "").split(".")[1 if node.level == 0 else 0:]
            if parts and parts[0]:
                found.add(parts[0])
            else:  # from . import x, y
                found |= {alias.name for alias in node.names}
    return found


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def import_graph() -> dict[str, set[str]]:
    """module -> the lessonkit modules it imports anywhere in its code."""
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    graph: dict[str, set[str]] = {}
    for name in sorted(modules):
        tree = ast.parse((PACKAGE / f"{name}.py").read_text(encoding="utf-8"))
        edges: set[str] = set()
        todo = [tree]
        while todo:
            node = todo.pop()
            for child in ast.iter_child_nodes(node):
                if _is_type_checking(child):
                    continue
                edges |= _imported(child)
                todo.append(child)
        graph[name] = (edges & modules) - {name}
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


def test_the_cycle_finder_sees_deferred_imports():
    source = ("import os\nfrom . import b\n\ndef f():\n    from .c import x\n"
              "    import lessonkit.d\n\nif TYPE_CHECKING:\n    from .e import y\n")
    tree = ast.parse(source)
    names: set[str] = set()
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        for child in ast.iter_child_nodes(node):
            if not _is_type_checking(child):
                names |= _imported(child)
                todo.append(child)
    assert names == {"b", "c", "d"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_hf_and_models_import_one_way():
    graph = import_graph()
    assert "hf" in graph["models"]  # models reads configs through hf
    assert not any({"hf", "models"} <= set(component) for component in cycles(graph)), \
        cycles(graph)
    assert "models" not in graph["hf"]


def test_no_import_circles_in_the_package():
    assert cycles(import_graph()) == []
