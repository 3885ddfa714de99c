"""What a reveal says: how a guess compares with the answer, and what it missed.

A memory guess is compared in GiB and percent; with a MemoryReport as the answer, the reveal
also says which parts of the breakdown the guess covers and which it leaves out. A GPU guess
sold with the same memory as the answer, that offers PyTorch at least as much, is a tie and
counts as right; a wrong one says how its memory compares with the answer's.
"""

from __future__ import annotations

import math
import numbers
from itertools import islice
from typing import Any

from ..errors import normalise_name
from ..safe_repr import short_str
from .guesses import Guess, clean, echo, memory_text, shorten

CLOSE = 0.10  # a memory guess within 10% of the answer counts as close
_MAX_NAMES = 100  # the most names of an answer read
_SHOWN_NAMES = 6  # the most names of an answer shown
_SMALLEST_PART = 0.002  # parts of a breakdown below this share of the total are not named
# The parts of a breakdown as a sentence names them, in the order a student adds them up.
_PART_NAMES = {
    "weights": "the weights",
    "gradients": "the gradients",
    "optimizer": "the optimizer states",
    "activations": "the activations",
    "logits": "the fp32 logits and loss",
    "temporaries": "the temporaries",
    "cuda_context": "the CUDA context",
    "allocator_margin": "the allocator margin",
}


def compare(read: Guess, actual: Any) -> str:
    """The reveal's sentence for a guess already read."""
    if read.kind == "text":
        if not read.ok:
            return f"{read.message} (The answer is in the numbers above.)"
        return f'You wrote: "{shorten(read.value)}". Compare it with the numbers above.'
    if read.kind == "memory":
        return _compare_memory(read, actual)
    return _compare_names(read, actual)


# ----- memory -------------------------------------------------------------------------------
def _answer_memory(actual: Any) -> tuple[float, list[tuple[str, float]]] | None:
    """(total bytes, [(part, bytes)] of a breakdown, or []) of an answer; None if unreadable."""
    parts: list[tuple[str, float]] = []
    if hasattr(actual, "total_bytes"):
        breakdown = getattr(actual, "breakdown", None)
        total = actual.total_bytes
        if isinstance(breakdown, dict):
            for key, value in islice(breakdown.items(), 50):
                size = float(value)
                if size > 0 and math.isfinite(size):
                    parts.append((str(key), size))
    else:
        total = actual
    if isinstance(total, bool):
        return None
    try:
        value = float(total)
    except Exception:  # not a number, too large for a float, or a __float__ that raises
        return None
    if not math.isfinite(value) or value < 0:
        return None
    # Parts too small to show in GiB (activations at batch 1) are not named.
    return value, [(part, size) for part, size in parts if size >= _SMALLEST_PART * value]


def _percent(ratio: float) -> str:
    if 0 < ratio < 0.005:
        return "less than 1%"
    return f"{ratio:.0%}"


def _compare_memory(read: Guess, actual: Any) -> str:
    answer = _answer_memory(actual)
    if answer is None:
        return f"{read.message} (The answer passed to reveal is not a size: {echo(actual)}.)"
    total, parts = answer
    if not read.ok:
        return f"{read.message} (The answer: {memory_text(total)}.)"
    guess = float(read.value)
    start = f"You guessed {memory_text(guess)}; the answer is {memory_text(total)}"
    gap = guess - total
    if total <= 0:
        return f"{start}: {memory_text(abs(gap))} too high."
    ratio = abs(gap) / total
    direction = "too high" if gap > 0 else "too low"
    if ratio <= CLOSE:
        return f"{start}: close, {memory_text(abs(gap))} ({_percent(ratio)}) {direction}."
    side = "above" if gap > 0 else "below"
    share = f"{ratio + 1:,.3g} times the answer" if ratio >= 10 else f"{_percent(ratio)} {side}"
    text = f"{start}: {memory_text(abs(gap))} {direction} ({share})."
    if parts:
        text += " " + (_what_is_missing(guess, parts) if gap < 0 else _above_every_part(parts))
    return text


def _name(part: str) -> str:
    return _PART_NAMES.get(part, f"the {shorten(part.replace('_', ' '), 40)}")


def _names(parts: list[tuple[str, float]]) -> str:
    names = [_name(part) for part, _ in parts]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _listed(parts: list[tuple[str, float]]) -> str:
    """The largest few parts, with their sizes: 'the temporaries (25.1 GiB), ...'."""
    largest = sorted(parts, key=lambda item: -item[1])
    shown = [f"{_name(part)} ({memory_text(size)})" for part, size in largest[:3]]
    more = len(largest) - len(shown)
    if more:
        shown.append(f"{more} smaller part{'s' if more > 1 else ''}")
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"


