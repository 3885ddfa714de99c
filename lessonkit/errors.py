"""Errors and input checks that tell the user what was wrong and what is allowed."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from typing import Any

from .safe_repr import short_repr


class LessonkitError(ValueError):
    """Bad input to a lessonkit function: the message says what is allowed."""


def normalise_name(name: str) -> str:
    """Lower-case a name and drop spaces, dashes, underscores and dots for forgiving lookups."""
    return "".join(ch for ch in str(name).lower() if ch.isalnum())


def choose(value: object, allowed: Iterable[str], what: str) -> str:
    """Return the allowed name matching ``value`` (forgiving case and separators).

    Raises LessonkitError naming the closest matches when nothing matches.
    """
    allowed = list(allowed)
    if not isinstance(value, str):
        raise LessonkitError(
            f"{what} must be a name (a string), got {short_repr(value, 80)}. "
            f"Allowed: {', '.join(allowed)}."
        )
    by_key = {normalise_name(a): a for a in allowed}
    key = normalise_name(value)
    if key in by_key:
        return by_key[key]
    raise LessonkitError(unknown_name_message(value, allowed, what))


def unknown_name_message(value: str, allowed: Iterable[str], what: str) -> str:
    """A message for an unknown name with close matches, e.g. for models and GPUs."""
    allowed = list(allowed)
    by_key = {normalise_name(a): a for a in allowed}
    close = difflib.get_close_matches(normalise_name(value), list(by_key), n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(repr(by_key[c]) for c in close)}?" if close else ""
    listing = ", ".join(allowed) if len(allowed) <= 30 else ", ".join(allowed[:30]) + ", ..."
    return f"Unknown {what} {short_repr(value, 80)}.{hint} Allowed: {listing}."


def positive_int(value: object, what: str, *, maximum: int | None = None) -> int:
    """Check that ``value`` is a whole number >= 1 (and at most ``maximum``)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (isinstance(value, float) and (not math.isfinite(value) or value != int(value)))
    ):
        raise LessonkitError(f"{what} must be a whole number >= 1, got {short_repr(value)}.")
    value = int(value)
    if value < 1:
        raise LessonkitError(f"{what} must be >= 1, got {short_repr(value)}.")
    if maximum is not None and value > maximum:
        shown = f"{value:,}" if value.bit_length() < 600 else short_repr(value)
        raise LessonkitError(f"{what} must be at most {maximum:,}, got {shown}.")
    return value


def positive_number(
    value: object, what: str, *, maximum: float | None = None, allow_zero: bool = False
) -> float:
    """Check that ``value`` is a finite number > 0 (>= 0 with allow_zero)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise LessonkitError(f"{what} must be a finite number, got {short_repr(value)}.")
    if value < 0 or (value == 0 and not allow_zero):
        raise LessonkitError(f"{what} must be {'>= 0' if allow_zero else '> 0'}, got {value}.")
    if maximum is not None and value > maximum:
        raise LessonkitError(f"{what} must be at most {maximum:g}, got {value:g}.")
    return float(value)


def safe_text(value: Any, *, name: bool = False, quoted: bool = False) -> str:
    """``str(value)`` for a report (its ``.name`` with name=True, ``repr`` with quoted=True),
    whatever the object's methods do."""
    ways = [lambda: repr(value)] if quoted else [lambda: str(value), lambda: repr(value)]
    if name:
        ways.insert(0, lambda: str(value.name))
    for way in ways:
        try:
            return way()
        except Exception:
            pass
    return f"<{type(value).__name__} object>"
