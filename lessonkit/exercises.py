"""Exercise checks: ``check("02.3", answer)`` says correct or not yet, inside the notebook.

The question bank (kind, unit, tolerance, hints, key points) lives in ``data/exercises.json``.
Every expected answer is computed when it is checked, from lessonkit itself (the calculator, the
catalogs, the bandwidth table: see exercise_answers.py), so it cannot drift from the course.
Odd answers (None, text where a number is expected, a list, NaN, an object whose methods raise,
10 MB of text, a function that loops forever or calls sys.exit) never raise and are answered
within a second: they get feedback.
"""

from __future__ import annotations

import difflib
import html
import math
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import LessonkitError, normalise_name, unknown_name_message
from .exercise_answers import CATALOGS as _CATALOGS
from .exercise_answers import EXPECTED as _EXPECTED
from .exercise_answers import bandwidth_data as _bandwidth_data
from .exercise_answers import bandwidth_ladder
from .exercise_answers import bank as _bank
from .faketorch import StudentExit, TimeLimitExceeded, run_with_fake_torch
from .safe_repr import describe_error, short_repr, short_str
from .units import GB, GiB

__all__ = ["CheckResult", "STATUSES", "answer_key", "bandwidth_ladder", "check", "hint",
           "key_points_found", "options", "question_ids"]

STATUSES = ("correct", "not yet", "not answered", "self-check")
PLACEHOLDER_TEXT = "Your answer here"
_COLOURS = {"correct": "#2e7d32", "not yet": "#e65100", "not answered": "#757575",
            "self-check": "#1565c0"}
_ICONS = {"correct": "✔", "not yet": "✘", "not answered": "…", "self-check": "☐"}
# The longest answer read as a number or a name, and as a free-text answer; longer ones get
# feedback without being parsed (so any answer is checked within a second).
_MAX_CHARS = 200
_MAX_TEXT_CHARS = 20_000
# The most rows of a table or picks of a multiple choice read.
_MAX_ITEMS = 100
# Seconds a student's function may run, all of its cases together.
_FUNCTION_TIME_LIMIT = 0.6


# ----- the result ---------------------------------------------------------------------------
@dataclass
class CheckResult:
    """Feedback on one answer. ``correct`` is None when there is nothing to grade."""

    question_id: str
    title: str
    status: str
    message: str
    hint: str = ""
    tolerance: str = ""
    details: list[str] = field(default_factory=list)
    _shown_in: object = field(default=None, repr=False, compare=False)

    @property
    def correct(self) -> bool | None:
        return {"correct": True, "not yet": False}.get(self.status)

    def __str__(self) -> str:
        lines = [f"{self.question_id} {self.title}: {self.status.upper()}", self.message]
        lines += [f"  {d}" for d in self.details]
        if self.tolerance:
            lines.append(self.tolerance)
        if self.hint:
            lines.append(f"Hint: {self.hint}")
        return "\n".join(line for line in lines if line)

    def __repr__(self) -> str:
        return f"<CheckResult {self.question_id}: {self.status}>"

    def _repr_html_(self) -> str:
        colour = _COLOURS.get(self.status, "#555")
        esc = html.escape
        details = "".join(f"<li>{esc(d)}</li>" for d in self.details)
        parts = [
            f"<div class='lessonkit-check' data-question='{esc(self.question_id)}' "
            f"data-status='{esc(self.status)}' style='border-left:4px solid {colour};"
            f"padding:4px 10px;margin:4px 0'>",
            f"<b style='color:{colour}'>{_ICONS.get(self.status, '')} {esc(self.question_id)} "
            f"{esc(self.title)}: {esc(self.status)}</b>",
            f"<div>{esc(self.message)}</div>",
            f"<ul style='margin:2px 0'>{details}</ul>" if details else "",
            f"<div><small>{esc(self.tolerance)}</small></div>" if self.tolerance else "",
            f"<div><i>Hint: {esc(self.hint)}</i></div>" if self.hint else "",
            "</div>",
        ]
        return "".join(parts)

    def _ipython_display_(self) -> None:
        # check() has already shown this result in the current cell: don't show it twice
        # when it is also the cell's last expression.
        shell = _ipython()
        if shell is not None and self._shown_in == shell.execution_count:
            self._shown_in = None
            return
        from IPython.display import display

        display({"text/plain": str(self), "text/html": self._repr_html_()}, raw=True)


