"""Work, counted instead of timed: a test bounds the calls a function makes, which a busy
machine does not change (seconds live in benchmarks/ scripts, which print them).

``count_calls(fn)`` counts every Python and C function call made while ``fn()`` runs, in this
thread, with ``sys.setprofile``. A quadratic loop in Python shows as calls growing with the
square of the input; one slow C call (a regex on a long string) counts once, so such cases are
bounded by the size of what they are given instead.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

CALL_EVENTS = frozenset({"call", "c_call"})


def count_calls(fn: Callable[[], Any]) -> tuple[Any, int]:
    """(what ``fn()`` returned, the function calls it made)."""
    calls = 0

    def profile(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        if event in CALL_EVENTS:
            calls += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = fn()
    finally:
        sys.setprofile(previous)
    return result, calls
