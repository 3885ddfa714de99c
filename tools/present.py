#!/usr/bin/env python3
"""Presenter mode: slides and a Voilà dashboard of a notebook's explorers.

    python tools/present.py slides 01           # artifacts/slides/01_vram_equation.slides.html
    python tools/present.py voila 01            # a dashboard of notebook 1's explorers in Voilà
    python tools/present.py mark                # set the slide metadata in notebooks/*.ipynb
    python tools/present.py mark --check        # exit 1 when a notebook's slide metadata is off

Slides: every notebook carries ``slideshow.slide_type`` cell metadata, set by ``mark`` from the
notebook's headings (its title and each ``##`` section start a slide, ``###`` a sub-slide; the
set-up cells between the title and the first section are skipped; the rest joins the slide
above). ``mark`` is
idempotent: run it after editing or merging notebooks (a test fails when they are out of step).
``slides`` runs the notebook and builds reveal.js slides with ``jupyter nbconvert --to slides``,
charts and explorer pictures included; in JupyterLab the same metadata drives jupyterlab-rise
(the "Render as slideshow" button) with live explorers.

Voilà: ``voila`` writes artifacts/presenter/NN_*.ipynb, holding the notebook's settings and,
under each section's heading, the cells that build its explorers, and serves it with Voilà (code
hidden, widgets live; each explorer has a Reset button). Notebooks 5 and 6 have no explorers.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bootstrap import is_install_cell

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SLIDES = ROOT / "artifacts" / "slides"
DASHBOARDS = ROOT / "artifacts" / "presenter"
EXPLORER_CALL = re.compile(r"^\s*\w+_explorer\(", re.M)


class PresentError(Exception):
    """A notebook that cannot be presented as asked (with what is allowed)."""


def find_notebook(number: str, folder: Path = NOTEBOOKS) -> Path:
    """notebooks/NN_*.ipynb for '1', '01' or a file name."""
    names = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    key = str(number).strip()
    for path in names:
        # isdecimal, not isdigit: '²' is a digit that int() refuses.
        number_matches = key.isdecimal() and len(key) <= 3 and path.name[:2] == f"{int(key):02d}"
        if key in (path.name, path.stem) or number_matches:
            return path
    raise PresentError(
        f"No notebook {number!r}; choose one of "
        f"{', '.join(p.name[:2] for p in names)} ({', '.join(p.stem for p in names)})."
    )


def _first_line(cell: nbformat.NotebookNode) -> str:
    return cell.source.lstrip().splitlines()[0] if cell.source.strip() else ""


def setup_cells(cells: list) -> set[int]:
    """Indices of the set-up cells: after the title, before the first section that is not
    "## Settings" (install, settings, parameters, imports), plus the install cell wherever it
    is (tools/bootstrap.py's, today's or an older one)."""
    first = next(
        (
            i
            for i, c in enumerate(cells)
            if i
            and c.cell_type == "markdown"
            and _first_line(c).startswith("## ")
            and _first_line(c) != "## Settings"
        ),
        len(cells),
    )
    return set(range(1, first)) | {i for i, c in enumerate(cells) if is_install_cell(c)}


def slide_type(cell: nbformat.NotebookNode, index: int, setup: set[int] = frozenset()) -> str:
    """The slide type the rules give a cell (see the module docstring)."""
    if index == 0:
        return "slide"
    if index in setup:
        return "skip"
    first = _first_line(cell)
    if cell.cell_type == "markdown" and first.startswith("## "):
        return "slide"
    if cell.cell_type == "markdown" and first.startswith("### "):
        return "subslide"
    return "-"


def marked(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of ``nb`` whose cells carry the slide types of the rules."""
    nb = copy.deepcopy(nb)
    setup = setup_cells(nb.cells)
    for index, cell in enumerate(nb.cells):
        cell.metadata["slideshow"] = {"slide_type": slide_type(cell, index, setup)}
    return nb


def mark(paths: list[Path], check: bool) -> list[Path]:
    """Set (or with ``check`` only compare) the slide metadata; the paths not in step."""
    off = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
            nb = nbformat.reads(text, as_version=4)
        except (OSError, UnicodeDecodeError, ValueError) as err:  # nbformat's errors are these
            why = " ".join(str(err).split())[:200]
            raise PresentError(f"Cannot read {str(path)!r} as a notebook: {why}") from None
        new = nbformat.writes(marked(nb)) + "\n"
        if new != text:
            off.append(path)
            if not check:
                path.write_text(new, encoding="utf-8")
    return off


