#!/usr/bin/env python3
"""Print each course notebook's core path in words of prose, and the minutes it states.

    python tools/course_words.py            # one line per notebook
    python tools/course_words.py --check    # exit 1 when a core path is over the limit

The core path is every markdown cell outside the optional sections: a section whose heading
starts with "Going deeper" runs to the next heading of the same or a higher level. Words are
counted in the text a student reads: links count their text, not their address; badges,
formulas and HTML anchors count nothing.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
LIMIT = 1200  # words of prose in a core path
OPTIONAL = re.compile(r"^(#{2,3}) Going deeper\b", re.MULTILINE)
HEADING = re.compile(r"^(#{1,6}) ", re.MULTILINE)
MINUTES = re.compile(r"\bAbout (\d+) minutes\b")


def readable(text: str) -> str:
    """The words of a markdown text as a student reads them."""
    text = re.sub(r"\[!\[[^\]]*\]\([^)]*\)\]\([^)]*\)", " ", text)  # badges
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.DOTALL)  # display formulas
    text = re.sub(r"<[^>]+>", " ", text)  # HTML anchors and tags
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    return text


def count_words(text: str) -> int:
    return len(re.findall(r"[A-Za-z0-9$~\"'`(][^\s]*", readable(text)))


def core_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    """The markdown cells of the core path, in order."""
    cells, optional_level = [], 0
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        heading = HEADING.match(cell.source)
        if heading:
            level = len(heading.group(1))
            if OPTIONAL.match(cell.source):
                optional_level = level
                continue
            if optional_level and level <= optional_level:
                optional_level = 0
        if not optional_level:
            cells.append(cell)
    return cells


def optional_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    """The markdown cells of the "Going deeper" sections."""
    core = {id(cell) for cell in core_cells(nb)}
    return [c for c in nb.cells if c.cell_type == "markdown" and id(c) not in core]


def core_words(nb: nbformat.NotebookNode) -> int:
    return sum(count_words(cell.source) for cell in core_cells(nb))


def stated_minutes(nb: nbformat.NotebookNode) -> int | None:
    """The minutes the first cell states ('About 25 minutes'), or None."""
    match = MINUTES.search(nb.cells[0].source) if nb.cells else None
    return int(match.group(1)) if match else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    parser.add_argument("--check", action="store_true", help=f"exit 1 above {LIMIT} words")
    args = parser.parse_args(argv)
    status = 0
    print(f"{'notebook':<38}{'core words':>11}{'optional words':>16}{'minutes':>9}")
    for path in args.paths or sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        words = core_words(nb)
        extra = sum(count_words(c.source) for c in optional_cells(nb))
        minutes = stated_minutes(nb)
        print(f"{path.name:<38}{words:>11,}{extra:>16,}{minutes if minutes else '-':>9}")
        if args.check and (words > LIMIT or minutes is None):
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
