"""Fuzzing the OOM doctor and ``watch()``: generated messages in every wording, with figures of
any size, inside logs of noise, and right, wrong or hostile run settings.

- the doctor never raises, its diagnosis always prints and converts to JSON, in bounded size;
- a clean message is read figure by figure, whatever the noise around it;
- a log read in pieces of any size gives what the whole log gives;
- ``watch()`` re-raises the very same exception, whatever the error, the settings or the file.

Cases run (derandomized, so every run is the same): 250 + 150 + 150 + 200 = 750.
"""

from __future__ import annotations

import io
import json
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oom_strategies import NEW, clean_number, expected_bytes, log, message, noise  # tests/
from oom_strategies import settings as run_settings

from lessonkit import oom_doctor
from lessonkit.planning.oom_messages import parse_oom, read_log

FUZZ = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CASES_DOCTOR, CASES_CLEAN, CASES_PIECES, CASES_WATCH = 250, 150, 150, 200


@settings(max_examples=CASES_DOCTOR, **FUZZ)
@given(st.one_of(log(), message(), st.binary(max_size=200)), run_settings)
def test_the_doctor_never_raises_and_always_prints(text, run):
    diagnosis = oom_doctor(text, **run)
    shown = str(diagnosis)
    assert isinstance(shown, str) and len(shown) < 30_000
    json.dumps(diagnosis.to_dict(), default=str)
    assert isinstance(repr(diagnosis), str)
    if not diagnosis.recognized:
        assert shown.startswith("This is not an out-of-memory message I know")


@settings(max_examples=CASES_CLEAN, **FUZZ)
@given(
    st.lists(
        st.tuples(clean_number, st.sampled_from(["MiB", "GiB", "KiB", "bytes"])),
        min_size=8,
        max_size=8,
    ),
    st.integers(0, 15),
    noise,
    noise,
    st.sampled_from(["", "[rank0]: ", "torch.OutOfMemoryError: "]),
)
def test_a_clean_message_is_read_figure_by_figure(figures, device, before, after, prefix):
    sizes = [f"{number} {unit}" for number, unit in figures]
    text = NEW.format(*sizes, kind="CUDA", dev=device, pid=4242, capacity="capacity")
    message_read = parse_oom(before + "\n" + prefix + text + "\n" + after.replace("CUDA", "x"))
    if "OutOfMemoryError" in after or "[rank0]:" in after:  # a later error, or a later bare one
        return
    assert message_read is not None and message_read.device == device
    assert message_read.tried_bytes == expected_bytes(sizes[0])
    assert message_read.total_bytes == expected_bytes(sizes[1])
    assert message_read.free_bytes == expected_bytes(sizes[2])
    assert message_read.other_processes == [(4242, expected_bytes(sizes[3]))]
    assert message_read.process_bytes == expected_bytes(sizes[4])
    assert message_read.allocated_bytes == expected_bytes(sizes[5])
    assert message_read.private_pool_bytes == expected_bytes(sizes[6])
    assert message_read.reserved_bytes == expected_bytes(sizes[5]) + expected_bytes(sizes[7])
    assert message_read.unreadable == []


@settings(max_examples=CASES_PIECES, **FUZZ)
@given(log(), st.lists(st.integers(1, 5000), min_size=1, max_size=8))
def test_a_log_read_in_pieces_reads_as_the_whole_log(text, sizes):
    pieces, start, index = [], 0, 0
    while start < len(text):
        size = sizes[index % len(sizes)]
        pieces.append(text[start : start + size])
        start, index = start + size, index + 1
    whole = parse_oom(text)
    streamed = read_log(pieces)
    assert (whole is None) == (streamed is None)
    if whole is not None:
        assert streamed.to_dict() == whole.to_dict()


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("cannot print")


class OutOfMemoryError(RuntimeError):
    """Named as torch's is."""


class RaisingFile:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def write(self, text: str) -> int:
        raise self.error

    def flush(self) -> None:
        raise self.error


def closed() -> io.StringIO:
    file = io.StringIO()
    file.close()
    return file


files = st.sampled_from(
    [
        None,
        "string",
        "closed",
        OSError(28, "No space left on device"),
        ValueError("closed"),
        UnicodeEncodeError("ascii", "é", 0, 1, "no"),
        RuntimeError("odd file"),
        42,
    ]
)
errors = st.builds(
    lambda kind, text: kind(text) if kind is not Unprintable else Unprintable(),
    st.sampled_from(
        [RuntimeError, ValueError, KeyError, MemoryError, OutOfMemoryError, Unprintable]
    ),
    st.one_of(message(), log(), st.text(max_size=50)),
)


@settings(max_examples=CASES_WATCH, **FUZZ)
@given(errors, files, run_settings, st.booleans())
def test_watch_reraises_the_very_same_exception(error, file, run, with_objects):
    if file == "string":
        file = io.StringIO()
    elif file == "closed":
        file = closed()
    elif isinstance(file, BaseException):
        file = RaisingFile(file)
    objects = (mock.MagicMock(),) if with_objects else ()
    run = {k: v for k, v in run.items() if k not in ("model", "gpu")} | {
        "model": run.get("model"),
        "gpu": run.get("gpu"),
    }
    with pytest.raises(BaseException) as raised, oom_doctor.watch(*objects, file=file, **run):
        raise error
    assert raised.value is error
    assert error.__context__ is None and error.__cause__ is None
    if isinstance(file, io.StringIO) and not file.closed:
        printed = file.getvalue()
        assert ("lessonkit.oom_doctor:" in printed) == oom_doctor(error).recognized