def _ipython() -> Any:
    module = sys.modules.get("IPython")
    return module.get_ipython() if module is not None else None


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
            raise LessonkitError(f"Unknown question id {str(question_id)!r}. Section {qid[:2]} has "
                                 f"{', '.join(same_section)}.")
        close = difflib.get_close_matches(qid, question_ids(), n=3, cutoff=0.6)
        hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise LessonkitError(f"Unknown question id {str(question_id)!r}.{hint} "
                             f"Question ids: {', '.join(question_ids())}.")
    return qid, _bank()[qid]


def hint(question_id: str) -> str:
    """The hint of a question (also shown by check when an answer is not right yet)."""
    return _question(question_id)[1]["hint"]


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
    kind = question["kind"]
    title = question.get("title", "")
    try:
        placeholder = _is_placeholder(answer)
    except Exception:  # e.g. a str subclass whose methods raise: not a placeholder
        placeholder = False
    if placeholder:
        result = CheckResult(qid, title, "not answered",
                             "Not answered yet: replace the placeholder with your answer and run "
                             "this cell again.")
    else:
        result = _grade(qid, question, answer)
        if result.status == "not yet" and not result.hint:
            result.hint = question.get("hint", "")
        if result.status == "correct" and question.get("explanation"):
            result.message += " " + question["explanation"]
    if show:
        _show(result)
    return result


# What each kind of question wants, for answers the checker cannot read at all.
_WANTED = {"number": "one number, such as 13.5 or '13.5 GB'",
           "table": "a dict with one number per row", "choice": "the name of an option (a string)",
           "multi": "a list of option names", "text": "a few sentences (a string in quotes)",
           "function": "your function itself (its name, without brackets)"}


def _grade(qid: str, question: dict[str, Any], answer: object) -> CheckResult:
    """The checker's verdict. An answer whose own methods raise (``__float__``, ``__iter__``,
    ``__getattr__``, ...) gets feedback naming what went wrong, not a traceback."""
    try:
        return _CHECKERS[question["kind"]](qid, question, answer)
    except Exception as err:
        return CheckResult(qid, question.get("title", ""), "not yet",
                           f"Could not read {_describe(answer)}: using it raised "
                           f"{describe_error(err, 120)}. Expected "
                           f"{_WANTED.get(question['kind'], 'an answer')}.")


def _show(result: CheckResult) -> None:
    shell = _ipython()
    if shell is None:
        print(result)
        return
    from IPython.display import display

    display(result)
    result._shown_in = shell.execution_count


def _is_placeholder(answer: object) -> bool:
    if answer is ... or answer is None:
        return True
    if isinstance(answer, str):
        key = normalise_name(str.strip(answer)[:1000])  # any text: only its start can be a placeholder
        return not key or key.startswith(normalise_name(PLACEHOLDER_TEXT))
    return False


def _describe(answer: object) -> str:
    """The answer as shown in feedback: its repr, at most 60 characters, whatever it is."""
    return short_repr(answer, 60)


