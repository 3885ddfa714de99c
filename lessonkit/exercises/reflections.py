"""The reflection self-check: free-text answers are matched against key points, not graded.

A key word counts as a mention only where no negation stands before it in the same clause
("gradients are not stored" does not mention gradients being stored).
"""

from __future__ import annotations

import re
from typing import Any

from .answer_parsing import _describe
from .check_result import CheckResult

# The longest free-text answer read; longer ones get feedback without being searched.
_MAX_TEXT_CHARS = 20_000


def _check_text(qid: str, question: dict[str, Any], answer: object) -> CheckResult:
    title = question.get("title", "")
    if not isinstance(answer, str):
        return CheckResult(
            qid,
            title,
            "not yet",
            f"Write your answer as text (a string in quotes), got {_describe(answer)}.",
        )
    if len(answer) > _MAX_TEXT_CHARS:
        return CheckResult(
            qid,
            title,
            "not yet",
            f"That is {len(answer):,} characters: explain in a few sentences "
            f"(at most {_MAX_TEXT_CHARS:,} characters).",
        )
    answer = str.__str__(answer)  # a str subclass as plain text
    words = len(answer.split())
    if words < 8:
        return CheckResult(
            qid,
            title,
            "not yet",
            f"Only {words} word{'s' if words != 1 else ''}: explain in a few sentences.",
        )
    text = answer.lower()
    details, found = [], 0
    for point in question["key_points"]:
        hit = any(_affirmed(pattern, text) for pattern in point["patterns"])
        found += hit
        details.append(f"☐ {point['point']} ({_MENTIONED if hit else _NOT_MENTIONED})")
    return CheckResult(
        qid,
        title,
        "self-check",
        f"Self-check, not a grade: judge your answer against each key point below. Its words "
        f"touch {found} of {len(details)} of them; a word is not yet an explanation, so tick a "
        "point only where your answer explains it.",
        details=details,
    )


_MENTIONED = "your answer mentions this"
_NOT_MENTIONED = "not mentioned"
# A negation shortly before a key word in the same clause ("gradients are not stored", "no
# optimizer states") is not a mention of that point.
_NEGATION = re.compile(
    r"\b(?:not(?!\s+(?:only|just)\b)|no|never|without|nor|neither|none|"
    r"cannot)\b|n't\b"
)
_CLAUSE_END = re.compile(r"[.;:!?]|\b(?:but|because|although|though|while|whereas)\b")


def _affirmed(pattern: str, text: str) -> bool:
    """Whether ``pattern`` occurs in ``text`` at least once without a negation in its clause."""
    for match in re.finditer(pattern, text):
        start = max((m.end() for m in _CLAUSE_END.finditer(text, 0, match.start())), default=0)
        end_match = _CLAUSE_END.search(text, match.end())
        clause = text[start : end_match.start() if end_match else len(text)]
        if not _NEGATION.search(clause):
            return True
    return False
