#!/usr/bin/env python3
"""Write the "Check your understanding" quiz at the end of each course notebook from
lessonkit/data/quizzes.json.

    python tools/quiz_cells.py           # write (or refresh) the quiz section of notebooks/NN
    python tools/quiz_cells.py --check   # exit 1 when a notebook's quiz differs from the data

The section is the notebook's last cells, each with an id starting "quiz-": a heading, the
import, then per question its markdown (the question and its lettered options) and a cell that
calls ``quiz(question_id, ...)`` for the student to fill in. Everything before it is left as
it is.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lessonkit.exercises.quiz import quiz_ids, quiz_markdown  # noqa: E402

INTRO = (
    "## Check your understanding\n"
    "\n"
    "A few questions on this notebook. In each cell below a question, put the letter of your "
    "pick in quotes in place of `...` and run the cell: the feedback says why that option is "
    "right or wrong, so a wrong pick teaches as much as a right one."
)
CALL = 'quiz("{qid}", ...)  # your pick: a letter in quotes'


def _cell(cell_id: str, cell_type: str, text: str) -> dict:
    cell: dict = {"cell_type": cell_type, "id": cell_id, "metadata": {}, "source": []}
    cell["source"] = text.splitlines(keepends=True)
    if cell_type == "code":
        cell["execution_count"], cell["outputs"] = None, []
    return cell


def quiz_cells(number: str) -> list[dict]:
    """The quiz section of notebook ``number`` ('01'), as cells."""
    cells = [
        _cell(f"quiz-{number}", "markdown", INTRO),
        _cell(f"quiz-{number}-import", "code", "from lessonkit.exercises import quiz"),
    ]
    for index, qid in enumerate(quiz_ids(number), start=1):
        cells.append(_cell(f"quiz-{number}-{index}", "markdown", quiz_markdown(qid)))
        cells.append(_cell(f"quiz-{number}-{index}-pick", "code", CALL.format(qid=qid)))
    return cells


def with_quiz(notebook: dict, number: str) -> dict:
    """The notebook with its quiz section replaced by (or ended with) the data's."""
    kept = [c for c in notebook["cells"] if not str(c.get("id", "")).startswith("quiz-")]
    before = {c.get("id"): c for c in notebook["cells"] if c not in kept}
    cells = quiz_cells(number)
    for cell in cells:  # what other tools set on these cells stays (present.py's slide types)
        if cell["id"] in before:
            cell["metadata"] = before[cell["id"]].get("metadata", {})
    return {**notebook, "cells": kept + cells}


def dumps(notebook: dict) -> str:
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when off")
    args = parser.parse_args(argv)
    off, paths = [], sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for path in paths:
        text = path.read_text(encoding="utf-8")
        new = dumps(with_quiz(json.loads(text), path.name[:2]))
        if new != text:
            off.append(path.name)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if args.check and off:
        print(
            f"The quiz section is out of step with the data in: {', '.join(off)}. "
            "Run python tools/quiz_cells.py."
        )
        return 1
    done = "Checked" if args.check else f"Wrote ({len(off)} changed)"
    print(f"{done}: the quiz of {len(paths)} notebooks.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
