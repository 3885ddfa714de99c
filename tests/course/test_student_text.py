"""What a student reads names no test or grading tool and nothing that does not exist: the
markdown and the visible code of the course notebooks and the practice notebooks."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
STUDENT_NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted(
    (ROOT / "exercises").glob("*.ipynb")
)
TOOL_WORDS = re.compile(
    r"\b(nbval|NBVAL_\w+|papermill|pytest|nbgrader|nbclient|nbconvert|tools/\w+|"
    r"generate_exercises|strip_notebooks|quiz_cells|Generated from)\b",
    re.IGNORECASE,
)
NUMBERED = re.compile(r"\b(?:[Nn]otebooks?|[Pp]art) (\d+)(?:(?: to |-| and )(\d+))?")
PATHS = re.compile(r"\b((?:notebooks|exercises|solutions|docs)/[\w.-]+\.(?:ipynb|md))")
DOTTED = re.compile(r"`(lessonkit(?:\.\w+)+)")


def hidden(cell: nbformat.NotebookNode) -> bool:
    """A cell whose code JupyterLab hides (its input collapsed) and Colab shows as a form."""
    return bool(cell.metadata.get("jupyter", {}).get("source_hidden"))


def student_text(nb: nbformat.NotebookNode) -> list[tuple[int, str]]:
    """(cell index, text) of what a student reads: markdown, and visible code; of a hidden
    cell only its Colab form title."""
    shown = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            shown.append((index, cell.source))
        elif cell.cell_type == "code":
            if hidden(cell):
                shown += [(index, line) for line in cell.source.splitlines() if "@title" in line]
            else:
                shown.append((index, cell.source))
    return shown


def problems(nb: nbformat.NotebookNode, where: str) -> list[str]:
    """Every tool named and every module, notebook or file named that does not exist."""
    found = []
    count = len(list((ROOT / "notebooks").glob("*.ipynb")))
    for index, text in student_text(nb):
        for match in TOOL_WORDS.finditer(text):
            found.append(f"{where} cell {index}: names {match.group(0)!r}")
        if re.search(r"\b[Mm]odule \d+", text):
            found.append(f"{where} cell {index}: names a numbered module the course has not")
        for match in NUMBERED.finditer(text):
            numbers = [int(n) for n in match.groups() if n]
            if not all(1 <= n <= count for n in numbers):
                found.append(f"{where} cell {index}: {match.group(0)!r} does not exist")
        for path in PATHS.findall(text):
            if not (ROOT / path).exists():
                found.append(f"{where} cell {index}: {path} does not exist")
        for dotted in DOTTED.findall(text):
            if not resolves(dotted):
                found.append(f"{where} cell {index}: {dotted} does not exist")
    return found


def resolves(dotted: str) -> bool:
    """True when ``dotted`` is a lessonkit module, or a name in one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(target, name):
                return False
            target = getattr(target, name)
        return True
    return False


@pytest.mark.parametrize("path", STUDENT_NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_student_text_names_no_tool_and_nothing_missing(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    assert problems(nb, path.name) == []


def test_the_check_finds_what_the_course_once_said() -> None:
    """The sentences a student once read in the course: each is caught."""
    cells = [
        nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(1)"),
        nbformat.v4.new_code_cell("# Parameters: change them (papermill sets them with -p)."),
        nbformat.v4.new_markdown_cell(
            "> Generated from `solutions/01_vram_equation.ipynb` by "
            "`tools/generate_exercises.py`; edit the solution instead."
        ),
        nbformat.v4.new_code_cell("# Autograded by nbgrader (1 point)\nautograde('01.1', answer)"),
        nbformat.v4.new_markdown_cell("Module 9 of the course covers them."),
        nbformat.v4.new_markdown_cell("As notebook 9 showed, and `lessonkit.charts.nothing_here`."),
        nbformat.v4.new_markdown_cell("See `docs/missing-page.md`."),
    ]
    found = problems(nbformat.v4.new_notebook(cells=cells), "old")
    for index in range(len(cells)):
        assert any(line.startswith(f"old cell {index}:") for line in found), (index, found)
    hidden_cell = nbformat.v4.new_code_cell("# @title Records your answer\nautograde(1, 2)")
    hidden_cell.metadata["jupyter"] = {"source_hidden": True}
    assert problems(nbformat.v4.new_notebook(cells=[hidden_cell]), "hidden") == []
    assert resolves("lessonkit.health.fake_torch") and resolves("lessonkit.estimate")
