"""Predict, then reveal: the student writes a guess before a key number is shown.

In a notebook, a cell holds the guess and calls ``predict``; a later cell, after the number is
computed, calls ``reveal`` with the same guess and the number. Both print a short message and
never raise: a missing or unreadable guess gets a line that says what to write. Guesses are
plain Python values, so they work the same on Colab, Kaggle, nbgrader and papermill.

Kinds of guess:
- ``"memory"``: a size such as ``"100 GiB"``, ``"120 GB"`` or a bare number (read as GiB, the
  course's unit);
- ``"gpu"``: a GPU of the catalog (``"RTX 4090"``, forgiving spelling);
- ``"environment"``: a place to train (``"kaggle"``, ``"Lambda"``);
- ``"text"``: a sentence (a reflection), shown back before the data that answers it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import LessonkitError, safe_text
from ..units import GiB, parse_bytes

KINDS = ("memory", "gpu", "environment", "text")
EXAMPLES = {
    "memory": "'100 GiB'",
    "gpu": "'RTX 4090'",
    "environment": "'Kaggle'",
    "text": "a sentence",
}
CLOSE = 0.10  # a memory guess within 10% of the number counts as close


@dataclass(frozen=True)
class Guess:
    """A guess as read: ``value`` is bytes, a catalog name or the text; None when unreadable."""

    kind: str
    value: Any
    message: str

    @property
    def ok(self) -> bool:
        return self.value is not None


def read_guess(guess: object, kind: str) -> Guess:
    """Read a guess of ``kind``; never raises (an unreadable guess says what to write)."""
    if kind not in KINDS:
        raise LessonkitError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}.")
    if guess is None or (isinstance(guess, str) and not guess.strip()) or guess is ...:
        return Guess(
            kind, None, f"No guess yet: write one (e.g. {EXAMPLES[kind]}) and run the cell again."
        )
    try:
        if kind == "memory":
            value: Any = parse_bytes(guess, default_unit="GiB")
            if value <= 0:
                raise LessonkitError(f"a size must be more than 0, got {safe_text(guess)}.")
            shown = f"{value / GiB:,.1f} GiB"
        elif kind == "gpu":
            from ..hardware.gpus import get_gpu

            value = get_gpu(guess).name
            shown = value
        elif kind == "environment":
            from ..hardware.environments import get_environment

            value = get_environment(guess).name
            shown = value
        else:
            value = str(guess).strip()
            shown = f'"{value}"'
    except (LessonkitError, TypeError, ValueError) as err:
        return Guess(kind, None, f"Cannot read the guess {safe_text(guess, quoted=True)}: {err}")
    return Guess(kind, value, f"Your guess: {shown}.")


def predict(guess: object, kind: str, what: str) -> Guess:
    """Print the guess as read (or what to write), before ``what`` is revealed."""
    read = read_guess(guess, kind)
    print(f"{what}: {read.message}" + (" Run the next cells to see the answer." if read.ok else ""))
    return read


def reveal_text(guess: object, kind: str, actual: Any) -> str:
    """How the guess compares with ``actual`` (bytes for memory, a name for gpu/environment, or
    a collection of names that all count as right)."""
    read = read_guess(guess, kind)
    if not read.ok:
        return f"{read.message} (The answer: {_shown(actual, kind)}.)"
    if kind == "memory":
        error = read.value / float(actual) - 1
        close = "close" if abs(error) <= CLOSE else ("too low" if error < 0 else "too high")
        return (
            f"You guessed {read.value / GiB:,.1f} GiB; the answer is "
            f"{float(actual) / GiB:,.1f} GiB: {abs(error):.0%} {'below' if error < 0 else 'above'}"
            f" ({close})."
        )
    if kind == "text":
        return f'You wrote: "{read.value}". Compare it with the numbers above.'
    right = {actual} if isinstance(actual, str) else set(actual)
    verdict = "right" if read.value in right else "not this time"
    return f"You guessed {read.value}; the answer is {_shown(actual, kind)}: {verdict}."


def reveal(guess: object, kind: str, actual: Any) -> str:
    """Print and return how the guess compares with the number or name just shown."""
    text = reveal_text(guess, kind, actual)
    print(text)
    return text


def _shown(actual: Any, kind: str) -> str:
    if kind == "text" or actual is None:
        return "in the numbers above"
    if kind == "memory":
        return f"{float(actual) / GiB:,.1f} GiB"
    if isinstance(actual, str):
        return actual
    return " or ".join(sorted(str(a) for a in actual))