# ----- numbers with units -------------------------------------------------------------------
# Unit words accepted for each kind of quantity, as a factor to the quantity's base unit.
_UNITS: dict[str, dict[str, float]] = {
    "GB": {"b": 1, "byte": 1, "bytes": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
           "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40},
    "s": {"s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1, "ms": 1e-3,
          "millisecond": 1e-3, "milliseconds": 1e-3, "min": 60, "mins": 60, "minute": 60,
          "minutes": 60, "h": 3600, "hour": 3600, "hours": 3600},
    "h": {"h": 1, "hr": 1, "hrs": 1, "hour": 1, "hours": 1, "min": 1 / 60, "minutes": 1 / 60,
          "d": 24, "day": 24, "days": 24},
    "$": {"usd": 1, "dollar": 1, "dollars": 1},
    "$/h": {"usd": 1, "dollar": 1, "dollars": 1},
    "x": {"x": 1, "×": 1, "times": 1},
    "B/param": {"b": 1, "byte": 1, "bytes": 1},
    "params": {"k": 1e3, "m": 1e6, "million": 1e6, "b": 1e9, "billion": 1e9},
    "GPUs": {"gpu": 1, "gpus": 1},
    "GiB": {"gib": 1, "gb": GB / GiB, "mib": 1 / 1024, "b": 1 / GiB, "bytes": 1 / GiB},
    "": {},
}
# Words that only restate the unit ("$1.29 per hour", "16 bytes/param"): dropped before lookup.
_UNIT_NOISE = {
    "$/h": ("perhour", "anhour", "/hour", "/hr", "/h", "pergpu", "/gpu", "$"),
    "$": ("$",),
    "B/param": ("perparameter", "perparam", "/parameter", "/param"),
}
# Matched against stripped text, and written so that no part can backtrack over another: the
# unit is the rest of the text, whatever it is (checked against the unit table afterwards).
_NUMBER_RE = re.compile(r"(?:us)?\$?\s*([-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*(.*)",
                        re.S)


def _match_number(text: str) -> re.Match[str] | None:
    return _NUMBER_RE.fullmatch(str.strip(text)) if len(text) <= _MAX_CHARS else None


class _Unreadable(Exception):
    """The answer could not be read as the kind of value the question wants."""


def _read_number(answer: object, unit: str) -> float:
    """An answer as a float in the question's base unit (bytes for 'GB'), or _Unreadable."""
    example = f"a number such as {_EXAMPLES.get(unit, '42')}"
    if hasattr(answer, "total_bytes") and hasattr(answer, "breakdown"):
        raise _Unreadable("That is a whole MemoryReport: answer with the number the question asks "
                          "for, such as report.total_bytes or report.breakdown['gradients'].")
    if isinstance(answer, bool) or isinstance(answer, (list, tuple, set, dict)):
        raise _Unreadable(f"Expected one number ({example}), got {_describe(answer)}.")
    if isinstance(answer, str):
        if len(answer) > _MAX_CHARS:
            raise _Unreadable(f"Expected {example}, got {len(answer):,} characters of text "
                              f"({_describe(answer)}).")
        match = _match_number(answer)
        if not match:
            raise _Unreadable(f"Could not read {_describe(answer)} as {example}.")
        digits, unit_text = match.groups()
        if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d*)?", digits):
            digits = digits.replace(",", "")
        elif digits.count(",") == 1 and "." not in digits:
            digits = digits.replace(",", ".")  # a decimal comma
        try:
            value = float(digits)
        except ValueError:
            raise _Unreadable(f"Could not read {_describe(answer)} as {example}.") from None
        key = unit_text.lower().replace(" ", "")
        for noise in _UNIT_NOISE.get(unit, ()):
            key = key.replace(noise, "")
        if key:
            factors = _UNITS.get(unit, {})
            if key not in factors:
                allowed = ", ".join(sorted(factors)) or "no unit"
                raise _Unreadable(f"Could not read the unit {unit_text!r} in {_describe(answer)}; "
                                  f"use {allowed}.")
            value *= factors[key]
        elif unit == "GB":
            value = _bare_bytes(value)
    else:
        try:
            value = float(answer)  # int, float, numpy scalars
        except Exception:  # not a number, too large for a float, or a __float__ that raises
            raise _Unreadable(f"Expected {example}, got {_describe(answer)}.") from None
        if unit == "GB":
            value = _bare_bytes(value)
    if not math.isfinite(value):
        raise _Unreadable(f"Expected a finite number ({example}), got {_describe(answer)}.")
    return value


def _bare_bytes(value: float) -> float:
    # A bare number is GB unless it is clearly a byte count (16 -> 16 GB, 16e9 -> 16e9 bytes).
    return value if abs(value) >= 1e5 else value * GB


_EXAMPLES = {"GB": "'13.5 GB' or 13.5 (GB)", "s": "'0.15 s' or 0.15 (seconds)",
             "h": "'10 h' or 10 (hours)", "$": "'$12.50' or 12.5", "$/h": "'$1.29/h' or 1.29",
             "x": "'4x' or 4", "B/param": "'16 B/param' or 16", "params": "'8.4M' or 8.4e6",
             "GPUs": "2", "GiB": "'2.5 GiB' or 2.5"}


