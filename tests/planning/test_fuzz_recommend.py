"""Fuzzing the recommender with every kind of input: names right and wrong, numbers of any size
(NaN, infinities, integers beyond a float, numpy's), strings of any length. ``recommend``
either answers (its text, HTML and JSON all build) or raises a LessonkitError whose message is
short and names what was wrong; nothing else escapes. Its options are sound: ranked fits first,
each within the budget and the GPU's memory.

Cases run (derandomized): 200 + 100 = 300.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from unittest import mock

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lessonkit
from lessonkit import LessonkitError

FUZZ = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CASES_ANY, CASES_VALID = 200, 100

hostile = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.sampled_from([10**400, -(10**400), 2**1024, 0, -0.0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([np.int64(4), np.float32(2.5), np.float64("nan"), np.bool_(True), np.uint8(3)]),
    st.sampled_from([Fraction(1, 3), Fraction(10**400, 1)]),
    st.text(max_size=40),
    st.sampled_from(["x" * 100_000, "9" * 5000, "1e400", "-1", "$2/h", "50M", "free", "\udcff"]),
    st.builds(mock.MagicMock),
    st.lists(st.integers(), max_size=2),
)
models = st.one_of(
    st.sampled_from(["7B", "gpt2", "llama-3-8b", "70B", "1.5B", "qwen2.5-7b", "350M"]), hostile
)
methods = st.one_of(st.sampled_from([None, "full", "lora", "qlora", "QLoRA"]), hostile)
budgets = st.one_of(st.sampled_from([None, "free", "low", "high", 2, 0.5, "$3/h"]), hostile)
platforms = st.one_of(
    st.sampled_from([None, "colab", "kaggle", "lambda", "hobbyist", "enterprise", 1, 3]), hostile
)
tokens = st.one_of(st.sampled_from([None, "50M", 1e8, 10**7]), hostile)


def check_answer(rec: lessonkit.planning.recommender.Recommendation) -> None:
    assert isinstance(rec.text(), str) and isinstance(rec._repr_html_(), str)
    json.loads(rec.to_json())
    fits = [option for option in rec.options if option.fits]
    assert fits == rec.options  # every option offered fits
    for option in rec.options:
        assert option.peak_bytes <= option.usable_bytes
        if rec.budget is not None and option.tier != "own hardware":
            assert option.price_per_hour <= rec.budget + 1e-9
    tight = [option.tight for option in rec.options]
    assert tight == sorted(tight)  # comfortable fits first


VALID = {
    "model": models.filter(lambda m: isinstance(m, str) and m in ("7B", "llama-3-8b", "1.5B")),
    "method": st.sampled_from([None, "lora", "qlora"]),
    "budget": st.sampled_from([None, "low", 2.0]),
    "platform": st.sampled_from([None, "colab", "lambda"]),
    "tokens": st.sampled_from([None, "50M"]),
    "mfu": st.just(0.35),
    "batch_size": st.sampled_from([1, 4]),
    "seq_len": st.sampled_from([256, 512]),
}
ODD = {
    "model": models,
    "method": methods,
    "budget": budgets,
    "platform": platforms,
    "tokens": tokens,
    "mfu": hostile,
    "batch_size": hostile,
    "seq_len": hostile,
}


@st.composite
def arguments(draw: st.DrawFn) -> dict:
    """recommend()'s arguments, one or two of them odd, the others valid: so that each odd
    value reaches the check of its own argument."""
    odd = draw(st.sets(st.sampled_from(sorted(ODD)), min_size=1, max_size=2))
    return {name: draw(ODD[name] if name in odd else VALID[name]) for name in ODD}


@settings(max_examples=CASES_ANY, **FUZZ)
@given(arguments())
def test_recommend_answers_or_says_what_was_wrong(kwargs):
    try:
        rec = lessonkit.recommend(**kwargs)
    except LessonkitError as err:
        text = str(err)
        assert 0 < len(text) < 1500, text[:300]
        return
    check_answer(rec)


@settings(max_examples=CASES_VALID, **FUZZ)
@given(
    st.sampled_from(["7B", "13B", "llama-3.2-1b", "llama-3.2-3b", "qwen2.5-14b", "70B"]),
    st.sampled_from([None, "full", "lora", "qlora"]),
    st.one_of(st.none(), st.floats(0, 50), st.sampled_from(["free", "low", "high"])),
    st.sampled_from([None, "colab", "kaggle", "lambda", "runpod", "engineer", "enterprise"]),
    st.one_of(st.none(), st.integers(10**5, 10**10)),
    st.integers(1, 16),
    st.sampled_from([128, 512, 1024, 4096]),
    st.sampled_from([int, np.int64, float]),
)
def test_valid_input_is_always_answered_soundly(model, method, budget, platform, n, b, s, kind):
    rec = lessonkit.recommend(
        model, method, budget, platform, n, batch_size=kind(b), seq_len=kind(s)
    )
    check_answer(rec)
    if rec.options:
        assert rec.best is rec.options[0]
    elif budget is None or (isinstance(budget, float) and math.isfinite(budget)):
        assert rec.left_out  # nothing fits: each environment says why
