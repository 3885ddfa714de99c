"""Reading exercise answers: numbers with units, ranges, option names, placeholders.

Each reader caps what it reads (text length, list length) and uses patterns that cannot
backtrack, so any answer, however odd, is read or refused within a second.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..errors import LessonkitError, normalise_name, unknown_name_message
from ..safe_repr import short_repr
from ..units import GB, GiB
from .expected import CATALOGS as _CATALOGS

PLACEHOLDER_TEXT = "Your answer here"
# The longest answer read as a number or a name; longer ones get feedback without being parsed
# (so any answer is checked within a second).
_MAX_CHARS = 200
# The most rows of a table or picks of a multiple choice read.
_MAX_ITEMS = 100


def _is_placeholder(answer: object) -> bool:
    if answer is ... or answer is None:
        return True
    if isinstance(answer, str):
        key = normalise_name(
            str.strip(answer)[:1000]
        )  # any text: only its start can be a placeholder
        return not key or key.startswith(normalise_name(PLACEHOLDER_TEXT))
    return False


def _describe(answer: object) -> str:
    """The answer as shown in feedback: its repr, at most 60 characters, whatever it is."""
    return short_repr(answer, 60)


# ----- numbers with units -------------------------------------------------------------------
# Unit words accepted for each kind of quantity, as a factor to the quantity's base unit.
_UNITS: dict[str, dict[str, float]] = {
    "GB": {
        "b": 1,
        "byte": 1,
        "bytes": 1,
        "kb": 1e3,
        "mb": 1e6,
        "gb": 1e9,
        "tb": 1e12,
        "kib": 2**10,
        "mib": 2**20,
        "gib": 2**30,
        "tib": 2**40,
    },
    "s": {
        "s": 1,
        "sec": 1,
        "secs": 1,
        "second": 1,
        "seconds": 1,
        "ms": 1e-3,
        "millisecond": 1e-3,
        "milliseconds": 1e-3,
        "min": 60,
        "mins": 60,
        "minute": 60,
        "minutes": 60,
        "h": 3600,
        "hour": 3600,
        "hours": 3600,
    },
    "h": {
        "h": 1,
        "hr": 1,
        "hrs": 1,
        "hour": 1,
        "hours": 1,
        "min": 1 / 60,
        "minutes": 1 / 60,
        "d": 24,
        "day": 24,
        "days": 24,
    },
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
_NUMBER_RE = re.compile(
    r"(?:us)?\$?\s*([-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*(.*)", re.S
)


def _match_number(text: str) -> re.Match[str] | None:
    return _NUMBER_RE.fullmatch(str.strip(text)) if len(text) <= _MAX_CHARS else None


class _Unreadable(Exception):
    """The answer could not be read as the kind of value the question wants."""


def _read_number(answer: object, unit: str) -> float:
    """An answer as a float in the question's base unit (bytes for 'GB'), or _Unreadable."""
    example = f"a number such as {_EXAMPLES.get(unit, '42')}"
    if hasattr(answer, "total_bytes") and hasattr(answer, "breakdown"):
        raise _Unreadable(
            "That is a whole MemoryReport: answer with the number the question asks "
            "for, such as report.total_bytes or report.breakdown['gradients']."
        )
    if isinstance(answer, (bool, list, tuple, set, dict)):
        raise _Unreadable(f"Expected one number ({example}), got {_describe(answer)}.")
    if isinstance(answer, str):
        if len(answer) > _MAX_CHARS:
            raise _Unreadable(
                f"Expected {example}, got {len(answer):,} characters of text ({_describe(answer)})."
            )
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
                raise _Unreadable(
                    f"Could not read the unit {unit_text!r} in {_describe(answer)}; use {allowed}."
                )
            value *= factors[key]
        elif unit == "GB":
            value = _bare_bytes(value)
    else:
        try:
            value = float(answer)  # type: ignore[arg-type]  # int, float, numpy scalars
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


_EXAMPLES = {
    "GB": "'7.5 GB' or 7.5 (GB)",
    "s": "'45 s' or 45 (seconds)",
    "h": "'10 h' or 10 (hours)",
    "$": "'$12.50' or 12.5",
    "$/h": "'$1.29/h' or 1.29",
    "x": "'9x' or 9",
    "B/param": "'9 B/param' or 9",
    "params": "'2.1M' or 2.1e6",
    "GPUs": "9",
    "GiB": "'70 GiB' or 70",
}


_RANGE_SEPARATOR = re.compile(r"\s*(?:-|–|—|\bto\b|\.\.)\s*")


def _split_range(text: str) -> tuple[str, str] | None:
    """'120 to 160 GB' -> ('120', '160 GB'): split at the first separator followed by a digit."""
    text = str.strip(text)
    for separator in _RANGE_SEPARATOR.finditer(text, 1):
        second = text[separator.end() :]
        if re.match(r"\d", second):
            return text[: separator.start()], second
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


# ----- choices ------------------------------------------------------------------------------
def _options(question: dict[str, Any]) -> dict[str, str]:
    """normalised alias -> option name."""
    table: dict[str, str] = {}
    for option in question.get("options", []):
        name, aliases = (
            (option, []) if isinstance(option, str) else (option["name"], option["aliases"])
        )
        for alias in [name, *aliases]:
            table[normalise_name(alias)] = name
    return table


def _pick(raw: object, question: dict[str, Any]) -> str:
    """The option an answer names, or _Unreadable with close matches."""
    if isinstance(raw, bool) and "yes" in _options(question).values():
        return "yes" if raw else "no"
    source = question.get("options_from")
    name = getattr(raw, "name", None)
    if source and not isinstance(raw, str) and isinstance(name, str):
        raw = name  # a catalog record (GPU, environment, ModelSpec) stands for its name
    if not isinstance(raw, str):
        raise _Unreadable(f"Expected the name of an option (a string), got {_describe(raw)}.")
    if len(raw) > _MAX_CHARS:
        raise _Unreadable(
            f"Expected the name of an option, got {len(raw):,} characters of text "
            f"({_describe(raw)})."
        )
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
