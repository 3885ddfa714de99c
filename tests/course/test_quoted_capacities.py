"""An out-of-memory message the course quotes to a student gives a catalog card's total
capacity as the catalog does (a T4: the catalog's 14.75 GiB, never 14.74 next to it), and
notebook 1 builds its T4 message from the catalog."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from lessonkit import get_gpu
from lessonkit.cli.oom import OOM_EPILOG
from lessonkit.hardware.gpus import card_with_total
from lessonkit.units import GiB

ROOT = Path(__file__).resolve().parents[2]
CAPACITY = re.compile(r"total\s+capacity\s+of\s+(\d+(?:\.\d+)?)\s+GiB")


def student_texts() -> dict[str, str]:
    """What a student reads: the notebooks (course and practice), the README, the CLI's help."""
    texts = {"README.md": (ROOT / "README.md").read_text(encoding="utf-8")}
    texts["lessonkit oom --help"] = OOM_EPILOG
    for folder in ("notebooks", "exercises"):
        for path in sorted((ROOT / folder).glob("*.ipynb")):
            nb = nbformat.read(path, as_version=4)
            texts[f"{folder}/{path.name}"] = "\n".join(cell.source for cell in nb.cells)
    return texts


def wrong_capacities(texts: dict[str, str]) -> list[str]:
    found = []
    for where, text in texts.items():
        for match in CAPACITY.finditer(text):
            card = card_with_total(float(match.group(1)) * GiB)
            if card is not None and card.usable_text != f"{match.group(1)} GiB":
                found.append(
                    f"{where}: {match.group(0)!r}, the catalog's {card.name}: {card.usable_text}"
                )
    return found


def test_every_quoted_capacity_of_a_catalog_card_is_the_catalogs() -> None:
    texts = student_texts()
    assert sum(len(CAPACITY.findall(text)) for text in texts.values()) >= 2  # README, help
    assert wrong_capacities(texts) == []


@pytest.mark.parametrize("figure", ["14.74", "14.76"])
def test_the_check_finds_a_t4_figure_beside_the_catalogs(figure: str) -> None:
    assert get_gpu("T4").usable_text == "14.75 GiB"
    text = f"GPU 0 has a total capacity of {figure} GiB of which 382.12 MiB is free."
    assert wrong_capacities({"x": text}) == [
        f"x: 'total capacity of {figure} GiB', the catalog's T4: 14.75 GiB"
    ]


def test_notebook_1_takes_the_t4s_capacity_from_the_catalog() -> None:
    nb = nbformat.read(ROOT / "notebooks" / "01_vram_equation.ipynb", as_version=4)
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and "T4_ERROR = (" in c.source]
    namespace: dict[str, object] = {"lk": __import__("lessonkit")}
    exec(cell.source.split("print(")[0], namespace)  # the message, without the doctor's printout
    message = str(namespace["T4_ERROR"])
    assert f"total capacity of {get_gpu('T4').usable_text} of which" in message
