"""Reading a student's guess (a size, a GPU, an environment, a sentence) and showing text once.

Every reader here is total: whatever the guess is (a 400-digit integer, NaN, a lone surrogate,
10 MB of text, an object whose ``__eq__``, ``__float__`` or ``__repr__`` raises), it becomes a
``Guess`` whose message says what was read or what to write instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import LessonkitError
from ..safe_repr import describe_error, short_repr, short_str
from ..units import GiB, parse_bytes
from .check_result import _ipython

KINDS = ("memory", "gpu", "environment", "text")
EXAMPLES = {
    "memory": "'100 GiB'",
    "gpu": "'RTX 4090'",
    "environment": "'Kaggle'",
    "text": "a sentence",
}
SHOWN_CHARS = 200  # the most characters of a guess echoed back
_MAX_NAME_CHARS = 200  # longer text is not read as a size or looked up as a name
_BYTE_COUNT = 1e6  # a bare number this large is a count of bytes (report.total_bytes), not GiB


def clean(text: str) -> str:
    """Text that any output can print: lone surrogates and other unencodable characters are
    written as escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def memory_text(value: float) -> str:
    """A size in GiB for a message: '132.3 GiB', '3.2e+12 GiB' for absurd sizes."""
    gib = value / GiB
    return f"{gib:,.1f} GiB" if abs(gib) < 1e6 else f"{gib:.2g} GiB"


def shorten(text: str, limit: int = SHOWN_CHARS) -> str:
    """Printable text on one line, of at most about ``limit`` characters, saying when it was
    cut."""
    one_line = " ".join(clean(text[: 4 * limit]).split())
    if len(one_line) <= limit and len(text) <= 4 * limit:
        return one_line
    return f"{one_line[: limit - 3]}... ({len(text):,} characters, shown shortened)"


def echo(value: object) -> str:
    """Any object as a short, printable repr on one line."""
    return " ".join(clean(short_repr(value, 80)).split())


def print_text(text: str, shown_in: list[object]) -> None:
    """Print ``text`` and remember the notebook cell it was printed in (``shown_in``)."""
    try:
        print(text)
    except Exception:  # a closed or broken standard output: the notebook goes on
        return
    shell = _ipython()
    shown_in[:] = [shell.execution_count] if shell is not None else []


def printed_once(text: str, shown_in: list[object]) -> None:
    """An ``_ipython_display_``: nothing in the cell that already printed ``text``, the text
    anywhere else (the value shown again in a later cell)."""
    shell = _ipython()
    if shell is not None and shown_in and shown_in[0] == shell.execution_count:
        shown_in.clear()
        return
    print_text(text, shown_in)


@dataclass(frozen=True)
class Guess:
    """A guess as read: ``value`` is bytes, a catalog name or the text; None when unreadable.

    ``predict`` prints the message; the Guess it returns displays as nothing in that cell, so
    the cell shows the message once.
    """

    kind: str
    value: Any
    message: str
    _shown_in: list[object] = field(default_factory=list, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.value is not None

    def __str__(self) -> str:
        return self.message

    def _ipython_display_(self) -> None:
        printed_once(self.message, self._shown_in)


class _Unreadable(Exception):
    """A guess that is not a size or a name, with what to write instead."""


def read_guess(guess: object, kind: str) -> Guess:
    """Read a guess of ``kind``; never raises for any guess (an unreadable one says what to
    write). An unknown ``kind`` is the notebook's own mistake: a LessonkitError."""
    if type(kind) is not str or kind not in KINDS:
        raise LessonkitError(f"kind must be one of {', '.join(KINDS)}, got {short_repr(kind)}.")
    try:
        return _read(guess, kind)
    except Exception as err:  # a guess whose own methods raise, or anything unforeseen
        return Guess(kind, None, f"Cannot read the guess {echo(guess)}: {describe_error(err)}.")


def _read(guess: object, kind: str) -> Guess:
    if guess is None or guess is ... or (isinstance(guess, str) and not str.strip(guess)):
        return Guess(
            kind, None, f"No guess yet: write one (e.g. {EXAMPLES[kind]}) and run the cell again."
        )
    if kind == "text":
        text = str.strip(guess) if isinstance(guess, str) else short_str(guess, SHOWN_CHARS)
        return Guess(kind, text, f'Your guess: "{shorten(text)}".')
    try:
        if kind == "memory":
            value: Any = _read_memory(guess)
            shown = memory_text(value)
        else:
            value = _read_name(guess, kind)
            shown = value
    except _Unreadable as err:
        return Guess(kind, None, " ".join(f"Cannot read the guess {echo(guess)}: {err}".split()))
    return Guess(kind, value, f"Your guess: {shown}.")


def _read_memory(guess: object) -> float:
    example = f"write a size such as {EXAMPLES['memory']}"
    if isinstance(guess, bool):
        raise _Unreadable(f"a guess of memory is a size, not {guess}: {example}.")
    if isinstance(guess, str):
        if len(guess) > _MAX_NAME_CHARS:
            raise _Unreadable(f"that is {len(guess):,} characters, not a size: {example}.")
        try:
            value = parse_bytes(str.__str__(guess), default_unit="GiB")
        except (LessonkitError, ValueError, OverflowError) as err:
            raise _Unreadable(clean(short_str(err, 300))) from None
    else:
        try:
            value = float(guess)  # type: ignore[arg-type]  # numbers of any kind
            if abs(value) < _BYTE_COUNT:  # a number of GiB, unless it is clearly bytes
                value *= GiB
        except OverflowError:
            raise _Unreadable(f"that number is too large to be a size: {example}.") from None
        except Exception:
            raise _Unreadable(f"{example} (or a number of GiB).") from None
    if not math.isfinite(value):
        raise _Unreadable(f"a size must be a finite number: {example}.")
    if value <= 0:
        raise _Unreadable(f"a size must be more than 0: {example}.")
    return value


def _read_name(guess: object, kind: str) -> str:
    from ..hardware.environments import Environment, get_environment
    from ..hardware.gpus import GPU, get_gpu

    record = GPU if kind == "gpu" else Environment
    if isinstance(guess, record):
        return str(guess.name)
    if not isinstance(guess, str):
        raise _Unreadable(f"write a name in quotes, such as {EXAMPLES[kind]}.")
    if len(guess) > _MAX_NAME_CHARS:
        raise _Unreadable(
            f"that is {len(guess):,} characters, not a name: write one such as {EXAMPLES[kind]}."
        )
    try:
        name = str.__str__(guess)
        found = get_gpu(name) if kind == "gpu" else get_environment(name)
    except LessonkitError as err:
        raise _Unreadable(clean(short_str(err, 400))) from None
    return str(found.name)