def _format(value: float, unit: str) -> str:
    if abs(value) >= 1e21:  # far beyond any answer: keep it short
        return f"{value:.3g} {'bytes' if unit == 'GB' else unit}".rstrip()
    if unit == "GB":
        return f"{value / GB:,.{2 if abs(value) < 10 * GB else 1}f} GB"
    if unit in ("$", "$/h"):
        return f"${value:,.2f}{'/h' if unit == '$/h' else ''}"
    if unit == "params":
        return f"{value / 1e6:,.2f}M" if value < 1e9 else f"{value / 1e9:,.2f}B"
    if unit == "GiB":
        return f"{value:,.2f} GiB"
    if unit == "x":
        return f"{value:,.3g}x"
    text = f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{text} {unit}".strip()


def _tolerance(question: dict[str, Any]) -> tuple[float, float, str]:
    rel = float(question.get("tolerance", 0.05))
    absolute = float(question.get("abs_tolerance", 0))
    unit = question.get("unit", "")
    if absolute:
        text = f"Accepted within ±{_format(absolute, unit)} of lessonkit's value."
    else:
        text = f"Accepted within ±{rel:.0%} of lessonkit's value."
    return rel, absolute, text


# Unit diagnoses ("by the GiB/GB factor", "by about 10^3") only where a unit can be mixed up:
# ratios ("x"), counts and bytes per parameter get none.
_BYTE_UNITS = ("GB", "GiB")
_DIAGNOSED_UNITS = ("GB", "GiB", "s", "h")


def _compare(value: float, expected: float, question: dict[str, Any]) -> tuple[bool, str]:
    """(within tolerance, a teaching remark when not)."""
    rel, absolute, _ = _tolerance(question)
    if abs(value - expected) <= max(absolute, rel * abs(expected)):
        return True, ""
    remark = "too high" if value > expected else "too low"
    if expected and value and 0 < abs(value / expected) < math.inf:  # no under- or overflow
        ratio = value / expected
        for mistake in question.get("mistakes", []):
            if abs(ratio / mistake["ratio"] - 1) <= max(rel, 0.02):
                return False, f"{remark}. {mistake['hint']}"
        unit = question.get("unit", "")
        if unit in _BYTE_UNITS and (abs(ratio - GiB / GB) < 0.01 or abs(ratio - GB / GiB) < 0.01):
            return False, f"{remark}: by exactly the GiB/GB factor. Check GB (10^9) against GiB (2^30)."
        exponent = math.log10(abs(ratio))
        if unit in _DIAGNOSED_UNITS and abs(exponent) >= 2.5 and abs(exponent - round(exponent)) < 0.05:
            return False, f"{remark} by a factor of about 10^{round(exponent)}: check your units."
    return False, remark + "."


# Other examples for each unit, used where the usual example is (close to) the answer.
_OTHER_EXAMPLES = {"GB": "'42.5 GB' or 42.5 (GB)", "s": "'2.5 s' or 2.5 (seconds)",
                   "h": "'3 h' or 3 (hours)", "$": "'$7.25' or 7.25", "$/h": "'$3.10/h' or 3.1",
                   "x": "'7x' or 7", "B/param": "'9 B/param' or 9", "params": "'2.1M' or 2.1e6",
                   "GPUs": "5", "GiB": "'11.5 GiB' or 11.5", "": "7"}


def _safe_example(unit: str, expected: float, question: dict[str, Any]) -> str:
    """An example answer for this unit that is not near the expected answer."""
    for example in (_EXAMPLES.get(unit, "42"), _OTHER_EXAMPLES.get(unit, "7"), "0.25"):
        value = _read_number(example.split(" or ")[-1].split(" (")[0], unit)
        if not _compare(value, expected, question)[0] and not math.isclose(
                value, expected, rel_tol=0.25):
            return example
    return "a number with its unit"


def _hide_answer(message: str, unit: str, expected: float, question: dict[str, Any]) -> str:
    """Feedback on unreadable input, with its example swapped when that example is the answer."""
    usual = _EXAMPLES.get(unit, "42")
    safe = _safe_example(unit, expected, question)
    return message.replace(usual, safe) if safe != usual else message


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
        return CheckResult(qid, title, "correct",
                           f"Correct: {_format(value, unit)} (lessonkit: {_format(expected, unit)}).",
                           tolerance=tolerance)
    guide = question.get("guide")
    if guide and _is_guide_figure((value, value), guide, unit):
        return CheckResult(qid, title, "not yet",
                           f"Not yet: {_format(value, unit)} is {remark.split('.')[0]}: that is what "
                           f"the guide says ({guide['answer']}). {guide['says']}",
                           tolerance=tolerance)
    return CheckResult(qid, title, "not yet", f"Not yet: {_format(value, unit)} is {remark}",
                       tolerance=tolerance)