def build_slides(
    path: Path, out_dir: Path = SLIDES, execute: bool = True, timeout: int = 600
) -> Path:
    """Run ``jupyter nbconvert --to slides`` on a notebook; the path of the HTML it wrote."""
    out_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "jupyter",
        "nbconvert",
        "--to",
        "slides",
        "--output-dir",
        str(out_dir),
        str(path),
    ]
    if execute:
        command[4:4] = ["--execute", f"--ExecutePreprocessor.timeout={timeout}"]
    env = dict(os.environ, MPLBACKEND=os.environ.get("MPLBACKEND", "Agg"))
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=path.parent)
    if result.returncode != 0:
        raise PresentError(
            f"nbconvert could not build slides of {path.name}:\n{result.stderr[-3000:]}"
        )
    return out_dir / f"{path.stem}.slides.html"


def dashboard(nb: nbformat.NotebookNode, title: str) -> nbformat.NotebookNode:
    """A notebook of the settings and, under their section headings, the explorer cells."""
    cells = nb.cells
    explorers = [
        i for i, c in enumerate(cells) if c.cell_type == "code" and EXPLORER_CALL.search(c.source)
    ]
    if not explorers:
        raise PresentError(
            f"{title} has no explorers to put on a dashboard; notebooks with "
            "explorers: 01, 02, 03 and 04."
        )
    keep = [
        cells[i]
        for i in sorted(setup_cells(cells))
        if cells[i].cell_type == "code" and not is_install_cell(cells[i])
    ]
    out = [nbformat.v4.new_markdown_cell(f"# {title}: explorers")] + [
        copy.deepcopy(c) for c in keep
    ]
    for i in explorers:
        heading = next(
            (
                c
                for c in reversed(cells[:i])
                if c.cell_type == "markdown" and c.source.lstrip().startswith("#")
            ),
            None,
        )
        if heading is not None:
            out.append(nbformat.v4.new_markdown_cell(heading.source.lstrip().splitlines()[0]))
        out.append(copy.deepcopy(cells[i]))
    new = nbformat.v4.new_notebook(cells=out, metadata=copy.deepcopy(nb.metadata))
    for index, cell in enumerate(new.cells):
        cell.metadata = {}
        cell["id"] = f"dashboard-{index}"
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return new


def write_dashboard(path: Path, out_dir: Path = DASHBOARDS) -> Path:
    """artifacts/presenter/NN_*.ipynb for ``path``; its path."""
    nb = nbformat.read(path, as_version=4)
    title = nb.cells[0].source.lstrip("# ").splitlines()[0]
    board = dashboard(nb, title)  # first: a notebook without explorers leaves no folder behind
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / path.name
    nbformat.write(board, target)
    return target


def voila_command(dashboard_path: Path, port: int | None = None, browser: bool = True) -> list[str]:
    """The Voilà command line that serves a dashboard."""
    command = [sys.executable, "-m", "voila", str(dashboard_path)]
    if port is not None:
        command.append(f"--port={port}")
    if not browser:
        command.append("--no-browser")
    return command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    slides = sub.add_parser("slides", help="build reveal.js slides of a notebook")
    slides.add_argument("notebook", help="01 to 06, or a file name")
    slides.add_argument(
        "--no-execute",
        action="store_true",
        help="do not run the notebook first (no charts on the slides)",
    )
    voila = sub.add_parser("voila", help="serve a dashboard of a notebook's explorers")
    voila.add_argument("notebook", help="01 to 04, or a file name")
    voila.add_argument("--port", type=int)
    voila.add_argument("--no-browser", action="store_true")
    voila.add_argument(
        "--print-only",
        action="store_true",
        help="write the dashboard and print the Voilà command, do not start it",
    )
    marks = sub.add_parser("mark", help="set the slide metadata of notebooks/*.ipynb")
    marks.add_argument("--check", action="store_true", help="write nothing; exit 1 when off")
    marks.add_argument("paths", nargs="*", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.what == "mark":
            paths = args.paths or sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
            off = mark(paths, args.check)
            if args.check and off:
                print(
                    "Slide metadata out of step (run python tools/present.py mark): "
                    + ", ".join(p.name for p in off),
                    file=sys.stderr,
                )
                return 1
            print(
                f"{len(paths)} notebooks: slide metadata {'in step' if args.check else 'set'}"
                f"{f' ({len(off)} written)' if off and not args.check else ''}."
            )
            return 0
        path = find_notebook(args.notebook)
        if args.what == "slides":
            print(build_slides(path, execute=not args.no_execute))
            return 0
        target = write_dashboard(path)
        command = voila_command(target, args.port, browser=not args.no_browser)
        print(" ".join(command))
        if args.print_only:
            return 0
        return subprocess.call(command, cwd=ROOT)
    except PresentError as err:
        print(f"present: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
