"""Keep committed notebooks clean: outputs only in output-checked cells, no widget state.

    python tools/strip_notebooks.py            # strip notebooks/*.ipynb in place
    python tools/strip_notebooks.py --check    # exit 1 and list the notebooks that need stripping
    python tools/strip_notebooks.py --execute  # re-run, store fresh outputs of the checked cells

A cell is output-checked when it carries the tag ``nbval-check-output`` in its metadata, where
nbval reads it and a student never sees it (the comment ``# NBVAL_CHECK_OUTPUT`` in the source
is read too); nbval (``--nbval-lax``) compares only those cells. Their stored outputs
must be plain text: anything else (images, widgets, HTML) is dropped. Run ``--execute`` after a
change to lessonkit that moves a taught number, and review the diff.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
CHECK_MARK = "# NBVAL_CHECK_OUTPUT"
CHECK_TAG = "nbval-check-output"
# Cell metadata worth keeping; the rest (execution timings, papermill, scrolling) is noise.
# cellView and jupyter hide the install cell (Colab's form view, JupyterLab's hidden input).
KEEP_CELL_METADATA = ("tags", "slideshow", "cellView", "jupyter")
TEXT_MIME = "text/plain"


def is_checked(cell: nbformat.NotebookNode) -> bool:
    """True for a code cell whose outputs nbval compares under ``--nbval-lax``."""
    return cell.cell_type == "code" and (
        CHECK_MARK in cell.source or CHECK_TAG in cell.get("metadata", {}).get("tags", [])
    )


def _text_only(outputs: list) -> list:
    kept = []
    for out in outputs:
        if out.output_type == "stream" and out.name == "stdout":
            # The kernel splits printed text into chunks at random: store it as one output.
            if kept and kept[-1].output_type == "stream":
                kept[-1] = copy.deepcopy(kept[-1])
                kept[-1].text += out.text
            else:
                kept.append(out)
        elif out.output_type == "execute_result" and TEXT_MIME in out.get("data", {}):
            out = copy.deepcopy(out)
            out.data = {TEXT_MIME: out.data[TEXT_MIME]}
            out.metadata = {}
            kept.append(out)
    return kept


def strip(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Return a copy of ``nb`` with outputs only in checked cells and no widget state."""
    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
    nb.metadata.pop("papermill", None)
    nb.metadata.pop("execution", None)
    nb.metadata["kernelspec"] = {
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
        "name": "python3",
    }
    nb.metadata["language_info"] = {"name": "python"}
    for cell in nb.cells:
        cell.metadata = {
            k: v for k, v in cell.get("metadata", {}).items() if k in KEEP_CELL_METADATA
        }
        if cell.cell_type != "code":
            cell.pop("outputs", None)
            cell.pop("execution_count", None)
            continue
        if is_checked(cell):
            cell.outputs = _text_only(cell.outputs)
            if not cell.outputs:
                cell.execution_count = None
        else:
            cell.outputs = []
            cell.execution_count = None
    return nb


def problems(nb: nbformat.NotebookNode) -> list[str]:
    """What keeps ``nb`` from being clean, one line per problem (empty when clean)."""
    found = []
    if "widgets" in nb.metadata:
        found.append("notebook metadata holds widget state ('widgets')")
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if not is_checked(cell) and (cell.outputs or cell.execution_count is not None):
            found.append(f"cell {index} has outputs but is not an output-checked cell")
        elif is_checked(cell) and cell.outputs != _text_only(cell.outputs):
            found.append(f"cell {index} (checked) holds outputs other than plain text")
    return found


def execute(path: Path, timeout: int = 600) -> nbformat.NotebookNode:
    """Run ``path`` top to bottom in a fresh kernel and return the executed notebook."""
    from nbclient import NotebookClient

    os.environ.setdefault("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    ).execute()
    return nb


def _write_if_changed(path: Path, nb: nbformat.NotebookNode) -> bool:
    text = nbformat.writes(nb) + "\n"
    if path.read_text(encoding="utf-8") == text:
        return False
    path.write_text(text, encoding="utf-8")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "paths", nargs="*", type=Path, help="notebooks (default: notebooks/*.ipynb)"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--check", action="store_true", help="only report notebooks that are not clean"
    )
    mode.add_argument(
        "--execute",
        action="store_true",
        help="re-run each notebook and store fresh outputs of its checked cells",
    )
    args = parser.parse_args(argv)
    paths = args.paths or sorted(NOTEBOOKS.glob("*.ipynb"))
    status = 0
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        if args.check:
            for problem in problems(nb) + (
                ["not stripped"]
                if nbformat.writes(strip(nb)) + "\n" != path.read_text(encoding="utf-8")
                else []
            ):
                print(f"{path}: {problem}")
                status = 1
            continue
        if args.execute:
            nb = execute(path)
        if _write_if_changed(path, strip(nb)):
            print(f"updated {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
