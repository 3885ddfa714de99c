"""The words of the reflection feedback: the verdict's message, each wrong claim with why it is
wrong, and the model answer, with their figures computed by lessonkit when they are shown."""

from __future__ import annotations

import string
from typing import Any

_MAX_CLAIMS_SHOWN = 3


class _Figures(dict[str, str]):
    """The figures a text names, each computed on first use (expected.FIGURES)."""

    def __missing__(self, name: str) -> str:
        from .expected import FIGURES

        value = FIGURES[name]()
        self[name] = value
        return value


def fill(text: str) -> str:
    """A data text with its ``{figure}`` fields computed now."""
    return string.Formatter().vformat(text, (), _Figures())


def figure_names(text: str) -> list[str]:
    """The ``{figure}`` fields a data text names."""
    return [name for _, name, _, _ in string.Formatter().parse(text) if name]


def model_answer(question: dict[str, Any]) -> str:
    text = question.get("model_answer", "")
    return fill(text) if text else ""


def _claims(quotes: dict[str, str]) -> str:
    from .expected import misconceptions

    parts = []
    for claim_id, quote in list(quotes.items())[:_MAX_CLAIMS_SHOWN]:
        claim = misconceptions()[claim_id]
        parts.append(
            f'You wrote "{quote}": that says {claim["claim"]}, which is wrong. {fill(claim["why"])}'
        )
    more = len(quotes) - _MAX_CLAIMS_SHOWN
    if more > 0:
        parts.append(f"({more} more wrong claim{'s' if more > 1 else ''} after these.)")
    return " ".join(parts)


def feedback_text(
    verdict: str,
    question: dict[str, Any],
    details: list[str],
    quotes: dict[str, str],
    givens: bool,
) -> str:
    """The message of a reflection's CheckResult for its verdict."""
    total = len(details)
    found = sum(d.startswith("✓") for d in details)
    if verdict == "question copied":
        return (
            "Not yet: your answer mostly repeats the question. Answer it in your own words: "
            "say what takes the memory or the time, and why."
        )
    if verdict == "wrong claim":
        return (
            f"Not yet: a claim in your answer is wrong. {_claims(quotes)} Fix the claim, then "
            "check again: the key points below say what else a full answer covers."
        )
    lead = "Self-check, not a grade:"
    if verdict == "complete":
        return (
            f"{lead} your answer touches all {total} key points below, with no claim the check "
            "knows to be wrong. Touching a point is not yet explaining it: read each one "
            "against your answer, then compare it with the model answer."
        )
    if verdict == "partial":
        return (
            f"{lead} your answer touches {found} of {total} key points below. Add the ones "
            "marked not mentioned, each with why it takes memory or time."
        )
    remark = f" {question['givens']['remark']}" if givens and question.get("givens") else ""
    return (
        f"{lead} your answer touches none of the {total} key points below.{remark} Re-read the "
        "question, then compare your answer with the model answer."
    )
