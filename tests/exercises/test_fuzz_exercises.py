"""exercises.check against odd answers of every type, for every question id: it never raises,
answers each with a bounded amount of work, and keeps its feedback short, whatever the answer
does. The seconds are benchmarks/check_speed.py's to print (no test here times anything: a busy
machine must not fail the suite); the reflection check's work is also bounded in
tests/exercises/test_reflections.py."""

from __future__ import annotations

import math
import os
import sys
import time
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from work_counter import count_calls

from lessonkit.exercises.check_result import STATUSES
from lessonkit.exercises.checking import check, question_ids

# The promise: whatever the answer, a check makes a bounded number of function calls (Python
# and C, counted by tests/work_counter.py): up to MAX_CALLS (computing an expected answer takes
# up to about 50,000: 04.1 estimates every preset), plus CALLS_PER_CHARACTER for each character
# of a text answer, up to its first READ_CHARACTERS (a reflection is read clause by clause). Work
# that grows faster than the text, such as a rescan of the whole answer for every match, goes far
# past it: 20,000 characters of sentences once took 416,000 calls.
MAX_CALLS = 100_000
CALLS_PER_CHARACTER = 10
READ_CHARACTERS = 100_000
MESSAGE_CHARS = 2_000  # feedback echoes a short part of an answer, never all of it


def checked(qid: str, answer: object):
    result, calls = count_calls(lambda: check(qid, answer, show=False))
    characters = min(len(answer), READ_CHARACTERS) if type(answer) is str else 0
    assert calls < MAX_CALLS + CALLS_PER_CHARACTER * characters, f"{qid}: {calls:,} calls"
    assert result.status in STATUSES and result.message
    text = str(result) + result._repr_html_()
    assert len(result.message) + sum(map(len, result.details)) < MESSAGE_CHARS, text[:300]
    return result


# ----- answers whose own methods raise --------------------------------------------------------
class Raises:
    """Every dunder a checker might touch raises."""

    def __repr__(self):
        raise RuntimeError("repr")

    def __str__(self):
        raise RuntimeError("str")

    def __float__(self):
        raise RuntimeError("float")

    def __getattr__(self, name):
        raise RuntimeError(f"getattr {name}")

    def __iter__(self):
        raise RuntimeError("iter")

    def __len__(self):
        raise RuntimeError("len")

    def __eq__(self, other):
        raise RuntimeError("eq")

    __hash__ = None


class RaisesOnReprOnly:
    def __repr__(self):
        raise ValueError("no repr")


class ReprIsNotText:
    def __repr__(self):
        return 42


class HugeRepr:
    def __repr__(self):
        return "x" * 10_000_000


class HostileStr(str):
    def __str__(self):
        raise RuntimeError("str")

    def __repr__(self):
        raise RuntimeError("repr")

    def lower(self):
        raise RuntimeError("lower")

    def split(self, *args):
        raise RuntimeError("split")

    def strip(self, *args):
        raise RuntimeError("strip")


class HostileList(list):
    def __iter__(self):
        raise RuntimeError("iter")

    def __repr__(self):
        raise RuntimeError("repr")


class HostileDict(dict):
    def items(self):
        raise RuntimeError("items")

    def __iter__(self):
        raise RuntimeError("iter")


class GetattributeRaises:
    def __getattribute__(self, name):
        raise RuntimeError(name)


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


# ----- student functions that misbehave (question 05.1 runs them) ----------------------------
def calls_exit():
    sys.exit(3)


def calls_builtin_exit():
    raise SystemExit("bye")


def raises_keyboard_interrupt():
    raise KeyboardInterrupt


def loops_forever():
    while True:
        pass


def sleeps():
    time.sleep(2)


def prints_ten_megabytes():
    print("x" * 10_000_000)


def prints_a_long_run_of_digits():
    print("1" * 100_000)


def recurses_forever():
    return recurses_forever()


def wants_an_argument(x):
    print(x)


def generator():
    yield 1


class RaisesOnStr(Exception):
    def __str__(self):
        raise RuntimeError("no message")


def raises_an_exception_that_cannot_print():
    raise RaisesOnStr


def raises_a_huge_message():
    raise ValueError("y" * 10_000_000)


