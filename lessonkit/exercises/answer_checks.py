"""Checkers for number, range, table and choice questions: each compares a read answer with
lessonkit's expected one and words the verdict as a ``CheckResult``."""

from __future__ import annotations

from typing import Any

from ..errors import normalise_name, unknown_name_message
from ..safe_repr import short_str
from .answer_feedback import _compare, _format, _hide_answer, _is_guide_figure, _tolerance
from .answer_parsing import (
    _MAX_CHARS,
    _MAX_ITEMS,
    _describe,
    _is_placeholder,
    _pick,
    _read_number,
    _read_range,
    _Unreadable,
)
from .check_result import CheckResult
from .expected import EXPECTED as _EXPECTED
from .expected import bandwidth_data as _bandwidth_data
from .wrong_choices import reason


def _check_number(qid: str, question: dict[str, Any], answer: object) -> CheckResult:
    unit, title = question.get("unit", ""), question.get("title", "")
    tolerance = _tolerance(question)[2]
    try:
        value = _read_number(answer, unit)
    except _Unreadable as err:
        span = _read_range(answer, unit)
        if span is None:
            message = _hide_answer(str(err), unit, float(_EXPECTED[qid]()), question)
            return CheckResult(qid, title, "not yet", message, tolerance=tolerance)
        return _check_range(qid, question, span)
    expected = float(_EXPECTED[qid]())
    ok, remark = _compare(value, expected, question)
    if ok:
        return CheckResult(
            qid,
            title,
            "correct",
            f"Correct: {_format(value, unit)} (lessonkit: {_format(expected, unit)}).",
            tolerance=tolerance,
        )
    guide = question.get("guide")
    if guide and _is_guide_figure((value, value), guide, unit):
        return CheckResult(
            qid,
            title,
            "not yet",
            f"Not yet: {_format(value, unit)} is {remark.split('.')[0]}: that is what "
            f"the guide says ({guide['answer']}). {guide['says']}",
            tolerance=tolerance,
        )
    return CheckResult(
        qid, title, "not yet", f"Not yet: {_format(value, unit)} is {remark}", tolerance=tolerance
    )


def _check_range(qid: str, question: dict[str, Any], span: tuple[float, float]) -> CheckResult:
    unit, title = question.get("unit", ""), question.get("title", "")
    tolerance = _tolerance(question)[2]
    low, high = span
    expected = float(_EXPECTED[qid]())
    shown = f"{_format(low, unit)} to {_format(high, unit)}"
    if _compare(low, expected, question)[0] and _compare(high, expected, question)[0]:
        return CheckResult(
            qid,
            title,
            "correct",
            f"Correct: {shown} (lessonkit: {_format(expected, unit)}).",
            tolerance=tolerance,
        )
    where = "inside" if low <= expected <= high else "above" if expected > high else "below"
    guide = question.get("guide")
    if guide and _is_guide_figure(span, guide, unit):
        message = (
            f"Not yet: {shown} is the guide's range ({guide['answer']}); lessonkit's "
            f"figure for this question lies {where} it. {guide['says']}"
        )
    else:
        message = (
            f"Not yet: {shown} is a range, and lessonkit's figure lies {where} it. "
            "The question asks for one number."
        )
    return CheckResult(qid, title, "not yet", message, tolerance=tolerance)


def _check_table(qid: str, question: dict[str, Any], answer: object) -> CheckResult:
    unit, title = question.get("unit", ""), question.get("title", "")
    tolerance = _tolerance(question)[2]
    expected: dict[str, float] = _EXPECTED[qid]()
    if not isinstance(answer, dict) or len(answer) > _MAX_ITEMS:
        return CheckResult(
            qid,
            title,
            "not yet",
            f"Expected a dict with one entry per row ({', '.join(expected)}), "
            f"got {_describe(answer)}.",
            tolerance=tolerance,
        )
    by_key = {normalise_name(k): k for k in expected}
    for row, aliases in _row_aliases(question).items():
        by_key |= {normalise_name(alias): row for alias in aliases if row in expected}
    given: dict[str, object] = {}
    details, unknown = [], []
    for written, value in answer.items():
        key = short_str(written, _MAX_CHARS)
        matched = by_key.get(normalise_name(key))
        if matched is None:
            unknown.append(key)
        else:
            given[matched] = value
    right = 0
    for row, exp in expected.items():
        if row not in given or _is_placeholder(given[row]):
            details.append(f"{row}: missing")
            continue
        try:
            value = _read_number(given[row], unit)
        except _Unreadable as err:
            details.append(f"{row}: {_hide_answer(str(err), unit, float(exp), question)}")
            continue
        ok, remark = _compare(value, float(exp), question)
        right += ok
        details.append(f"{row}: {_format(value, unit)} " + ("✔" if ok else f"✘ {remark}"))
    for key in unknown:
        details.append(unknown_name_message(key, expected, "row").replace("Allowed", "Rows"))
    if right == len(expected) and not unknown:
        return CheckResult(
            qid,
            title,
            "correct",
            f"Correct: all {right} rows match lessonkit.",
            tolerance=tolerance,
            details=details,
        )
    return CheckResult(
        qid,
        title,
        "not yet",
        f"Not yet: {right} of {len(expected)} rows match.",
        tolerance=tolerance,
        details=details,
    )


def _row_aliases(question: dict[str, Any]) -> dict[str, list[str]]:
    aliases = dict(question.get("row_aliases", {}))
    if question.get("rows_from") == "bandwidth":
        aliases |= {link["name"]: link.get("aliases", []) for link in _bandwidth_data()}
    return aliases


def _check_choice(qid: str, question: dict[str, Any], answer: object) -> CheckResult:
    title, multi = question.get("title", ""), question["kind"] == "multi"
    expected = _EXPECTED[qid]()
    accepted = {expected} if isinstance(expected, str) else set(expected)
    if multi:
        raw = [answer] if isinstance(answer, str) else answer
        if not isinstance(raw, (list, tuple, set, frozenset)) or len(raw) > _MAX_ITEMS:
            return CheckResult(
                qid, title, "not yet", f"Expected a list of options, got {_describe(answer)}."
            )
    elif isinstance(answer, (list, tuple, set, frozenset)):
        return CheckResult(qid, title, "not yet", "Pick one option (a string), not a list.")
    written: list[object] = list(raw) if multi else [answer]  # type: ignore[call-overload]
    try:
        named = {_pick(item, question): item for item in written}
    except _Unreadable as err:
        return CheckResult(qid, title, "not yet", str(err))
    picks = set(named)
    shown = ", ".join(sorted(picks)) or "nothing"
    if (picks == accepted) if multi else (picks <= accepted):
        return CheckResult(qid, title, "correct", f"Correct: {shown}.")
    # A wrong GPU, environment or model gets the reason it is not the answer.
    reasons = {pick: reason(qid, pick, named[pick]) for pick in sorted(picks - accepted)}
    if multi:
        wrong, missing = len(picks - accepted), len(accepted - picks)
        parts = (
            [f"{wrong} of your picks {'is' if wrong == 1 else 'are'} not right"] if wrong else []
        ) + (
            [f"{missing} right option{'s are' if missing > 1 else ' is'} missing"]
            if missing
            else []
        )
        details = [f"✘ {pick}: {why}" for pick, why in reasons.items() if why]
        return CheckResult(
            qid, title, "not yet", f"Not yet: {' and '.join(parts)}.", details=details
        )
    why = reasons.get(shown, "")
    return CheckResult(
        qid, title, "not yet", f"Not yet: {shown} is not the answer{': ' + why if why else ''}."
    )
