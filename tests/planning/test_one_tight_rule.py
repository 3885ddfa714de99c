"""One 'tight' rule across the kit: a fit with less than TIGHT_FRACTION (5%) of the usable
memory left is tight wherever the kit judges a fit (Fit.verdict, the recommender's options and
notes, the fit sentences of the health check and of the guide's checks), and nowhere else.
Before, 97.6% of an A100 was 'fits' in the decision flow while 95% was 'tight' in the health
check."""

from __future__ import annotations

import re

import pytest

from lessonkit import get_gpu, recommend, resolve_model
from lessonkit.hardware.gpu_records import TIGHT_FRACTION, fit_verdict, is_tight, used_text
from lessonkit.planning import TIGHT_FRACTION as PLANNING_TIGHT
from lessonkit.planning.fitting import find_fit
from lessonkit.planning.verdicts import _fit_words, fit_sentence, flow_notes
from lessonkit.units import GiB


def test_the_rule_is_one_constant_and_one_function():
    assert PLANNING_TIGHT is TIGHT_FRACTION == 0.05
    usable = 100 * GiB
    assert fit_verdict(94 * GiB, usable) == "fits"
    assert fit_verdict(95.5 * GiB, usable) == "fits, tight"
    assert fit_verdict(100 * GiB, usable) == "fits, tight"
    assert fit_verdict(100.1 * GiB, usable) == "does not fit"
    assert not is_tight(101 * GiB, usable)  # not fitting is not tight
    assert used_text(97.6 * GiB, usable) == "97.6% used, tight"
    assert used_text(50 * GiB, usable) == "50.0% used"


def test_the_decision_flows_976_percent_of_an_a100_is_tight():
    """The case of the issue: LoRA of 70B on 8 x A100 80GB peaks at 97.6% of each card."""
    spec = resolve_model("70B")
    a100 = get_gpu("A100 80GB")
    fit = find_fit(spec, "lora", a100.usable_bytes, 8)
    assert fit.fits and fit.peak_bytes / fit.usable_bytes > 1 - TIGHT_FRACTION
    assert fit.verdict == "fits, tight"
    ok, words = _fit_words(spec, "lora", a100, 8)
    assert ok and "tight" in words
    assert "tight" in flow_notes(spec)["cluster"]


@pytest.mark.parametrize(
    ("size", "method", "budget"), [("7B", None, "free"), ("70B", None, None), ("13B", "lora", None)]
)
def test_every_option_says_tight_exactly_when_the_rule_says_so(size, method, budget):
    rec = recommend(size, method=method, budget=budget)
    assert rec.options
    for option in rec.options:
        rule = is_tight(option.peak_bytes, option.usable_bytes)
        assert option.tight == rule
        assert ("tight" in option.note.split(";")[0]) == rule, option.note


@pytest.mark.parametrize("gpu_name", ["T4", "RTX 4090", "A100 80GB", "RTX PRO 6000"])
@pytest.mark.parametrize("size", ["7B", "13B", "70B"])
def test_the_fit_sentences_say_tight_exactly_when_the_rule_says_so(gpu_name, size):
    spec, gpu = resolve_model(size), get_gpu(gpu_name)
    sentence = fit_sentence(spec, gpu.label, gpu.usable_bytes, 1, gpu.native_bf16)
    for method in ("qlora", "lora", "full"):
        fit = find_fit(spec, method, gpu.usable_bytes, 1, native_bf16=gpu.native_bf16)
        if not fit.fits:
            continue
        share = re.search(
            rf"{re.escape(f'{fit.peak_bytes / GiB:.1f} GiB')}, ([0-9.]+% used(, tight)?)",
            sentence,
        )
        assert share, (method, sentence)
        assert bool(share.group(2)) == fit.tight, (method, sentence)


def test_fit_sentences_on_unified_memory_say_what_usable_means():
    """On a DGX Spark the health check sees total_memory (121.7 GiB, the whole pool the CPU
    shares); the fit sentence says that the run must fit in what mem_get_info reports free."""
    spark = get_gpu("DGX Spark")
    spec = resolve_model("70B")
    for label in ("121.7 GiB DGX Spark", spark.label):
        sentence = fit_sentence(spec, label, spark.usable_bytes)
        assert spark.unified_memory_note in sentence and "mem_get_info" in sentence
    assert "mem_get_info" not in fit_sentence(spec, "79.2 GiB A100 80GB", 79 * GiB)
    options = [o for o in recommend(spec, method="qlora").options if o.gpu == "DGX Spark"]
    assert options and all("unified memory" in o.note for o in options)
    ok, words = _fit_words(spec, "qlora", spark)
    assert ok and spark.memory_text in words
