"""predict and reveal against random guesses and answers of every type: they never raise, and
what they print is short, printable, and never a NaN or an infinity read as a number."""

from __future__ import annotations

import contextlib
import io
import math
import re
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lessonkit.exercises.predictions import KINDS, predict, reveal, reveal_text

MAX_CHARS = 1_500
NUMBER_READ_AS_NONSENSE = re.compile(r"guessed (nan|inf|-)|(nan|inf)%|answer is (nan|-)")


class Raises:
    """Every dunder a reveal might touch raises (Hypothesis shows it by _repr_pretty_)."""

    def _repr_pretty_(self, printer, cycle):
        printer.text("Raises()")

    def __repr__(self):
        raise RuntimeError("repr")

    def __str__(self):
        raise RuntimeError("str")

    def __float__(self):
        raise RuntimeError("float")

    def __eq__(self, other):
        raise RuntimeError("eq")

    def __iter__(self):
        raise RuntimeError("iter")

    def __getattr__(self, name):
        raise RuntimeError(name)

    __hash__ = None


class FakeReport:
    """Something shaped like a MemoryReport, with odd figures."""

    def __init__(self, total, breakdown):
        self.total_bytes = total
        self.breakdown = breakdown


NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=10**300, max_value=10**500),
    st.floats(),
    st.decimals(),
    st.fractions(),
    st.complex_numbers(),
    st.sampled_from([0, -0.0, 1e-300, 5e-324, 1e308, math.inf, -math.inf, math.nan]),
)
TEXTS = st.one_of(
    st.text(max_size=300),
    st.text(alphabet="0123456789 .,-+eE GiBMKTb", max_size=60),
    st.sampled_from(
        ["\ud800", "a\udfffb", "nan GiB", "inf", "1e999 GiB", "-5 GiB", "T4", "kaggle", ""]
    ),
)
ODD = st.one_of(
    st.none(),
    st.just(...),
    st.booleans(),
    st.binary(max_size=30),
    st.builds(Raises),
    st.lists(st.one_of(TEXTS, NUMBERS), max_size=8),
    st.sets(st.text(max_size=12), max_size=5),
    st.dictionaries(st.text(max_size=8), NUMBERS, max_size=4),
)
GUESSES = st.one_of(NUMBERS, TEXTS, ODD)
ANSWERS = st.one_of(
    NUMBERS,
    TEXTS,
    ODD,
    st.builds(
        FakeReport,
        st.one_of(NUMBERS, st.builds(Raises)),
        st.one_of(st.dictionaries(st.text(max_size=12), NUMBERS, max_size=10), st.none()),
    ),
)


def assert_sane(text: str) -> None:
    text.encode("utf-8")  # printable on any standard output: no lone surrogate
    assert 0 < len(text) < MAX_CHARS, len(text)
    assert not NUMBER_READ_AS_NONSENSE.search(text), text


@settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    guess=GUESSES,
    kind=st.one_of(st.sampled_from(KINDS), st.text(max_size=10), st.none()),
    actual=ANSWERS,
    what=st.one_of(TEXTS, st.builds(Raises), st.none()),
)
def test_random_guesses_and_answers_never_raise(guess, kind, actual, what):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        read = predict(guess, kind, what)
        text = reveal(guess, kind, actual)
    printed = out.getvalue()
    assert_sane(read.message)
    assert_sane(text)
    assert printed.count("\n") == 2, printed  # one line each


# ids that are not the word "gpu": that word is the marker of tests needing a CUDA device
@pytest.mark.parametrize("kind", KINDS, ids=[f"{kind} guess" for kind in KINDS])
def test_every_kind_of_guess_against_a_real_report(kind, capsys):
    import lessonkit

    report = lessonkit.estimate("7B", method="lora", precision="bf16")
    answers = {"memory": report, "gpu": {"T4"}, "environment": "Kaggle Notebooks", "text": None}
    for guess in (
        None,
        "",
        "  ",
        10**400,
        math.nan,
        Decimal("1e999999"),
        Fraction(1, 3),
        Raises(),
        "\ud800",
        "x" * 10_000_000,
        ["T4"],
        report,
        lessonkit.get_gpu("T4"),
    ):
        assert_sane(predict(guess, kind, "What").message)
        assert_sane(reveal(guess, kind, answers[kind]))
    capsys.readouterr()


@pytest.mark.parametrize("actual", [-0.0, -1, 0, 3.5, float("nan"), 10**400])
@pytest.mark.parametrize("kind", ["gpu", "environment"])
def test_a_number_given_where_a_name_belongs_is_said_so(kind, actual):
    text = reveal_text("T4", kind, actual)
    assert_sane(text)
    assert "not a number" in text
