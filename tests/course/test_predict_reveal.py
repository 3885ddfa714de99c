"""Predict, then reveal: nothing between a prediction and its reveal shows the answer (no
printout, no chart, no explorer), no placeholder names an answer, and the reveal of a memory
guess gets the report, so that it can say which part the guess missed."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PREDICT = re.compile(r"^predict\((\w+), \"(\w+)\"", re.MULTILINE)
SHOWS = re.compile(r"\bprint\(|plt\.show\(|charts\.\w+\(|_explorer\(|^\w+\s*$", re.MULTILINE)


def pairs(nb: nbformat.NotebookNode) -> list[tuple[int, int, str, str]]:
    """(predict cell, reveal cell, variable, kind) of each prediction in ``nb``."""
    cells = nb.cells
    found = []
    for i, cell in enumerate(cells):
        if cell.cell_type != "code":
            continue
        for variable, kind in PREDICT.findall(cell.source):
            reveal = next(
                j
                for j in range(i + 1, len(cells))
                if re.search(rf"^reveal\(\s*{variable},", cells[j].source, re.MULTILINE)
            )
            found.append((i, reveal, variable, kind))
    return found


def test_every_course_notebook_but_the_checks_predicts() -> None:
    with_predictions = [p.name for p in NOTEBOOKS if pairs(nbformat.read(p, as_version=4))]
    assert len(with_predictions) >= 4, with_predictions


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_nothing_between_a_prediction_and_its_reveal_shows_the_answer(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    for start, end, variable, kind in pairs(nb):
        if kind == "text":  # a sentence to write before the numbers: they come before reveal
            continue
        for cell in nb.cells[start + 1 : end + 1]:
            if cell.cell_type != "code":
                continue
            source = re.sub(r"^reveal\(.*", "", cell.source, flags=re.MULTILINE | re.DOTALL)
            assert not SHOWS.search(source), (path.name, variable, cell.source[:200])
            assert "nbval-check-output" not in cell.metadata.get("tags", [])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_no_placeholder_names_an_answer(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    for start, _, variable, kind in pairs(nb):
        placeholder = re.search(rf"^{variable} = .*$", nb.cells[start].source, re.MULTILINE)
        assert placeholder, variable
        if kind in ("gpu", "environment"):
            assert "e.g." not in placeholder.group(0), placeholder.group(0)


def test_the_memory_reveal_gets_the_report() -> None:
    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    (_, end, variable, kind), *_ = pairs(nb)
    assert kind == "memory"
    assert re.search(rf'^reveal\({variable}, "memory", full\)$', nb.cells[end].source, re.M)


def test_cards_sold_with_the_same_memory_tie() -> None:
    """Notebook 2's answer is every fitting card of the smallest size sold: the V100 32GB and
    the RTX 5090 (both 32 GB, 31.7 and 31.4 GiB usable) answer together."""
    import lessonkit as lk

    nb = nbformat.read(NOTEBOOKS[1], as_version=4)
    end = pairs(nb)[0][1]
    assert "g.memory_gb == smallest.memory_gb" in nb.cells[end].source
    v100, rtx5090 = lk.get_gpu("V100 32GB"), lk.get_gpu("RTX 5090")
    assert v100.memory_gb == rtx5090.memory_gb and v100.usable_bytes != rtx5090.usable_bytes
