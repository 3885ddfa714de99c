"""No import circles inside lessonkit, counting the imports deferred into functions: a deferred
import hides a cycle from Python but does not remove it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lessonkit"

# A circle another change is taking apart; this list may only shrink.
KNOWN = {frozenset({"hf", "models"})}


def imports_of(source: str, module: str, known: set[str]) -> set[str]:
    """The lessonkit modules ``module`` imports anywhere in its source, function bodies included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and (node.module or "").startswith("lessonkit."):
                base = node.module.split(".")[1]
            elif node.level == 1:
                base = (node.module or "").split(".")[0]
            else:
                continue
            if base:
                found.add(base)
            else:  # from . import probes, units
                found |= {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("lessonkit.")}
    return (found & known) - {module}


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    files = {p.stem: p for p in package.glob("*.py") if p.stem != "__init__"}
    names = set(files)
    return {name: imports_of(path.read_text(), name, names) for name, path in files.items()}


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_finder_sees_deferred_imports_and_circles():
    names = {"health", "probes", "units"}
    deferred = "def f():\n    from . import probes\n    from .units import GiB\n"
    assert imports_of(deferred, "health", names) == {"probes", "units"}
    assert imports_of("from .health import Device\n", "probes", names) == {"health"}
    assert circles({"health": {"probes"}, "probes": {"health", "units"}, "units": set()}) == [
        frozenset({"health", "probes"})]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_lessonkit_has_no_import_circles():
    graph = import_graph()
    assert {"health", "health_report", "probes", "recommender", "verdicts", "machine_verdict"} <= set(graph)
    found = [set(c) for c in circles(graph) if c not in KNOWN]
    assert not found, f"import circles (deferred imports included): {found}"


def test_health_check_modules_point_one_way():
    graph = import_graph()
    # health -> machine_verdict -> recommender -> verdicts -> fitting; probes and health both
    # build on health_report; safe_text is a basic in errors.
    assert "health" not in graph["probes"] and "health" not in graph["recommender"]
    assert not graph["verdicts"] & {"recommender", "machine_verdict", "health"}
    assert not graph["recommender"] & {"machine_verdict", "health", "probes"}
    assert graph["health_report"] <= {"platforms", "units", "errors"}
    assert not graph["errors"]
