#!/usr/bin/env python3
"""Write exercises/NN.ipynb from solutions/NN.ipynb: the solutions are the source.

Each region between nbgrader's ``### BEGIN SOLUTION`` and ``### END SOLUTION`` lines becomes a
placeholder (so instructors who use nbgrader can use the same files):

* in code at the top level, each name the region assigns and later code uses becomes
  ``name = ...  # your answer here``, so the following ``check(...)`` reports "not answered yet";
* in code inside a block (a function body), ``raise NotImplementedError("your code here")``;
* in markdown, a "Your answer here" prompt.

Cells tagged ``solution-only`` are left out of the exercise. Outputs, execution counts and
widget state are stripped from both, and both are written with stable formatting, so that

    python tools/generate_exercises.py --check

exits 1 with a summary of the differences when the committed files are not what this writes.
"""

from __future__ import annotations

import argparse
import ast
import copy
import difflib
import json
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN = re.compile(r"^(\s*)### BEGIN SOLUTION\s*$")
END = re.compile(r"^\s*### END SOLUTION\s*$")
MARKDOWN_PROMPT = "_Your answer here._"
SOLUTION_ONLY_TAG = "solution-only"
KEPT_CELL_METADATA = ("tags",)
KEPT_NOTEBOOK_METADATA = ("kernelspec", "language_info", "colab", "kaggle")


class GeneratorError(Exception):
    """A solution notebook the generator cannot turn into an exercise."""


def dumps(notebook: dict) -> str:
    """Stable JSON, as Jupyter writes it (indent 1, sorted keys), ending in a newline."""
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _lines(text: str) -> list[str]:
    """Jupyter's on-disk form of a cell source: a list of lines, each but the last ending in \\n."""
    return text.splitlines(keepends=True)


def clean_notebook(notebook: dict) -> dict:
    """A copy without outputs, execution counts, widget state or tool metadata."""
    nb = copy.deepcopy(notebook)
    nb["metadata"] = {k: v for k, v in nb.get("metadata", {}).items() if k in KEPT_NOTEBOOK_METADATA}
    if "language_info" in nb["metadata"]:
        nb["metadata"]["language_info"] = {"name": nb["metadata"]["language_info"].get("name", "python")}
    nb["nbformat"], nb["nbformat_minor"] = 4, 5
    for index, cell in enumerate(nb["cells"]):
        cell["metadata"] = {k: v for k, v in cell.get("metadata", {}).items() if k in KEPT_CELL_METADATA}
        cell["source"] = _lines(_source(cell))
        cell.setdefault("id", f"cell-{index}")
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
        else:
            cell.pop("outputs", None)
            cell.pop("execution_count", None)
    return nb


def _assigned_names(region: str) -> list[str]:
    """Names a region assigns at its top level, in order."""
    try:
        tree = ast.parse(textwrap.dedent(region))
    except SyntaxError:
        return []
    names: list[str] = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Name) and sub.id not in names:
                    names.append(sub.id)
    return names


def _assigns_text(region: str, name: str) -> bool:
    """True when the region assigns a string literal to ``name`` (a free-text answer)."""
    try:
        tree = ast.parse(textwrap.dedent(region))
    except SyntaxError:
        return False
    return any(isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
               and isinstance(node.value.value, str)
               and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
               for node in tree.body)


def _without_regions(text: str) -> str:
    """Code with its solution regions and IPython magics (%pip, !ls) removed."""
    kept, inside = [], False
    for line in text.splitlines(keepends=True):
        if BEGIN.match(line.rstrip("\n")):
            inside = True
        elif END.match(line.rstrip("\n")):
            inside = False
        elif not inside and not line.lstrip().startswith(("%", "!")):
            kept.append(line)
    return "".join(kept)


