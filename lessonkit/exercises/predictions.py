"""Predict, then reveal: the student writes a guess before a key number is shown.

In a notebook, a cell holds the guess and calls ``predict``; a later cell, after the number is
computed, calls ``reveal`` with the same guess and the answer. Each prints one short message,
and what it returns displays as nothing more in that cell, so the cell shows one output. Neither
ever raises, whatever the guess, the answer or the label: a missing or unreadable guess gets a
line that says what to write. Guesses are plain Python values, so they work the same on Colab,
Kaggle, nbgrader and papermill.

Kinds of guess:
- ``"memory"``: a size such as ``"100 GiB"``, ``"120 GB"`` or a bare number (read as GiB, the
  course's unit, unless it is a million or more: then it is bytes, such as ``total_bytes``).
  ``reveal`` takes the answer in bytes or as a MemoryReport; with a report it also says which
  parts of the breakdown the guess covers and which it leaves out;
- ``"gpu"``: a GPU of the catalog (``"RTX 4090"``, forgiving spelling). A card sold with the
  same memory as the answer that offers PyTorch at least as much is a tie, and counts as right;
- ``"environment"``: a place to train (``"kaggle"``, ``"Lambda"``);
- ``"text"``: a sentence (a reflection), shown back before the data that answers it.
"""

from __future__ import annotations

from typing import Any

from ..errors import LessonkitError
from ..safe_repr import describe_error, short_str
from .guesses import EXAMPLES, KINDS, Guess, clean, print_text, printed_once, read_guess
from .revealing import CLOSE, compare

__all__ = [
    "CLOSE",
    "EXAMPLES",
    "KINDS",
    "Guess",
    "Revealed",
    "predict",
    "read_guess",
    "reveal",
    "reveal_text",
]


class Revealed(str):
    """The text ``reveal`` printed: a str that the notebook cell does not show a second time."""

    _shown_in: list[object]

    def _ipython_display_(self) -> None:
        printed_once(str.__str__(self), getattr(self, "_shown_in", []))


def _label(what: object) -> str:
    return " ".join(clean(short_str(what, 120)).split()) or "Your guess"


def predict(guess: object, kind: str, what: str) -> Guess:
    """Print the guess as read (or what to write), before ``what`` is revealed. Never raises."""
    try:
        read = read_guess(guess, kind)
    except LessonkitError as err:  # an unknown kind: the notebook's mistake, said in the cell
        read = Guess("unknown", None, clean(short_str(err, 300)))
    after = " Run the next cells to see the answer." if read.ok else ""
    print_text(f"{_label(what)}: {read.message}{after}", read._shown_in)
    return read


def reveal_text(guess: object, kind: str, actual: Any) -> str:
    """How the guess compares with ``actual``: bytes or a MemoryReport for memory; a name, a
    record or a collection of names that all count as right for a GPU or an environment.
    Never raises for any guess or answer; an unknown ``kind`` is a LessonkitError, as for
    ``read_guess``."""
    read = read_guess(guess, kind)
    try:
        text = compare(read, actual)
    except Exception as err:  # an answer whose own methods raise
        text = f"{read.message} (The answer could not be shown: {describe_error(err, 120)}.)"
    return " ".join(clean(text).split())  # one line, whatever the answer's names hold


def reveal(guess: object, kind: str, actual: Any) -> Revealed:
    """Print and return how the guess compares with the number or name just shown. Never
    raises; the text it returns is not shown a second time by the cell."""
    try:
        text = reveal_text(guess, kind, actual)
    except LessonkitError as err:
        text = clean(short_str(err, 300))
    result = Revealed(text)
    result._shown_in = []
    print_text(text, result._shown_in)
    return result
