"""The reflection check: a free-text answer read against key points and known misconceptions.

An answer is split into clauses once. In each clause the check looks for the key points' words
and for the wrong claims students write (the gradients "on the CPU", a CUDA context that costs
nothing, DDR5 as fast as HBM, "16 GB is enough" for a 14 GB model, ...). A key word counts as a
mention only where no negation stands beside it in its clause ("gradients are not stored" does
not mention gradients being stored); a wrong claim counts only where no negation comes before it
("the context is not free" denies a free context, and so mentions the fixed costs). A point the
answer contradicts is never reported as mentioned. Each pattern scans each clause once, so the
check runs in time linear in the answer's length.

The verdict: "wrong claim" (the feedback quotes the claim and says why it is wrong), "complete",
"partial", "off topic", "question copied" or "too short". After an attempt the feedback shows a
model answer. It stays a self-check (nbgrader grades reflections by hand), except that a wrong
claim is "not yet".
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from .answer_parsing import _describe
from .check_result import CheckResult
from .reflection_text import feedback_text, model_answer

VERDICTS = (
    "complete",
    "partial",
    "wrong claim",
    "off topic",
    "question copied",
    "too short",
    "too long",
    "not text",
)
# The longest free-text answer read; longer ones get feedback without being searched.
_MAX_TEXT_CHARS = 20_000
_MIN_WORDS = 8
# An answer whose words are this share of the question's own words repeats the question.
_COPIED_SHARE = 0.8

_MENTIONED = "your answer mentions this"
_CONTRADICTED = "your answer contradicts this"
_NOT_MENTIONED = "not mentioned"

# A negation that cancels a key word: right before it ("no gradients", "not the activations",
# "without any optimizer state"), or on a verb of having or needing a few words before it
# ("does not need gradients", "did not see anything about the allocator"). "Not only", "not just"
# and "not as fast" keep the sentence about the thing.
_NEGATION = re.compile(
    r"(?:\b(?:no|not|without|never|nor|neither)\b(?!\s+(?:only|just|even|as|so|nearly|quite)\b)"
    r"(?:\s+(?:any|the|a|an|their|its|more|extra))?"
    r"|(?:\b(?:not|never)\b|n't\b)\s+(?:[\w'-]+\s+)?(?:need|needs|have|has|store|stores|keep|"
    r"keeps|require|requires|see|include|includes|count|use|uses)\b(?:\s+[\w'-]+){0,4})\s+$"
)
# ... or a negated verb of existence just after it ("gradients are not stored", "the context
# doesn't matter").
_NEGATED_AFTER = re.compile(
    r"[\w'-]*(?:\s+[\w'-]+){0,3}?\s*(?:\b(?:not|never)\b|n't\b)\s*(?:[\w'-]+\s+)?"
    r"(?:stored|kept|needed|required|used|saved|there|present|exist|exists|matter|matters|"
    r"count|counts|counted|involved|allocated|necessary|included|created|computed)\b"
    r"(?!\s+(?:in|on|to|into|onto)\s)"  # "not kept in CPU memory" denies a place, not the thing
)
# A negation before a wrong claim, in its part of the sentence, denies it ("it is not true that
# the context is free", "I don't think the gradients live on the CPU").
_DENIAL = re.compile(r"\b(?:not|no|never|nor|neither)\b(?!\s+(?:only|just)\b)|n't\b")
# Reported claims are not the student's own: "the matrix says full SFT fits one A100".
_REPORTED = re.compile(
    r"\b(?:says|said|claims|claimed|suggests|suggested|according to|supposedly|promises|"
    r"(?:people|many|some|one|you) (?:might |may |would |often )?(?:think|believe|assume))\b"
)
# Where a claim ends: a full stop (not a decimal point), ; ! ? or a colon.
_CLAUSE_END = re.compile(r"[;!?]|[.:](?!\d)")
# A conjunction of contrast starts a new claim within a sentence: what qualifies a claim
# ("if", "with LoRA") does not reach across it.
_CONTRAST = re.compile(r"\b(?:but|although|though|while|whereas|however)\b")
# Where a part of a sentence ends, for the reach of a negation.
_PART_END = re.compile(
    r"[,;!?()]|[.:](?!\d)|\b(?:and|or|so|but|because|since|while|which|then|when|although|"
    r"though|whereas|however)\b"
)
# '<gapN>' in a data pattern: up to N characters that hold no negation.
_GAP = re.compile(r"<gap(\d+)>")
_NO_NEGATION_CHAR = (
    r"(?:(?!\b(?:not|no|never|nor|neither|hardly|but|although|though|while|whereas|however)\b"
    r"|n't).)"
)
_NEGATION_REACH = 60  # characters a negation reaches before a key word


@cache
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(_GAP.sub(lambda m: f"{_NO_NEGATION_CHAR}{{0,{m.group(1)}}}?", pattern))


@dataclass
class Reading:
    """What the check found in an answer, clause by clause."""

    mentioned: set[str] = field(default_factory=set)  # key point ids
    wrong: dict[str, tuple[int, int]] = field(default_factory=dict)  # claim id -> its clause
    denied: set[str] = field(default_factory=set)  # misconceptions the answer denies
    givens: bool = False  # names only what the question already gives

    def contradicted(self, misconceptions: dict[str, dict[str, Any]]) -> set[str]:
        return {misconceptions[m]["contradicts"] for m in self.wrong}


def normalise(answer: str) -> tuple[str, str]:
    """(the answer on one line, its lower case) with typographic quotes made plain."""
    spaced = " ".join(answer.replace("\u2019", "'").replace("\u2018", "'").split())
    lowered = spaced.lower()
    return (spaced if len(spaced) == len(lowered) else lowered), lowered


def _spans(pattern: re.Pattern[str], text: str) -> list[tuple[int, int]]:
    """The (start, end) of the pieces of ``text`` between matches of ``pattern``, in one pass."""
    spans, start = [], 0
    for end in pattern.finditer(text):
        if end.start() > start:
            spans.append((start, end.start()))
        start = end.end()
    if start < len(text):
        spans.append((start, len(text)))
    return spans


def clauses(text: str) -> list[tuple[int, int]]:
    """The (start, end) of each clause of ``text``."""
    return _spans(_CLAUSE_END, text)


class _Parts:
    """Where each part of a sentence starts (after each match of ``pattern``), found in one
    pass: the reach of a negation or of a qualifier."""

    def __init__(self, text: str, pattern: re.Pattern[str]) -> None:
        self.starts = [start for start, _ in _spans(pattern, text)] or [0]

    def start_of(self, at: int) -> int:
        return self.starts[max(bisect.bisect_right(self.starts, at) - 1, 0)]

    def end_of(self, at: int, end: int) -> int:
        """Where the part holding ``at`` ends (at most ``end``)."""
        index = bisect.bisect_right(self.starts, at)
        return min(self.starts[index], end) if index < len(self.starts) else end


def _cancelled(text: str, found: re.Match[str], parts: _Parts, end: int) -> bool:
    """Whether a negation beside a key word cancels its mention."""
    low = max(parts.start_of(found.start()), found.start() - _NEGATION_REACH)
    if _NEGATION.search(text, low, found.start()):
        return True
    return bool(_NEGATED_AFTER.match(text, found.end(), min(end, found.end() + _NEGATION_REACH)))


def read_answer(
    text: str, question: dict[str, Any], misconceptions: dict[str, dict[str, Any]]
) -> Reading:
    """Read a lower-case answer: the key points it mentions, the wrong claims it makes."""
    reading = Reading()
    wanted = [m for m in question.get("misconceptions", []) if m in misconceptions]
    givens = question.get("givens", {}).get("patterns", [])
    parts, contrasts = _Parts(text, _PART_END), _Parts(text, _CONTRAST)
    for start, end in clauses(text):
        for point in question["key_points"]:
            if point["id"] not in reading.mentioned and any(
                not _cancelled(text, found, parts, end)
                for pattern in point["patterns"]
                for found in _compiled(pattern).finditer(text, start, end)
            ):
                reading.mentioned.add(point["id"])
        for claim_id in wanted:
            if claim_id not in reading.wrong:
                claim = misconceptions[claim_id]
                _read_claim(text, (start, end), (parts, contrasts), claim_id, claim, reading)
        if givens and not reading.givens:
            reading.givens = any(_compiled(p).search(text, start, end) for p in givens)
    return reading


def _read_claim(
    text: str,
    clause: tuple[int, int],
    boundaries: tuple[_Parts, _Parts],
    claim_id: str,
    claim: dict[str, Any],
    reading: Reading,
) -> None:
    """Record a wrong claim made in the clause, or denied there (which mentions its point)."""
    start, end = clause
    parts, contrasts = boundaries
    for pattern in claim["patterns"]:
        found = _compiled(pattern).search(text, start, end)
        if found is None:
            continue
        if _DENIAL.search(text, parts.start_of(found.start()), found.start()):
            reading.denied.add(claim_id)
            reading.mentioned.add(claim["contradicts"])
            return
        # What qualifies a claim ("if", "with 8-bit states", "the matrix says") stands before
        # it (since the last "but") or in its own part of the sentence.
        since = max(start, contrasts.start_of(found.start()))
        reach = parts.end_of(found.end() - 1, end)
        unless = claim.get("unless")
        if not _REPORTED.search(text, since, reach) and not (
            unless and _compiled(unless).search(text, since, reach)
        ):
            reading.wrong[claim_id] = (start, end)
        return


def _copied(text: str, question: dict[str, Any]) -> bool:
    words = re.findall(r"[a-z0-9']+", text)
    asked = set(re.findall(r"[a-z0-9']+", question.get("question", "").lower()))
    if not words or not asked:
        return False
    return sum(word in asked for word in words) >= _COPIED_SHARE * len(words)


def verdict_of(reading: Reading, question: dict[str, Any], copied: bool) -> str:
    if copied:
        return "question copied"
    if reading.wrong:
        return "wrong claim"
    found = len(reading.mentioned)
    if found == len(question["key_points"]):
        return "complete"
    return "partial" if found else "off topic"


def _check_text(qid: str, question: dict[str, Any], answer: object) -> CheckResult:
    from .expected import misconceptions as _misconceptions

    title = question.get("title", "")
    if not isinstance(answer, str):
        return CheckResult(
            qid,
            title,
            "not yet",
            f"Write your answer as text (a string in quotes), got {_describe(answer)}.",
            verdict="not text",
        )
    if len(answer) > _MAX_TEXT_CHARS:
        return CheckResult(
            qid,
            title,
            "not yet",
            f"That is {len(answer):,} characters: explain in a few sentences "
            f"(at most {_MAX_TEXT_CHARS:,} characters).",
            verdict="too long",
        )
    shown, text = normalise(str.__str__(answer))  # a str subclass as plain text
    words = len(text.split())
    if words < _MIN_WORDS:
        return CheckResult(
            qid,
            title,
            "not yet",
            f"Only {words} word{'s' if words != 1 else ''}: explain in a few sentences.",
            verdict="too short",
        )
    misconceptions = _misconceptions()
    reading = read_answer(text, question, misconceptions)
    copied = _copied(text, question)
    verdict = verdict_of(reading, question, copied)
    contradicted = reading.contradicted(misconceptions)
    details = []
    for point in question["key_points"]:
        if point["id"] in contradicted:
            details.append(f"✗ {point['point']} ({_CONTRADICTED})")
        elif point["id"] in reading.mentioned:
            details.append(f"✓ {point['point']} ({_MENTIONED})")
        else:
            details.append(f"○ {point['point']} ({_NOT_MENTIONED})")
    status = "not yet" if verdict in ("wrong claim", "question copied") else "self-check"
    quotes = {m: _quote(shown[start:end]) for m, (start, end) in reading.wrong.items()}
    return CheckResult(
        qid,
        title,
        status,
        feedback_text(verdict, question, details, quotes, reading.givens),
        details=details,
        verdict=verdict,
        model_answer="" if verdict == "question copied" else model_answer(question),
    )


def _quote(clause: str) -> str:
    """A clause as the student wrote it (their capitals), shortened."""
    quoted = clause.strip(" ,")
    return quoted if len(quoted) <= 160 else quoted[:157] + "..."
