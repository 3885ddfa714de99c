"""One usable figure per card: wherever the course writes a card's usable memory (data files,
docs, the README, the notebooks, the package's own text), it is the catalog's figure
(``GPU.usable_text``), the one every chart, readout and the OOM doctor use."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lessonkit.hardware.gpus import get_gpu, list_gpus

ROOT = Path(__file__).resolve().parents[2]
USABLE = re.compile(r"(\d+(?:\.\d+)?) GiB usable")
WINDOW = 60  # characters before the figure in which the card is named


def texts() -> dict[str, str]:
    """Every text the course shows or ships, by file (notebooks: their cells' sources and
    outputs)."""
    found = {}
    paths = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("lessonkit/**/*.py")]
    paths += [p for p in ROOT.glob("lessonkit/data/*.json") if p.name != "gpus.json"]
    for path in paths:
        found[str(path.relative_to(ROOT))] = path.read_text(encoding="utf-8")
    for path in [*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb")]:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        parts = []
        for cell in cells:
            parts.append("".join(cell["source"]))
            for output in cell.get("outputs", []):
                parts.append("".join(output.get("text", "")))
                parts.append("".join(output.get("data", {}).get("text/plain", "")))
        found[str(path.relative_to(ROOT))] = "\n".join(parts)
    return found


def named_figures(text: str) -> list[tuple[str, str, str]]:
    """(card, figure, context) for each "X GiB usable" with a catalog card named just before."""
    names = sorted((g.name for g in list_gpus()), key=len, reverse=True)
    figures = []
    for match in USABLE.finditer(text):
        before = text[max(0, match.start() - WINDOW) : match.start()]
        before = re.split(r"[.;:]\s|\n\n", before)[-1]  # the same sentence, the same line
        hits = [
            (before.rfind(name) + len(name), len(name), name) for name in names if name in before
        ]
        if hits:
            card = max(hits)[2]
            figures.append((card, match.group(1), before[-40:] + match.group(0)))
    return figures


def test_every_card_named_with_its_usable_memory_has_the_catalogs_figure():
    wrong, checked = [], 0
    for where, text in texts().items():
        for card, figure, context in named_figures(text):
            checked += 1
            expected = get_gpu(card).usable_text.split()[0]
            if figure != expected:
                wrong.append(f"{where}: {context!r} ({card}: {expected} GiB in the catalog)")
    assert not wrong, "\n".join(wrong)
    assert checked >= 10  # the T4, the RTX 4090, the A100s ... are named in many places


def test_the_check_catches_a_card_given_another_figure():
    assert named_figures("a T4 (about 14.73 GiB usable)") == [
        ("T4", "14.73", "a T4 (about 14.73 GiB usable")
    ]
    assert named_figures("the A100 80GB (79.2 GiB usable)")[0][:2] == ("A100 80GB", "79.2")
    assert named_figures("14.75 GiB usable") == []  # no card named: nothing to check


@pytest.mark.parametrize("name", ["T4", "A100 80GB", "RTX 4090", "H200"])
def test_the_catalogs_text_and_bytes_are_the_same_figure(name):
    gpu = get_gpu(name)
    assert float(gpu.usable_text.split()[0]) == gpu.usable_memory_gib
    assert gpu.usable_bytes == int(gpu.usable_memory_gib * 2**30)