_RANGE_SEPARATOR = re.compile(r"\s*(?:-|–|—|\bto\b|\.\.)\s*")


def _split_range(text: str) -> tuple[str, str] | None:
    """'120 to 160 GB' -> ('120', '160 GB'): split at the first separator followed by a digit."""
    text = str.strip(text)
    for separator in _RANGE_SEPARATOR.finditer(text, 1):
        second = text[separator.end():]
        if re.match(r"\d", second):
            return text[:separator.start()], second
    return None


def _read_range(answer: object, unit: str) -> tuple[float, float] | None:
    """A range such as '2-3x' or '120 to 160 GB' as (low, high) in the base unit, else None."""
    if not isinstance(answer, str) or len(answer) > _MAX_CHARS:
        return None
    parts = _split_range(answer)
    if parts is None:
        return None
    first, second = parts
    low_match, high_match = _match_number(first), _match_number(second)
    if not low_match or not high_match:
        return None
    if not low_match.group(2):  # '2-3x': the unit written once, after the second number
        first = f"{first} {high_match.group(2)}"
    try:
        low, high = _read_number(first, unit), _read_number(second, unit)
    except _Unreadable:
        return None
    return (low, high) if low <= high else (high, low)


def _is_guide_figure(span: tuple[float, float], guide: dict[str, Any], unit: str) -> bool:
    """Whether an answer (a number as (x, x), or a range) is the guide's own figure or range."""
    low, high = span
    text = guide["answer"]
    figure = _read_range(text, unit) or (_read_number(text, unit),) * 2
    same = all(math.isclose(a, b, rel_tol=1e-3) for a, b in zip(span, figure))
    return same or (low == high and figure[0] <= low <= figure[1])


def _check_range(qid: str, question: dict[str, Any], span: tuple[float, float]) -> CheckResult:
    unit, title = question.get("unit", ""), question.get("title", "")
    tolerance = _tolerance(question)[2]
    low, high = span
    expected = float(_EXPECTED[qid]())
    shown = f"{_format(low, unit)} to {_format(high, unit)}"
    if _compare(low, expected, question)[0] and _compare(high, expected, question)[0]:
        return CheckResult(qid, title, "correct",
                           f"Correct: {shown} (lessonkit: {_format(expected, unit)}).",
                           tolerance=tolerance)
    where = "inside" if low <= expected <= high else "above" if expected > high else "below"
    guide = question.get("guide")
    if guide and _is_guide_figure(span, guide, unit):
        message = (f"Not yet: {shown} is the guide's range ({guide['answer']}); lessonkit's "
                   f"figure for this question lies {where} it. {guide['says']}")
    else:
        message = (f"Not yet: {shown} is a range, and lessonkit's figure lies {where} it. "
                   "The question asks for one number.")
    return CheckResult(qid, title, "not yet", message, tolerance=tolerance)


def _check_table(qid: str, question: dict[str, Any], answer: object) -> CheckResult:
    unit, title = question.get("unit", ""), question.get("title", "")
    tolerance = _tolerance(question)[2]
    expected: dict[str, float] = _EXPECTED[qid]()
    if not isinstance(answer, dict) or len(answer) > _MAX_ITEMS:
        return CheckResult(qid, title, "not yet",
                           f"Expected a dict with one entry per row ({', '.join(expected)}), "
                           f"got {_describe(answer)}.", tolerance=tolerance)
    by_key = {normalise_name(k): k for k in expected}
    for row, aliases in _row_aliases(question).items():
        by_key |= {normalise_name(alias): row for alias in aliases if row in expected}
    given: dict[str, object] = {}
    details, unknown = [], []
    for key, value in answer.items():
        key = short_str(key, _MAX_CHARS)
        row = by_key.get(normalise_name(key))
        if row is None:
            unknown.append(key)
        else:
            given[row] = value
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
        return CheckResult(qid, title, "correct", f"Correct: all {right} rows match lessonkit.",
                           tolerance=tolerance, details=details)
    return CheckResult(qid, title, "not yet", f"Not yet: {right} of {len(expected)} rows match.",
                       tolerance=tolerance, details=details)