TEN_MB = 10_000_000
ODD_ANSWERS = {
    "int with 5000 digits": 10**5000,
    "negative int with 5000 digits": -(10**5000),
    "smallest subnormal": 5e-324,
    "negative subnormal": -5e-324,
    "largest float": 1e308,
    "negative largest float": -1e308,
    "inf": math.inf,
    "nan": math.nan,
    "zero": 0,
    "-0.0": -0.0,
    "True": True,
    "complex": 3 + 4j,
    "huge Decimal": Decimal("1e999999"),
    "Fraction": Fraction(1, 3),
    "bytes": b"12 GB",
    "bytearray": bytearray(b"12"),
    "1, 10k spaces, x": "1" + " " * 10_000 + "x",
    "10 MB of digits": "1" * TEN_MB,
    "10 MB of letters": "a" * TEN_MB,
    "10 MB of spaces then 5": " " * TEN_MB + "5",
    "10 MB of separators": "1-" * (TEN_MB // 2),
    "ranges over ranges": "1 to " * 20_000 + "2",
    "digits and commas": "1," * 100_000,
    "10 MB of dots": "." * TEN_MB,
    "20k characters of sentences": "The GPU's memory bandwidth is not 14 GB/s. " * 450,
    "unicode digits": "١٢٣ GB",
    "emoji": "💥 GB",
    "NUL": "\x00",
    "exponent overflow": "1e99999 GB",
    "range of huge numbers": "1e308-1e309",
    "newlines": "5\nGB",
    "a million-item list": [1] * 1_000_000,
    "a list of 10 MB strings": ["a" * TEN_MB] * 3,
    "a nested list": nested(100_000),
    "a 100k-entry dict": {str(i): i for i in range(100_000)},
    "a dict with a 10 MB key": {"k" * TEN_MB: 1},
    "a dict of odd values": {"x": Raises()},
    "a set": {1, 2, 3},
    "a generator": (i for i in range(3)),
    "a type": int,
    "a module": math,
    "everything raises": Raises(),
    "repr raises": RaisesOnReprOnly(),
    "repr is not text": ReprIsNotText(),
    "10 MB repr": HugeRepr(),
    "hostile str": HostileStr("5"),
    "hostile list": HostileList(["a"]),
    "hostile dict": HostileDict(a=1),
    "__getattribute__ raises": GetattributeRaises(),
    "calls sys.exit": calls_exit,
    "raises SystemExit": calls_builtin_exit,
    "raises KeyboardInterrupt": raises_keyboard_interrupt,
    "loops forever": loops_forever,
    "sleeps": sleeps,
    "prints 10 MB": prints_ten_megabytes,
    "prints a long run of digits": prints_a_long_run_of_digits,
    "recurses forever": recurses_forever,
    "wants an argument": wants_an_argument,
    "a generator function": generator,
    "an exception that cannot print": raises_an_exception_that_cannot_print,
    "an exception with a 10 MB message": raises_a_huge_message,
}


@pytest.mark.parametrize("label", list(ODD_ANSWERS))
def test_odd_answers_never_raise_and_are_answered_with_bounded_work(label):
    answer = ODD_ANSWERS[label]
    for qid in question_ids():
        result = checked(qid, answer)
        assert result.correct is not True, (qid, result.message)


def test_a_student_function_that_exits_or_loops_is_feedback():
    torch_before = sys.modules.get("torch")
    exits = checked("05.1", calls_exit)
    assert exits.status == "not yet"
    assert all("sys.exit(3)" in d for d in exits.details), exits.details
    loops = checked("05.1", loops_forever)
    assert loops.status == "not yet" and "did not finish" in loops.details[0]
    assert "not run" in loops.details[1]
    interrupted = checked("05.1", raises_keyboard_interrupt)
    assert "KeyboardInterrupt" in interrupted.details[0]
    assert sys.modules.get("torch") is torch_before  # the stand-in is gone again


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_stopped_function_does_not_keep_running(tmp_path):
    """The function's process is killed, with what it started, before check returns."""
    pid_file = tmp_path / "pids"

    def starts_a_helper_and_loops():
        import subprocess

        helper = subprocess.Popen(["sleep", "60"])
        with open(pid_file, "a") as out:
            out.write(f"{os.getpid()} {helper.pid}\n")
        while True:
            pass

    result = checked("05.1", starts_a_helper_and_loops)
    assert "stopped after 0.6 s" in result.details[0]
    pids = [int(pid) for pid in pid_file.read_text().split()]
    assert len(pids) == 2
    assert [pid for pid in pids if not _ended(pid)] == []


def _ended(pid: int) -> bool:
    """Gone, or a zombie waiting to be reaped: killed. A killed process can take a moment to be
    torn down, so this waits for that, up to a hang guard of 30 s (it is not a speed check)."""
    stat = Path(f"/proc/{pid}/stat")
    give_up = time.monotonic() + 30
    while time.monotonic() < give_up:
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.01)
    return False


def test_odd_answers_are_described_not_echoed():
    result = checked("01.1", 10**5000)
    assert "an integer of about 5,001 digits" in result.message
    assert "cannot be shown" in checked("01.1", RaisesOnReprOnly()).message
    long_text = checked("02.2", "a" * TEN_MB)
    assert "10,000,000 characters" in long_text.message
    assert "0.00 GB is too low" in checked("01.1", 5e-324).message


def test_a_right_answer_still_passes_after_the_odd_ones():
    from lessonkit.exercises.checking import answer_key

    for qid in ("01.1", "05.3"):
        assert check(qid, answer_key(qid), show=False).correct is True


# ----- random answers -------------------------------------------------------------------------
NUMBERISH = st.text(alphabet="0123456789 .,-–—+eE$xtoGBMiKkbhsu/", max_size=120)
ANSWERS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.complex_numbers(),
    st.decimals(),
    st.fractions(),
    st.text(max_size=300),
    NUMBERISH,
    st.binary(max_size=50),
    st.lists(st.one_of(st.text(max_size=30), st.integers(), st.floats()), max_size=20),
    st.dictionaries(
        st.one_of(st.text(max_size=30), st.integers()),
        st.one_of(NUMBERISH, st.floats(), st.none()),
        max_size=8,
    ),
    st.sets(st.text(max_size=10), max_size=5),
)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(qid=st.sampled_from(question_ids()), answer=ANSWERS)
def test_random_answers_never_raise(qid, answer):
    checked(qid, answer)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    text=NUMBERISH,
    unit=st.sampled_from(["GB", "s", "h", "$", "$/h", "x", "B/param", "params", "GPUs", "GiB", ""]),
)
def test_the_number_and_range_reader_is_total_and_linear(text, unit):
    from lessonkit.exercises.answer_parsing import _read_number, _read_range, _Unreadable

    def read() -> tuple[object, object]:
        try:
            value: object = _read_number(text, unit)
        except _Unreadable as err:
            value = err
        return value, _read_range(text, unit)

    (value, span), calls = count_calls(read)
    if isinstance(value, _Unreadable):
        assert str(value)
    else:
        assert isinstance(value, float) and math.isfinite(value)
    assert span is None or span[0] <= span[1]
    assert calls < 2_000 + 20 * len(text), calls  # a little work per character, no more
