"""Errors and input checks that tell the user what was wrong and what is allowed."""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Callable, Iterable
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


def real_number(value: object) -> int | float | None:
    """``value`` as a Python int (an integer of any kind: int, numpy's) or float (any other real
    number: float, numpy's, Fraction; +-inf beyond a float's range); None for anything else,
    True and False included."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    try:
        return float(value)
    except OverflowError:  # a Fraction beyond any float
        return math.inf if value > 0 else -math.inf  # type: ignore[operator]
    except (TypeError, ValueError):
        return None


def show_number(value: object) -> str:
    """A number for a message: every digit that tells it apart ('1.0000001', '-1e-300'),
    integers with separators, one too long to print described instead."""
    number = real_number(value)
    if isinstance(number, int):
        return f"{number:,}" if number.bit_length() < 600 else short_repr(number)
    if isinstance(number, float):
        return repr(number)
    return short_repr(value)


def positive_int(value: object, what: str, *, maximum: int | None = None) -> int:
    """Check that ``value`` is a whole number >= 1 (and at most ``maximum``); numpy's integers
    and whole floats are taken."""
    number = real_number(value)
    if number is None or (
        isinstance(number, float) and (not math.isfinite(number) or number != int(number))
    ):
        raise LessonkitError(f"{what} must be a whole number >= 1, got {short_repr(value)}.")
    whole = int(number)
    if whole < 1:
        raise LessonkitError(f"{what} must be >= 1, got {show_number(whole)}.")
    if maximum is not None and whole > maximum:
        raise LessonkitError(f"{what} must be at most {maximum:,}, got {show_number(whole)}.")
    return whole


def positive_number(
    value: object, what: str, *, maximum: float | None = None, allow_zero: bool = False
) -> float:
    """Check that ``value`` is a finite number > 0 (>= 0 with allow_zero) and at most
    ``maximum``; numpy's numbers are taken, integers too large for a float are not."""
    number = real_number(value)
    if number is None or (isinstance(number, float) and not math.isfinite(number)):
        raise LessonkitError(f"{what} must be a finite number, got {short_repr(value)}.")
    shown = show_number(number)
    if number < 0 or (number == 0 and not allow_zero):
        raise LessonkitError(f"{what} must be {'>= 0' if allow_zero else '> 0'}, got {shown}.")
    if maximum is not None and number > maximum:
        raise LessonkitError(f"{what} must be at most {maximum:g}, got {shown}.")
    try:
        return float(number)
    except OverflowError:
        raise LessonkitError(
            f"{what} must be a finite number, got {shown}: too large for one."
        ) from None


def safe_text(value: Any, *, name: bool = False, quoted: bool = False) -> str:
    """``str(value)`` for a report (its ``.name`` with name=True, ``repr`` with quoted=True),
    whatever the object's methods do."""
    ways: list[Callable[[], str]] = (
        [lambda: repr(value)] if quoted else [lambda: str(value), lambda: repr(value)]
    )
    if name:
        ways.insert(0, lambda: str(value.name))
    for way in ways:
        try:
            return way()
        except Exception:
            pass
    return f"<{type(value).__name__} object>"