def _row_aliases(question: dict[str, Any]) -> dict[str, list[str]]:
    aliases = dict(question.get("row_aliases", {}))
    if question.get("rows_from") == "bandwidth":
        aliases |= {link["name"]: link.get("aliases", []) for link in _bandwidth_data()}
    return aliases


# ----- choices ------------------------------------------------------------------------------
def _options(question: dict[str, Any]) -> dict[str, str]:
    """normalised alias -> option name."""
    table: dict[str, str] = {}
    for option in question.get("options", []):
        name, aliases = (option, []) if isinstance(option, str) else (option["name"], option["aliases"])
        for alias in [name, *aliases]:
            table[normalise_name(alias)] = name
    return table


def _pick(raw: object, question: dict[str, Any]) -> str:
    """The option an answer names, or _Unreadable with close matches."""
    if isinstance(raw, bool) and "yes" in _options(question).values():
        return "yes" if raw else "no"
    source = question.get("options_from")
    if source and not isinstance(raw, str) and isinstance(getattr(raw, "name", None), str):
        raw = raw.name  # a catalog record (GPU, environment, ModelSpec) stands for its name
    if not isinstance(raw, str):
        raise _Unreadable(f"Expected the name of an option (a string), got {_describe(raw)}.")
    if len(raw) > _MAX_CHARS:
        raise _Unreadable(f"Expected the name of an option, got {len(raw):,} characters of text "
                          f"({_describe(raw)}).")
    raw = str.__str__(raw)  # a str subclass as plain text
    if source:
        try:
            return _CATALOGS[source](raw)
        except LessonkitError as err:
            raise _Unreadable(str(err)) from None
    table = _options(question)
    key = normalise_name(raw)
    if key in table:
        return table[key]
    names = list(dict.fromkeys(table.values()))
    raise _Unreadable(unknown_name_message(raw, names, "option").replace("Allowed:", "Options:"))


def _check_choice(qid: str, question: dict[str, Any], answer: object) -> CheckResult:
    title, multi = question.get("title", ""), question["kind"] == "multi"
    expected = _EXPECTED[qid]()
    accepted = {expected} if isinstance(expected, str) else set(expected)
    if multi:
        raw = [answer] if isinstance(answer, str) else answer
        if not isinstance(raw, (list, tuple, set, frozenset)) or len(raw) > _MAX_ITEMS:
            return CheckResult(qid, title, "not yet",
                               f"Expected a list of options, got {_describe(answer)}.")
    elif isinstance(answer, (list, tuple, set, frozenset)):
        return CheckResult(qid, title, "not yet", "Pick one option (a string), not a list.")
    try:
        picks = {_pick(item, question) for item in raw} if multi else {_pick(answer, question)}
    except _Unreadable as err:
        return CheckResult(qid, title, "not yet", str(err))
    shown = ", ".join(sorted(picks)) or "nothing"
    if (picks == accepted) if multi else (picks <= accepted):
        return CheckResult(qid, title, "correct", f"Correct: {shown}.")
    if multi:
        wrong, missing = len(picks - accepted), len(accepted - picks)
        parts = ([f"{wrong} of your picks {'is' if wrong == 1 else 'are'} not right"] if wrong else []) + (
            [f"{missing} right option{'s are' if missing > 1 else ' is'} missing"] if missing else [])
        return CheckResult(qid, title, "not yet", f"Not yet: {' and '.join(parts)}.")
    return CheckResult(qid, title, "not yet", f"Not yet: {shown} is not the answer.")


