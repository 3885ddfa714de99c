"""Byte formatting and forgiving parsing of sizes such as "16 GB", "7B" or 16e9."""

from __future__ import annotations

import math
import re

from .errors import LessonkitError, real_number
from .safe_repr import short_repr

GB = 10**9
GiB = 2**30
MiB = 2**20

# The course's one convention for memory: GiB (2**30 bytes) in every text, readout and chart.
MEMORY_UNITS = (
    f"Memory is in GiB (gibibytes, 2**30 = {GiB:,} bytes) throughout: GPU memory is built in "
    "binary sizes, PyTorch reports GiB (torch.cuda memory figures and out-of-memory messages), and "
    "the charts draw GiB. A card's name keeps its maker's 'GB': an '80 GB' A100 has 80 GiB of "
    "memory chips. Decimal GB (10**9 bytes) appear only where the guide or a datasheet is quoted, "
    f"converted next to it: 1 GB = {GB / GiB:.3f} GiB, so the guide's 120-160 GB is "
    f"{120 * GB / GiB:.1f}-{160 * GB / GiB:.1f} GiB."
)


def gb_as_gib(gb: float, digits: int = 1) -> str:
    """A decimal-GB figure as quoted, with its GiB: '14 GB (13.0 GiB)'."""
    return f"{gb:g} GB ({gb * GB / GiB:,.{digits}f} GiB)"


_BYTE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_COUNT_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}


def format_bytes(n: float, unit: str = "GB", digits: int = 1) -> str:
    """Format bytes as e.g. '14.0 GB' (decimal) or '13.0 GiB' (binary)."""
    scale = _BYTE_UNITS[unit.lower()]
    return f"{n / scale:,.{digits}f} {unit}"


def parse_bytes(value: object, *, default_unit: str = "GB") -> float:
    """Parse '16 GB', '15.5GiB', '16e9' or a bare number (taken in ``default_unit``)."""
    expected = f"Expected a size such as '16 GB', got {short_repr(value)}."
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", value)
        if not match:
            raise LessonkitError(expected)
        number, unit = float(match.group(1)), match.group(2) or default_unit
    else:
        number, unit = _float(value, expected), default_unit
    if unit.lower() not in _BYTE_UNITS:
        raise LessonkitError(
            f"Unknown unit {short_repr(unit)} in {short_repr(value)}; use one of B, KB, MB, GB, "
            "TB, KiB, MiB, GiB, TiB."
        )
    return number * _BYTE_UNITS[unit.lower()]


def _float(value: object, expected: str) -> float:
    """A real number (numpy's too) as a float; ``expected`` is the error otherwise."""
    number = real_number(value)
    if number is None:
        raise LessonkitError(expected)
    try:
        return float(number)
    except OverflowError:
        raise LessonkitError(f"{expected[:-1]}: too large for any size.") from None


def parse_count(value: object) -> float:
    """Parse a parameter count: 7e9, '7B', '7b', '1.5B', '500M', '7 billion'."""
    expected = f"Expected a parameter count such as '7B' or 7e9, got {short_repr(value)}."
    if isinstance(value, str):
        text = value.strip().lower().replace("billion", "b").replace("million", "m")
        match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbt]?)", text)
        if match:
            return float(match.group(1)) * _COUNT_SUFFIXES[match.group(2)]
        raise LessonkitError(expected)
    return _float(value, expected)


def format_hours(hours: float) -> str:
    """A run time for people: '45 min' under an hour, '5.3 h' under two days, else '12.5 days'."""
    if not math.isfinite(hours):
        return "never"
    if round(hours * 60) < 60:
        return f"{max(1, round(hours * 60))} min"
    if round(hours, 1) < 48:
        return f"{hours:,.1f} h"
    return f"{hours / 24:,.1f} days"
