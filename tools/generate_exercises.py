#!/usr/bin/env python3
"""Write exercises/NN.ipynb from solutions/NN.ipynb: the solutions are the source.

The solutions carry nbgrader cell metadata (answer cells are solution cells, each checked question
is followed by a locked autograded test cell, written explanations are manually graded answers),
and this generator does what ``nbgrader generate_assignment`` does with the kit's
``nbgrader_config.py``, so that the exercises are the notebooks nbgrader releases:

* each line holding the begin marker up to the line holding the end marker becomes the code stub
  ``answer = ...  # your answer here`` (indented like the marker line), or in markdown the text
  stub ``_Your answer here._``; a solution cell without markers becomes the stub whole;
* solution cells become undeletable, test (grade) cells undeletable and uneditable;
* a marker outside a cell with ``nbgrader.solution`` metadata, unbalanced markers and grade ids
  outside ``[A-Za-z0-9_-]`` are errors, as they are for nbgrader.

Beyond nbgrader: cells tagged ``solution-only`` are left out (the kit's nbgrader config drops them
too), links to ``solutions/NN.ipynb`` point to ``exercises/NN.ipynb``, and the notebook's
metadata (``lessonkit.generated_from``, never a cell a student reads) says where it comes
from. Outputs, execution counts and widget state are stripped from both, and both are written
with stable formatting, so that

    python tools/generate_exercises.py --check

exits 1 with a summary of the differences when the committed files are not what this writes.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# nbgrader's delimiters (ClearSolutions.begin/end_solution_delimeter): matched anywhere in a line.
BEGIN_MARK = "BEGIN " + "SOLUTION"
END_MARK = "END " + "SOLUTION"
# The stubs; nbgrader_config.py sets ClearSolutions.code_stub and text_stub to the same.
CODE_STUB = "answer = ...  # your answer here"
TEXT_STUB = "_Your answer here._"
MARKDOWN_PROMPT = TEXT_STUB
SOLUTION_ONLY_TAG = "solution-only"
KEPT_CELL_METADATA = ("tags", "nbgrader", "deletable", "editable", "cellView", "jupyter")
PROVENANCE_KEY = "lessonkit"
KEPT_NOTEBOOK_METADATA = ("kernelspec", "language_info", "colab", "kaggle", PROVENANCE_KEY)
GRADE_ID = re.compile(r"^[a-zA-Z0-9_\-]*$")


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
    nb["metadata"] = {
        k: v for k, v in nb.get("metadata", {}).items() if k in KEPT_NOTEBOOK_METADATA
    }
    if "language_info" in nb["metadata"]:
        nb["metadata"]["language_info"] = {
            "name": nb["metadata"]["language_info"].get("name", "python")
        }
    nb["nbformat"], nb["nbformat_minor"] = 4, 5
    for index, cell in enumerate(nb["cells"]):
        cell["metadata"] = {
            k: v for k, v in cell.get("metadata", {}).items() if k in KEPT_CELL_METADATA
        }
        cell["source"] = _lines(_source(cell))
        cell.setdefault("id", f"cell-{index}")
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
        else:
            cell.pop("outputs", None)
            cell.pop("execution_count", None)
    return nb


def _nbgrader(cell: dict) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def replace_regions(text: str, cell_type: str, where: str) -> tuple[str, bool]:
    """nbgrader's ClearSolutions on one cell's source: (new source, whether a region was found)."""
    stub = (CODE_STUB if cell_type == "code" else TEXT_STUB).split("\n")
    out: list[str] = []
    inside = found = False
    for line in text.split("\n"):
        if BEGIN_MARK in line:
            if inside:
                raise GeneratorError(f"{where}: nested '{BEGIN_MARK}'")
            inside = found = True
            indent = re.match(r"\s*", line).group(0)
            out += [indent + stub_line for stub_line in stub]
        elif END_MARK in line:
            if not inside:
                raise GeneratorError(f"{where}: '{END_MARK}' without a begin marker")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise GeneratorError(f"{where}: '{BEGIN_MARK}' without an end marker")
    return "\n".join(out), found


def _check_metadata(cell: dict, where: str, seen: set[str]) -> None:
    meta = _nbgrader(cell)
    if not any(meta.get(k) for k in ("solution", "grade", "locked")):
        return
    grade_id = meta.get("grade_id", "")
    if not grade_id or not GRADE_ID.match(grade_id):
        raise GeneratorError(
            f"{where}: grade id {grade_id!r} is empty or not made of letters, "
            "digits, '_' and '-' (nbgrader's rule)"
        )
    if grade_id in seen:
        raise GeneratorError(f"{where}: duplicate grade id {grade_id!r}")
    seen.add(grade_id)
    if meta.get("grade") and not isinstance(meta.get("points"), (int, float)):
        raise GeneratorError(f"{where}: graded cell {grade_id!r} has no points")
    if cell["cell_type"] == "markdown" and meta.get("solution") != meta.get("grade"):
        raise GeneratorError(f"{where}: a markdown answer must be both solution and graded")


def _lock(cell: dict) -> None:
    """nbgrader's LockCells with its default settings."""
    meta = _nbgrader(cell)
    if meta.get("solution"):
        cell["metadata"]["deletable"] = False
    elif meta.get("grade") or meta.get("locked"):
        cell["metadata"]["deletable"] = False
        cell["metadata"]["editable"] = False


def make_exercise(solution: dict, name: str) -> dict:
    """The exercise notebook for a (cleaned) solution notebook called ``name``."""
    nb = clean_notebook(solution)
    cells = [c for c in nb["cells"] if SOLUTION_ONLY_TAG not in c["metadata"].get("tags", [])]
    seen: set[str] = set()
    for k, cell in enumerate(cells):
        where = f"solutions/{name} cell {cell.get('id', k)}"
        _check_metadata(cell, where, seen)
        text = _source(cell).replace(f"solutions/{name}", f"exercises/{name}")
        text, found = replace_regions(text, cell["cell_type"], where)
        is_solution = bool(_nbgrader(cell).get("solution"))
        if found and not is_solution:
            raise GeneratorError(
                f"{where}: a solution region in a cell without nbgrader "
                "solution metadata (nbgrader rejects it)"
            )
        if is_solution and not found:
            text = CODE_STUB if cell["cell_type"] == "code" else TEXT_STUB
        _lock(cell)
        cell["source"] = _lines(text)
    nb["cells"] = cells
    # Where the notebook comes from, for the instructor and the tools; a student never reads it.
    nb["metadata"][PROVENANCE_KEY] = {
        "generated_from": f"solutions/{name}",
        "generator": "tools/generate_exercises.py",
        "edit": "the solution notebook, then run the generator",
    }
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
            diff = list(
                difflib.unified_diff(
                    current.splitlines(),
                    text.splitlines(),
                    str(path),
                    "generated",
                    lineterm="",
                    n=1,
                )
            )
            shown = "\n".join("    " + line for line in diff[:20])
            more = f"\n    ... {len(diff) - 20} more diff lines" if len(diff) > 20 else ""
            problems.append(f"{path}: differs from what the generator writes\n{shown}{more}")
    for path in sorted(exercises.glob("*.ipynb")):
        if path not in files:
            problems.append(f"{path}: has no solution notebook")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if any file differs from what would be written",
    )
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
            print(
                "Exercises are out of sync with their solutions "
                "(run python tools/generate_exercises.py):",
                file=sys.stderr,
            )
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
