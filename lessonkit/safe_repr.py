"""Text for any object, whatever its methods do, and never longer than asked.

Messages that echo what a user passed (an answer, a model, an exception from their code) use
these: an object whose ``__repr__`` or ``__str__`` raises, an integer too long to print, a deeply
nested list or a 10 MB string still give a short, readable description.
"""

from __future__ import annotations

import reprlib
from itertools import islice
from typing import Any


class _ShortRepr(reprlib.Repr):
    """reprlib without its sorting of whole dicts and sets (slow for a million keys) and with
    a description for integers too long for ``repr``."""

    def repr_dict(self, x: Any, level: int) -> str:
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        pieces = [
            f"{self.repr1(k, level - 1)}: {self.repr1(x[k], level - 1)}"
            for k in islice(iter(x), self.maxdict)
        ]
        return "{" + ", ".join(pieces + (["..."] if len(x) > self.maxdict else [])) + "}"

    def repr_set(self, x: Any, level: int) -> str:
        if not x:
            return "set()"
        pieces = [self.repr1(item, level - 1) for item in islice(iter(x), self.maxset)]
        return "{" + ", ".join(pieces + (["..."] if len(x) > self.maxset else [])) + "}"

    def repr_instance(self, x: Any, level: int) -> str:
        try:
            text = repr(x)
        except Exception:
            return f"<{_type_name(x)} object that cannot be shown>"
        return text if len(text) <= self.maxother else text[: self.maxother - 3] + "..."

    def repr_int(self, x: Any, level: int) -> str:
        return _big_int(x) if x.bit_length() > 600 else super().repr_int(x, level)


_REPR = _ShortRepr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxset = 3, 6, 6, 6
_REPR.maxfrozenset, _REPR.maxdict, _REPR.maxdeque, _REPR.maxarray = 6, 4, 6, 6
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 200, 200, 200


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


def _type_name(value: Any) -> str:
    try:
        return type(value).__name__
    except Exception:  # a metaclass whose __name__ raises
        return "object"


def _big_int(value: int) -> str:
    digits = int(abs(value).bit_length() * 0.30103) + 1
    return f"<a{' negative' if value < 0 else 'n'} integer of about {digits:,} digits>"


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters; a description when repr fails."""
    try:
        text = _REPR.repr(value)
        if not isinstance(text, str):
            raise TypeError
    except Exception:
        text = f"<{_type_name(value)} object that cannot be shown>"
    return _shorten(text, limit)


def short_str(value: Any, limit: int = 200) -> str:
    """``str(value)`` cut to ``limit`` characters (an exception's message, a name); falls back
    to ``short_repr`` when str fails or is not text."""
    if type(value) is str:
        return _shorten(value, limit)
    if type(value) is int and value.bit_length() > 600:
        return _big_int(value)
    try:
        text = str(value)
        if type(text) is not str:
            raise TypeError
    except Exception:
        return short_repr(value, limit)
    return _shorten(text, limit)


def describe_error(err: BaseException, limit: int = 200) -> str:
    """'TypeError: message' for any exception, the message cut to ``limit`` characters."""
    message = short_str(err, limit)
    return f"{_type_name(err)}: {message}" if message else _type_name(err)
