"""Exercise checks: ``check("02.3", answer)`` says correct or not yet, inside the notebook.

The question bank (kind, unit, tolerance, hints, key points) lives in ``data/exercises.json``.
Every expected answer is computed when it is checked, from lessonkit itself (the calculator, the
catalogs, the bandwidth table: see exercises/expected.py), so it cannot drift from the course.
Odd answers (None, text where a number is expected, a list, NaN, an object whose methods raise,
10 MB of text, a function that loops forever or calls sys.exit) never raise: they get feedback.
Hints come in steps: a nudge after the first wrong try, the method after the second, the
recipe (where there is one) after that.

The work is split by job: answer_parsing reads answers, answer_feedback words figures and
diagnoses mistakes, answer_checks grades numbers, tables and choices, reflections runs the
free-text self-check, student_code runs a student's function under a time limit, and
check_result is the feedback itself. This module is the public API over them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from typing import Any

from ..errors import LessonkitError
from ..safe_repr import describe_error, short_repr, short_str
from .answer_checks import _check_choice, _check_number, _check_table
from .answer_parsing import _describe, _is_placeholder
from .check_result import STATUSES, CheckResult, _ipython
from .expected import EXPECTED as _EXPECTED
from .expected import bandwidth_ladder
from .expected import bank as _bank
from .reflection_text import fill
from .reflections import _MENTIONED, _check_text
from .student_code import _check_function

__all__ = [
    "STATUSES",
    "CheckResult",
    "answer_key",
    "bandwidth_ladder",
    "check",
    "hint",
    "key_points_found",
    "options",
    "question_ids",
]


# ----- the bank -----------------------------------------------------------------------------
def question_ids(section: str | None = None) -> list[str]:
    """The question ids, all or those of one section ('01' or '01_vram_equation')."""
    ids = list(_bank())
    if section is None:
        return ids
    prefix = str(section)[:2]
    return [qid for qid in ids if qid.startswith(prefix + ".")]


def _question(question_id: object) -> tuple[str, dict[str, Any]]:
    qid = short_str(question_id, 100).strip()
    match = re.fullmatch(r"(\d{1,2})\.(\d+)", qid)
    if match:
        qid = f"{int(match.group(1)):02d}.{match.group(2)}"
    if qid not in _bank():
        same_section = question_ids(qid[:2]) if re.fullmatch(r"\d\d\..*", qid) else []
        if same_section:
            raise LessonkitError(
                f"Unknown question id {str(question_id)!r}. Section {qid[:2]} has "
                f"{', '.join(same_section)}."
            )
        close = difflib.get_close_matches(qid, question_ids(), n=3, cutoff=0.6)
        hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise LessonkitError(
            f"Unknown question id {str(question_id)!r}.{hint} "
            f"Question ids: {', '.join(question_ids())}."
        )
    return qid, _bank()[qid]


def hint(question_id: str, step: int = 1) -> str:
    """A question's hint at ``step``: 1 is a nudge, 2 the method, 3 (where there is one) the
    recipe; a step past the last gives the last. ``check`` shows step 1 after the first wrong
    try in a notebook, step 2 after the second, and so on."""
    _, question = _question(question_id)
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise LessonkitError(f"step must be a whole number from 1, got {short_repr(step)}.")
    steps: list[str] = question.get("hints", [])
    return steps[min(step, len(steps)) - 1] if steps else ""


# Wrong tries of each question shown in this session: the hint moves one step per try.
_WRONG_TRIES: dict[str, int] = {}


def _hint_for_try(qid: str, question: dict[str, Any], count: bool) -> str:
    """The hint for this wrong try, counted only when the feedback is shown (a silent check,
    such as nbgrader's autograde cell, does not move it)."""
    steps: list[str] = question.get("hints", [])
    if not steps:
        return ""
    tries = _WRONG_TRIES.get(qid, 0) + 1
    if count:
        _WRONG_TRIES[qid] = tries
    else:
        tries = max(tries - 1, 1)
    step = min(tries, len(steps))
    more = " Check again after your next try for the next hint." if step < len(steps) else ""
    return f"({step} of {len(steps)}) {steps[step - 1]}{more}"


def options(question_id: str) -> list[str] | dict[str, dict[str, Any]]:
    """The options of a choice question: names, or name -> the run settings it stands for."""
    _, question = _question(question_id)
    found = question.get("options", [])
    if any(isinstance(o, dict) and "settings" in o for o in found):
        return {o["name"]: dict(o["settings"]) for o in found}
    return [o if isinstance(o, str) else o["name"] for o in found]


def answer_key(question_id: str) -> Any:
    """The expected answer, computed now from lessonkit (what check compares against)."""
    qid, _ = _question(question_id)
    return _EXPECTED[qid]()


# ----- check --------------------------------------------------------------------------------
def check(question_id: str, answer: object = ..., *, show: bool = True) -> CheckResult:
    """Check an answer and show the feedback (HTML in a notebook, text elsewhere).

    An untouched placeholder (``...``, None, "Your answer here") reports "not answered" and
    never stops the notebook; neither does any other odd answer.
    """
    qid, question = _question(question_id)
    title = question.get("title", "")
    try:
        placeholder = _is_placeholder(answer)
    except Exception:  # e.g. a str subclass whose methods raise: not a placeholder
        placeholder = False
    if placeholder:
        result = CheckResult(
            qid,
            title,
            "not answered",
            "Not answered yet: replace the placeholder with your answer and run this cell again.",
        )
    else:
        result = _grade(qid, question, answer)
        if result.status == "not yet" and not result.hint:
            result.hint = _hint_for_try(qid, question, count=show)
        if result.status == "correct":
            _WRONG_TRIES.pop(qid, None)
            if question.get("explanation"):
                result.message += " " + fill(question["explanation"])
    if show:
        _show(result)
    return result


# What each kind of question wants, for answers the checker cannot read at all.
_WANTED = {
    "number": "one number, such as 7.5 or '7.5 GB'",
    "table": "a dict with one number per row",
    "choice": "the name of an option (a string)",
    "multi": "a list of option names",
    "text": "a few sentences (a string in quotes)",
    "function": "your function itself (its name, without brackets)",
}


def _grade(qid: str, question: dict[str, Any], answer: object) -> CheckResult:
    """The checker's verdict. An answer whose own methods raise (``__float__``, ``__iter__``,
    ``__getattr__``, ...) gets feedback naming what went wrong, not a traceback."""
    try:
        return _CHECKERS[question["kind"]](qid, question, answer)
    except Exception as err:
        return CheckResult(
            qid,
            question.get("title", ""),
            "not yet",
            f"Could not read {_describe(answer)}: using it raised "
            f"{describe_error(err, 120)}. Expected "
            f"{_WANTED.get(question['kind'], 'an answer')}.",
        )


def _show(result: CheckResult) -> None:
    shell = _ipython()
    if shell is None:
        print(result)
        return
    from IPython.display import display

    display(result)  # type: ignore[no-untyped-call]
    result._shown_in = shell.execution_count


def key_points_found(question_id: str, answer: str) -> tuple[int, int]:
    """(key points an answer mentions, key points) for a free-text question."""
    result = check(question_id, answer, show=False)
    return sum(d.endswith(f"({_MENTIONED})") for d in result.details), len(result.details)


_CHECKERS: dict[str, Callable[[str, dict[str, Any], object], CheckResult]] = {
    "number": _check_number,
    "table": _check_table,
    "choice": _check_choice,
    "multi": _check_choice,
    "text": _check_text,
    "function": _check_function,
}