def _what_is_missing(guess: float, parts: list[tuple[str, float]]) -> str:
    """Which parts of the breakdown, added up in order, a guess below the answer covers."""
    running, covered = 0.0, 0
    for _, size in parts:
        if running + size > guess * (1 + CLOSE / 2):
            break
        running += size
        covered += 1
    if covered == 0:
        first, size = parts[0]
        rest = parts[1:]
        text = f"It is less than {_name(first)} alone ({memory_text(size)})"
        return text + (f"; the peak also holds {_listed(rest)}." if rest else ".")
    done, rest = parts[:covered], parts[covered:]
    if guess <= running * (1 + CLOSE / 2) and guess >= running * (1 - CLOSE / 2):
        together = " together" if len(done) > 1 else " alone"
        text = f"It is about {_names(done)}{together} ({memory_text(running)})"
        return text + (f"; it leaves out {_listed(rest)}." if rest else ".")
    next_part = rest[0]
    together = " together" if covered > 1 else ""
    text = (
        f"It covers {_names(done)} ({memory_text(running)}{together}) but not all of "
        f"{_name(next_part[0])} ({memory_text(next_part[1])})"
    )
    return text + (f"; still left out: {_listed(rest[1:])}." if rest[1:] else ".")


def _above_every_part(parts: list[tuple[str, float]]) -> str:
    part, size = max(parts, key=lambda item: item[1])
    return (
        f"It is more than the whole peak; its largest part is {_name(part)} ({memory_text(size)})."
    )


# ----- names ------------------------------------------------------------------------------------
def _answer_names(actual: Any) -> list[str]:
    """The names an answer stands for: a name, a record with a name, or a collection of them."""
    if isinstance(actual, str):
        items: list[Any] = [actual]
    elif hasattr(type(actual), "__iter__") and not hasattr(actual, "usable_bytes"):
        items = list(islice(iter(actual), _MAX_NAMES))
    else:
        items = [actual]
    names = []
    for item in items:
        try:
            name = str.__str__(item) if isinstance(item, str) else getattr(item, "name", item)
        except Exception:  # a record whose attributes raise: shown as what it is
            name = item
        names.append(clean(short_str(name, 100)))
    return sorted(dict.fromkeys(names))


def _shown_names(names: list[str]) -> str:
    if not names:
        return "none"
    shown = names[:_SHOWN_NAMES]
    more = f" (and {len(names) - len(shown)} more)" if len(names) > len(shown) else ""
    return " or ".join(shown) + more


def _compare_names(read: Guess, actual: Any) -> str:
    if isinstance(actual, (int, float, numbers.Number)) and not isinstance(actual, bool):
        # reveal was handed a figure where a name belongs: say so rather than compare names
        what = "GPU" if read.kind == "gpu" else "environment"
        return f"{read.message} (reveal needs the {what}'s name here, not a number.)"
    given = getattr(actual, "names", None)  # a course answer stands for the names it gives
    names = _answer_names(list(given) if isinstance(given, tuple) else actual)
    shown = _shown_names(names)
    if not read.ok:
        return f"{read.message} (The answer: {shown}.)"
    start = f"You guessed {read.value}; the answer is {shown}"
    if normalise_name(read.value) in {normalise_name(n) for n in names}:
        return f"{start}: right."
    if read.kind == "gpu":
        return start + _gpu_remark(read.value, names)
    return start + _environment_remark(read.value, actual)


def _environment_remark(guessed: str, actual: Any) -> str:
    """': not this time', with what the guessed environment's cheapest run costs where the
    answer carries each environment's cost (a course answer's ``costs``)."""
    try:
        costs = dict(getattr(actual, "costs", ()) or ())
        answer_cost = float(actual.figure)
    except Exception:  # a plain set of names, or a record that cannot say: no reason to give
        return ": not this time."
    for name, cost in costs.items():
        if normalise_name(str(name)) == normalise_name(guessed):
            if cost == 0:
                return f": not this time. {name} is free, but the question asks for a paid one."
            return (
                f": not this time. {name}'s cheapest setup that fits costs ${cost:,.2f} for "
                f"the whole run, against ${answer_cost:,.2f}."
            )
    return f": not this time. {guessed} has no setup that fits this run."


def _gpu_remark(guessed: str, names: list[str]) -> str:
    """': right, a tie ...' for a card sold with the same memory that offers at least as much,
    else ': not this time' with how its memory compares with the answer's."""
    from ..hardware.gpus import find_gpu

    guess = find_gpu(guessed)
    answers = [gpu for gpu in (find_gpu(n) for n in names[:_MAX_NAMES]) if gpu is not None]
    if guess is None or not answers:
        return ": not this time."
    same = [a for a in answers if a.memory_gb == guess.memory_gb]
    for answer in same:
        if guess.current_wheels and guess.usable_bytes >= answer.usable_bytes:
            return (
                f": right, a tie. The {guess.name} is sold with {guess.memory_gb:g} GB like the "
                f"{answer.name}, and offers PyTorch as much or more "
                f"({memory_text(guess.usable_bytes)} usable against "
                f"{memory_text(answer.usable_bytes)})."
            )
    if same:
        answer = same[0]
        why = (
            "current PyTorch wheels have no kernels for it"
            if not guess.current_wheels
            else f"it offers PyTorch less ({memory_text(guess.usable_bytes)} usable against "
            f"{memory_text(answer.usable_bytes)})"
        )
        return (
            f": not this time. The {guess.name} is sold with the same {guess.memory_gb:g} GB as "
            f"the {answer.name}, but {why}."
        )
    answer = answers[0]
    return (
        f": not this time. The {guess.name} is sold with {guess.memory_gb:g} GB, the "
        f"{answer.name} with {answer.memory_gb:g} GB."
    )
