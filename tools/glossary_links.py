#!/usr/bin/env python3
"""Every term of docs/glossary.md is defined where a course notebook first uses it, or linked.

    python tools/glossary_links.py           # link each first use that is not defined
    python tools/glossary_links.py --check   # exit 1 and list the first uses left bare

A first use counts as defined when the term is in **bold** there (the notebook defines it in
place) or links to its entry of the glossary. Uses in headings, code, formulas and other links
do not count, and the quiz at the end of a notebook (written by tools/quiz_cells.py) is left
alone. A first use left bare becomes a link to the glossary entry.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
import tomllib

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
GLOSSARY = ROOT / "docs" / "glossary.md"
_SETTINGS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]
GLOSSARY_URL = (  # where the notebooks' badges point (tools/set_repository.py sets both)
    f"https://github.com/{_SETTINGS['lessonkit']['repository']}/blob/"
    f"{_SETTINGS['lessonkit']['release']}/docs/glossary.md"
)
ENTRY = re.compile(r'<a id="([\w-]+)"></a>\*\*([^*]+)\*\*:')
SKIPPED = re.compile(
    r"`[^`]*`|\$\$.*?\$\$|\$[^$\n]+\$|^#{1,6} [^\n]*$|\[[^\]]*\]\([^)]*\)|https?://\S+",
    re.MULTILINE | re.DOTALL,
)
BOLD = re.compile(r"\*\*(.+?)\*\*", re.DOTALL)


@dataclass(frozen=True)
class Term:
    text: str
    anchor: str

    @property
    def pattern(self) -> re.Pattern[str]:
        stem = self.text[:-1] if self.text.endswith("s") and len(self.text) > 4 else self.text
        words = r"[ -]".join(re.escape(w) for w in stem.split())
        mixed_case = any(ch.isupper() for ch in stem[1:])
        flags = 0 if mixed_case else re.IGNORECASE
        return re.compile(rf"(?<![\w-]){words}s?(?![\w])", flags)


def glossary_terms(text: str | None = None) -> list[Term]:
    """The glossary's terms, longest first ('bf16, fp16, fp32' gives three terms)."""
    text = GLOSSARY.read_text(encoding="utf-8") if text is None else text
    terms = [
        Term(name.strip(), anchor)
        for anchor, names in ENTRY.findall(text)
        for name in names.split(",")
    ]
    return sorted(terms, key=lambda t: -len(t.text))


def _uses(text: str, terms: list[Term]) -> list[tuple[int, int, Term]]:
    """(start, end, term) of each use in prose, a use inside a longer term's left out."""
    skipped = [m.span() for m in SKIPPED.finditer(text)]
    found: list[tuple[int, int, Term]] = []
    for term in terms:  # longest first
        for match in term.pattern.finditer(text):
            start, end = match.span()
            if any(a <= start < b for a, b in skipped):
                continue
            if any(a <= start < b or a < end <= b for a, b, _ in found):
                continue
            found.append((start, end, term))
    return sorted(found, key=lambda use: use[0])


def _glossary_links(text: str) -> set[str]:
    return set(re.findall(r"glossary\.md#([\w-]+)\)", text))


def first_uses(
    nb: nbformat.NotebookNode, terms: list[Term]
) -> list[tuple[int, int, int, Term, bool]]:
    """(cell index, start, end, term, defined) for the first use of each term in ``nb``."""
    seen: set[str] = set()
    out = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown" or str(cell.get("id", "")).startswith("quiz-"):
            continue
        linked = _glossary_links(cell.source)
        bold = [m.span() for m in BOLD.finditer(cell.source)]
        for term in terms:
            if term.text not in seen and term.anchor in linked and _linked(cell.source, term):
                seen.add(term.text)
        for start, end, term in _uses(cell.source, terms):
            if term.text in seen:
                continue
            seen.add(term.text)
            defined = any(a <= start and end <= b for a, b in bold)
            out.append((index, start, end, term, defined))
    return out


def _linked(text: str, term: Term) -> bool:
    """True when ``text`` links ``term`` itself to its glossary entry."""
    for label in re.findall(rf"\[([^\]]*)\]\([^)]*glossary\.md#{term.anchor}\)", text):
        if term.pattern.search(label.strip("`")):
            return True
    return False


def bare(nb: nbformat.NotebookNode, terms: list[Term]) -> list[str]:
    """The first uses neither defined nor linked, one line each."""
    return [
        f"cell {index}: {nb.cells[index].source[start:end]!r} ({term.anchor})"
        for index, start, end, term, defined in first_uses(nb, terms)
        if not defined
    ]


def link(nb: nbformat.NotebookNode, terms: list[Term]) -> int:
    """Link each bare first use to its glossary entry; the number linked."""
    count = 0
    while True:
        todo = [u for u in first_uses(nb, terms) if not u[4]]
        if not todo:
            return count
        index, start, end, term, _ = todo[0]
        source = nb.cells[index].source
        word = source[start:end]
        nb.cells[
            index
        ].source = f"{source[:start]}[{word}]({GLOSSARY_URL}#{term.anchor}){source[end:]}"
        count += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    parser.add_argument("--check", action="store_true", help="only report bare first uses")
    args = parser.parse_args(argv)
    terms = glossary_terms()
    status = 0
    for path in args.paths or sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        if args.check:
            for line in bare(nb, terms):
                print(f"{path.name} {line}")
                status = 1
            continue
        linked = link(nb, terms)
        if linked:
            nbformat.write(nb, path)
            print(f"{path.name}: {linked} first uses linked to the glossary")
    return status


if __name__ == "__main__":
    sys.exit(main())
