"""Feedback wording on numeric answers: how figures are shown, the tolerance, and diagnoses
of the usual mistakes (a GiB/GB mix-up, a factor of 10^3, the guide's own rounded figure)."""

from __future__ import annotations

import math
from typing import Any

from ..units import GB, GiB
from .answer_parsing import _EXAMPLES, _read_number, _read_range


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
            return (
                False,
                f"{remark}: by exactly the GiB/GB factor. Check GB (10^9) against GiB (2^30).",
            )
        exponent = math.log10(abs(ratio))
        if (
            unit in _DIAGNOSED_UNITS
            and abs(exponent) >= 2.5
            and abs(exponent - round(exponent)) < 0.05
        ):
            return False, f"{remark} by a factor of about 10^{round(exponent)}: check your units."
    return False, remark + "."


# Other examples for each unit, used where the usual example is (close to) the answer.
_OTHER_EXAMPLES = {
    "GB": "'42.5 GB' or 42.5 (GB)",
    "s": "'2.5 s' or 2.5 (seconds)",
    "h": "'3 h' or 3 (hours)",
    "$": "'$7.25' or 7.25",
    "$/h": "'$3.10/h' or 3.1",
    "x": "'7x' or 7",
    "B/param": "'6 B/param' or 6",
    "params": "'35M' or 3.5e7",
    "GPUs": "40",
    "GiB": "'9.5 GiB' or 9.5",
    "": "7",
}


def _safe_example(unit: str, expected: float, question: dict[str, Any]) -> str:
    """An example answer for this unit that is not near the expected answer."""
    for example in (_EXAMPLES.get(unit, "42"), _OTHER_EXAMPLES.get(unit, "7"), "0.25"):
        value = _read_number(example.split(" or ")[-1].split(" (")[0], unit)
        if not _compare(value, expected, question)[0] and not math.isclose(
            value, expected, rel_tol=0.25
        ):
            return example
    return "a number with its unit"


def _hide_answer(message: str, unit: str, expected: float, question: dict[str, Any]) -> str:
    """Feedback on unreadable input, with its example swapped when that example is the answer."""
    usual = _EXAMPLES.get(unit, "42")
    safe = _safe_example(unit, expected, question)
    return message.replace(usual, safe) if safe != usual else message


def _is_guide_figure(span: tuple[float, float], guide: dict[str, Any], unit: str) -> bool:
    """Whether an answer (a number as (x, x), or a range) is the guide's own figure or range."""
    low, high = span
    text = guide["answer"]
    figure = _read_range(text, unit) or (_read_number(text, unit),) * 2
    same = all(math.isclose(a, b, rel_tol=1e-3) for a, b in zip(span, figure, strict=False))
    return same or (low == high and figure[0] <= low <= figure[1])