# ----- free text: a self-check, not a grade ------------------------------------------------
def _check_text(qid: str, question: dict[str, Any], answer: object) -> CheckResult:
    title = question.get("title", "")
    if not isinstance(answer, str):
        return CheckResult(qid, title, "not yet",
                           f"Write your answer as text (a string in quotes), got {_describe(answer)}.")
    if len(answer) > _MAX_TEXT_CHARS:
        return CheckResult(qid, title, "not yet",
                           f"That is {len(answer):,} characters: explain in a few sentences "
                           f"(at most {_MAX_TEXT_CHARS:,} characters).")
    answer = str.__str__(answer)  # a str subclass as plain text
    words = len(answer.split())
    if words < 8:
        return CheckResult(qid, title, "not yet",
                           f"Only {words} word{'s' if words != 1 else ''}: explain in a few sentences.")
    text = answer.lower()
    details, found = [], 0
    for point in question["key_points"]:
        hit = any(_affirmed(pattern, text) for pattern in point["patterns"])
        found += hit
        details.append(f"☐ {point['point']} ({_MENTIONED if hit else _NOT_MENTIONED})")
    return CheckResult(
        qid, title, "self-check",
        f"Self-check, not a grade: judge your answer against each key point below. Its words "
        f"touch {found} of {len(details)} of them; a word is not yet an explanation, so tick a "
        "point only where your answer explains it.",
        details=details)


_MENTIONED = "your answer mentions this"
_NOT_MENTIONED = "not mentioned"
# A negation shortly before a key word in the same clause ("gradients are not stored", "no
# optimizer states") is not a mention of that point.
_NEGATION = re.compile(r"\b(?:not(?!\s+(?:only|just)\b)|no|never|without|nor|neither|none|"
                       r"cannot)\b|n't\b")
_CLAUSE_END = re.compile(r"[.;:!?]|\b(?:but|because|although|though|while|whereas)\b")


def _affirmed(pattern: str, text: str) -> bool:
    """Whether ``pattern`` occurs in ``text`` at least once without a negation in its clause."""
    for match in re.finditer(pattern, text):
        start = max((m.end() for m in _CLAUSE_END.finditer(text, 0, match.start())), default=0)
        end_match = _CLAUSE_END.search(text, match.end())
        clause = text[start:end_match.start() if end_match else len(text)]
        if not _NEGATION.search(clause):
            return True
    return False


def key_points_found(question_id: str, answer: str) -> tuple[int, int]:
    """(key points an answer mentions, key points) for a free-text question."""
    result = check(question_id, answer, show=False)
    return sum(d.endswith(f"({_MENTIONED})") for d in result.details), len(result.details)


def _check_function(qid: str, question: dict[str, Any], answer: object) -> CheckResult:
    title = question.get("title", "")
    if not callable(answer) or not hasattr(answer, "__code__"):
        return CheckResult(qid, title, "not yet",
                           f"Pass your function itself (its name, without brackets), got {_describe(answer)}.")
    cases = _EXPECTED[qid]()
    details, passed = [], 0
    deadline = time.monotonic() + _FUNCTION_TIME_LIMIT
    for label, torch, verify in cases:
        left = deadline - time.monotonic()
        if left <= 0:
            details.append(f"✘ {label}: not run (the time limit was used up)")
            continue
        try:
            printed = run_with_fake_torch(answer, torch, time_limit=left)
        except NotImplementedError:
            return CheckResult(qid, title, "not answered",
                               "Not answered yet: replace the `raise NotImplementedError` line.")
        except (TimeLimitExceeded, StudentExit) as err:
            details.append(f"✘ {label}: {short_str(err)}")
            continue
        except Exception as err:  # the student's code failed: that is the feedback
            if _keeps_placeholder(answer):
                return CheckResult(qid, title, "not answered",
                                   "Not answered yet: replace the `answer = ...` line in your "
                                   "function with your code.")
            details.append(f"✘ {label}: raised {describe_error(err)}")
            continue
        problem = verify(printed)
        passed += problem is None
        details.append(f"✔ {label}" if problem is None else f"✘ {label}: {problem}")
    if passed == len(cases):
        return CheckResult(qid, title, "correct", f"Correct: your function passes all {passed} cases.",
                           details=details)
    return CheckResult(qid, title, "not yet", f"Not yet: {passed} of {len(cases)} cases pass.",
                       details=details)


def _keeps_placeholder(function: Any) -> bool:
    """Whether a function still holds the exercise's placeholder line ``answer = ...``."""
    code = function.__code__
    return "answer" in code.co_varnames and any(c is ... for c in code.co_consts)


_CHECKERS: dict[str, Callable[[str, dict[str, Any], object], CheckResult]] = {
    "number": _check_number, "table": _check_table, "choice": _check_choice,
    "multi": _check_choice, "text": _check_text, "function": _check_function,
}