def _loaded_names(code: str) -> set[str]:
    """Names that code reads (not keyword arguments or strings that merely look alike)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set(re.findall(r"[A-Za-z_]\w*", code))
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)
            and isinstance(node.ctx, ast.Load)}


def _code_placeholder(region: str, indent: str, later_code: str) -> list[str]:
    if indent:
        return [f'{indent}raise NotImplementedError("your code here")\n']
    loaded = _loaded_names(later_code)
    used = [n for n in _assigned_names(region) if n in loaded]
    if not used:
        return ["# your code here\n"]
    return [f'{name} = """Your answer here."""  # your answer here, as text\n'
            if _assigns_text(region, name) else f"{name} = ...  # your answer here\n"
            for name in used]


def replace_regions(text: str, cell_type: str, later_code: str, where: str) -> str:
    """Replace each solution region of one cell's source with its placeholder."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        begin = BEGIN.match(lines[i].rstrip("\n"))
        if END.match(lines[i].rstrip("\n")):
            raise GeneratorError(f"{where}: '### END SOLUTION' without a BEGIN")
        if not begin:
            out.append(lines[i])
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not END.match(lines[j].rstrip("\n")):
            if BEGIN.match(lines[j].rstrip("\n")):
                raise GeneratorError(f"{where}: nested '### BEGIN SOLUTION'")
            j += 1
        if j == len(lines):
            raise GeneratorError(f"{where}: '### BEGIN SOLUTION' without an END")
        region = "".join(lines[i + 1:j])
        rest = _without_regions("".join(lines[j + 1:])) + "\n" + later_code
        if cell_type == "code":
            out += _code_placeholder(region, begin.group(1), rest)
        else:
            out.append(MARKDOWN_PROMPT + "\n")
        i = j + 1
    if out and text and not text.endswith("\n"):
        out[-1] = out[-1].rstrip("\n")
    return "".join(out)


def make_exercise(solution: dict, name: str) -> dict:
    """The exercise notebook for a (cleaned) solution notebook called ``name``."""
    nb = clean_notebook(solution)
    cells = [c for c in nb["cells"] if SOLUTION_ONLY_TAG not in c["metadata"].get("tags", [])]
    code_after = ["\n".join(_without_regions(_source(c)) for c in cells[k + 1:]
                            if c["cell_type"] == "code")
                  for k in range(len(cells))]
    for k, cell in enumerate(cells):
        text = _source(cell).replace(f"solutions/{name}", f"exercises/{name}")
        text = replace_regions(text, cell["cell_type"], code_after[k], f"solutions/{name} cell {k}")
        cell["source"] = _lines(text)
    note = {
        "cell_type": "markdown", "id": "generated-note", "metadata": {},
        "source": _lines(f"> Generated from `solutions/{name}` by `tools/generate_exercises.py`; "
                         "edit the solution instead."),
    }
    nb["cells"] = [note, *cells]
    return nb


def expected_files(solutions: Path, exercises: Path) -> dict[Path, str]:
    """Every file the generator owns (cleaned solutions and exercises) -> its expected text."""
    files: dict[Path, str] = {}
    for path in sorted(solutions.glob("*.ipynb")):
        try:
            solution = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise GeneratorError(f"{path}: not valid JSON ({err})") from None
        files[path] = dumps(clean_notebook(solution))
        files[exercises / path.name] = dumps(make_exercise(solution, path.name))
    return files


def differences(files: dict[Path, str], exercises: Path) -> list[str]:
    """A summary of what differs on disk from ``files`` (empty when everything matches)."""
    problems = []
    for path, text in files.items():
        if not path.exists():
            problems.append(f"{path}: missing")
            continue
        current = path.read_text(encoding="utf-8")
        if current != text:
            diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(),
                                             str(path), "generated", lineterm="", n=1))
            shown = "\n".join("    " + line for line in diff[:20])
            more = f"\n    ... {len(diff) - 20} more diff lines" if len(diff) > 20 else ""
            problems.append(f"{path}: differs from what the generator writes\n{shown}{more}")
    for path in sorted(exercises.glob("*.ipynb")):
        if path not in files:
            problems.append(f"{path}: has no solution notebook")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if any file differs from what would be written")
    parser.add_argument("--solutions", type=Path, default=ROOT / "solutions")
    parser.add_argument("--exercises", type=Path, default=ROOT / "exercises")
    args = parser.parse_args(argv)
    try:
        files = expected_files(args.solutions, args.exercises)
    except GeneratorError as err:
        print(f"generate_exercises: error: {err}", file=sys.stderr)
        return 2
    if not files:
        print(f"generate_exercises: error: no notebooks in {args.solutions}", file=sys.stderr)
        return 2
    if args.check:
        problems = differences(files, args.exercises)
        if problems:
            print("Exercises are out of sync with their solutions "
                  "(run python tools/generate_exercises.py):", file=sys.stderr)
            print("\n".join(problems), file=sys.stderr)
            return 1
        print(f"{len(files) // 2} exercise notebooks match their solutions.")
        return 0
    args.exercises.mkdir(parents=True, exist_ok=True)
    written = 0
    for path, text in files.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written += 1
    print(f"{len(files) // 2} solution notebooks -> exercises/ ({written} files written).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
