"""Numbers of any kind into recommend, estimate and the size parsers: integers too large for a
float, NaN and infinities refused with a message that names the setting, numpy's integers and
floats taken where Python's are, long inputs echoed shortened, and enough digits shown to see
why a value was refused. What promises never to raise (describe_run) never does."""

from __future__ import annotations

import math
from fractions import Fraction
from unittest import mock

import numpy as np
import pytest

import lessonkit
from lessonkit import LessonkitError
from lessonkit.errors import positive_int, positive_number
from lessonkit.planning.training_objects import describe_run
from lessonkit.units import parse_bytes, parse_count

HUGE = 10**400
RECOMMEND = dict(model="7B", method="qlora", platform="colab")


def refused(call, *words: str) -> str:
    with pytest.raises(LessonkitError) as raised:
        call()
    message = str(raised.value)
    assert len(message) < 600, message[:300]
    for word in words:
        assert word in message, message
    return message


@pytest.mark.parametrize("value", [HUGE, -HUGE, 2**1024], ids=["1e400", "-1e400", "2**1024"])
@pytest.mark.parametrize("name", ["budget", "tokens", "mfu"])
def test_integers_beyond_any_float_are_refused_with_a_message(name, value):
    refused(lambda: lessonkit.recommend(**RECOMMEND, **{name: value}), name)


@pytest.mark.parametrize("value", [HUGE, -HUGE], ids=["1e400", "-1e400"])
def test_the_size_parsers_refuse_integers_beyond_any_float(value):
    refused(lambda: parse_count(value), "parameter count")
    refused(lambda: parse_bytes(value), "size")
    refused(lambda: lessonkit.estimate(value), "size")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, np.float64("nan"), np.inf])
@pytest.mark.parametrize("name", ["budget", "tokens", "mfu", "batch_size", "seq_len"])
def test_nan_and_infinities_are_refused_naming_the_setting(name, value):
    message = refused(lambda: lessonkit.recommend(**RECOMMEND, **{name: value}), name)
    assert "finite" in message or "whole number" in message


@pytest.mark.parametrize("value", [math.nan, math.inf, np.float32("nan")])
@pytest.mark.parametrize("name", ["batch_size", "seq_len", "lora_dropout", "n_gpus"])
def test_estimate_refuses_nan_and_infinities_naming_the_setting(name, value):
    refused(lambda: lessonkit.estimate("7B", method="lora", **{name: value}), name)


LONG = "9" * 1_000_000


@pytest.mark.parametrize(
    "call",
    [
        lambda: lessonkit.recommend(**RECOMMEND, budget=LONG),
        lambda: lessonkit.recommend(**RECOMMEND, budget="x" * 10**6),
        lambda: lessonkit.recommend(**RECOMMEND, tokens="x" * 10**6),
        lambda: lessonkit.recommend(**RECOMMEND, tokens=LONG),
        lambda: lessonkit.recommend(**RECOMMEND, mfu="x" * 10**6),
        lambda: lessonkit.estimate("7B", method="lora", lora_dropout="9" * 5000),
        lambda: lessonkit.estimate("7B", batch_size="x" * 10**6),
        lambda: lessonkit.estimate("7B", batch_size=10**5000),
        lambda: parse_bytes("x" * 10**6),
        lambda: parse_bytes("1" * 10**6 + " parsecs"),
        lambda: parse_count("x" * 10**6),
        lambda: lessonkit.get_gpu("x" * 10**6),
        lambda: lessonkit.get_environment("x" * 10**6),
    ],
)
def test_long_inputs_are_echoed_shortened(call):
    refused(call)


def test_a_value_just_above_a_limit_is_shown_with_the_digits_that_matter():
    message = refused(lambda: lessonkit.recommend(**RECOMMEND, mfu=1.0000001), "mfu")
    assert "got 1.0000001" in message
    assert "got 1.0000001" in refused(lambda: positive_number(1.0000001, "x", maximum=1.0))
    assert "got -1e-300" in refused(lambda: positive_number(-1e-300, "x"))


@pytest.mark.parametrize(
    "number", [np.int64(4), np.int32(4), np.uint8(4), np.int16(4), Fraction(4), 4.0]
)
def test_numpy_integers_and_whole_floats_are_taken_as_batch_sizes(number):
    expected = lessonkit.estimate("7B", batch_size=4, seq_len=256)
    report = lessonkit.estimate("7B", batch_size=number, seq_len=np.int64(256))
    assert report.total_bytes == expected.total_bytes
    assert type(report.settings["batch_size"]) is int
    assert positive_int(number, "batch_size") == 4


def test_numpy_numbers_are_taken_wherever_python_numbers_are():
    plain = lessonkit.recommend(
        "7B", method="qlora", budget=2.0, tokens=10**7, mfu=0.35, batch_size=2, seq_len=512
    )
    numpy = lessonkit.recommend(
        np.float64(7e9),
        method="qlora",
        budget=np.float32(2.0),
        tokens=np.int64(10**7),
        mfu=np.float64(0.35),
        batch_size=np.int64(2),
        seq_len=np.int32(512),
    )
    assert [o.to_dict() for o in numpy.options] == [o.to_dict() for o in plain.options]
    assert parse_count(np.int64(7_000_000_000)) == 7e9
    assert parse_bytes(np.float32(16)) == 16e9
    assert lessonkit.resolve_model(np.int64(7_000_000_000)) == lessonkit.resolve_model(7e9)
    dropout = lessonkit.estimate("7B", method="lora", lora_dropout=np.float64(0.1))
    assert (
        dropout.total_bytes == lessonkit.estimate("7B", method="lora", lora_dropout=0.1).total_bytes
    )


@pytest.mark.parametrize("value", [np.bool_(True), True, np.float64(4.5), np.array([4]), "4"])
def test_what_is_not_a_whole_number_is_still_refused(value):
    refused(lambda: lessonkit.estimate("7B", batch_size=value), "batch_size")


@pytest.mark.parametrize(
    "settings",
    [
        dict(gradient_accumulation=mock.MagicMock(), zero_stage=3),
        dict(n_gpus=mock.MagicMock()),
        dict(batch_size=mock.MagicMock()),
    ],
)
def test_describe_run_never_raises(settings, tmp_path):
    from transformers import TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        use_cpu=True,
        report_to=[],
        fsdp="full_shard",
    )
    run = describe_run(args, mock.MagicMock(), model="7B", **settings)
    assert isinstance(run.notes, list)
    run = describe_run(mock.MagicMock(), model=mock.MagicMock(), **settings)
    assert all(len(note) < 1000 for note in run.notes)
