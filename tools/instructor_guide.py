#!/usr/bin/env python3
"""Keep the data-driven parts of docs/instructor-guide.md in step with the exercise bank.

    python tools/instructor_guide.py           # rewrite the marked blocks
    python tools/instructor_guide.py --check   # exit 1 when a block differs from the data

Two blocks per notebook NN are written from lessonkit/data/exercises.json: the common mistakes
(``<!-- mistakes:NN -->``: each recorded mistake and the guide figure a question warns about,
with the hint ``check`` gives) and the points (``<!-- points:NN -->``: autograded and
hand-graded points, as nbgrader's test cells in solutions/ carry them).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "instructor-guide.md"
sys.path.insert(0, str(ROOT))

from lessonkit.exercises.checking import question_ids  # noqa: E402
from lessonkit.exercises.expected import bank  # noqa: E402

BLOCK = re.compile(r"(<!-- (mistakes|points):(\d\d) -->\n)(.*?)(<!-- /\2 -->)", re.S)


def _ratio(value: float) -> str:
    return f"{value:g}"


def mistakes_block(section: str) -> str:
    lines = []
    for qid in question_ids(section):
        question = bank()[qid]
        for mistake in question.get("mistakes", []):
            lines.append(
                f"- {qid} {question['title']}: an answer {_ratio(mistake['ratio'])}x the "
                f"expected one: {mistake['hint']}"
            )
        if "guide" in question:
            lines.append(
                f"- {qid} {question['title']}: the guide's figure "
                f"({question['guide']['answer']}): {question['guide']['says']}"
            )
    return "\n".join(lines or ["- No recorded mistakes in the exercise data."]) + "\n"


def points_block(section: str) -> str:
    auto = [q for q in question_ids(section) if bank()[q]["kind"] != "text"]
    manual = [q for q in question_ids(section) if bank()[q]["kind"] == "text"]
    a, m = (sum(bank()[q]["points"] for q in qs) for qs in (auto, manual))
    by_hand = f"{m} by hand ({', '.join(manual)})" if manual else "0 by hand"
    return f"Points: {a} autograded ({', '.join(auto)}) + {by_hand} = {a + m}.\n"


def render(text: str) -> str:
    """The guide with every marked block written from the data."""
    sections = {q[:2]: bank()[q]["section"] for q in bank()}

    def block(match: re.Match) -> str:
        kind, number = match.group(2), match.group(3)
        body = (mistakes_block if kind == "mistakes" else points_block)(sections[number])
        return f"{match.group(1)}{body}{match.group(5)}"

    return BLOCK.sub(block, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when off")
    args = parser.parse_args(argv)
    text = GUIDE.read_text(encoding="utf-8")
    new = render(text)
    if args.check:
        if new != text:
            print(
                "docs/instructor-guide.md is out of step with the exercise data "
                "(run python tools/instructor_guide.py)",
                file=sys.stderr,
            )
            return 1
        print("docs/instructor-guide.md is in step with the exercise data.")
        return 0
    if new != text:
        GUIDE.write_text(new, encoding="utf-8")
    print("docs/instructor-guide.md: blocks written from the exercise data.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
