"""The guide's claims that notebooks 2-4 check end in one verdict sentence each, computed from
the catalog: the figures in the sentence are the catalog's, and the verdict word follows them
(a test changes the figures and sees the verdict change)."""

from __future__ import annotations

import re

from lessonkit import (
    get_environment,
    get_gpu,
    list_environments,
    list_gpus,
    planning,
    recommend,
    resolve_model,
)
from lessonkit.planning import guide_claims
from lessonkit.planning.fitting import find_fit
from lessonkit.planning.verdicts import full_on_one_a100_figures
from lessonkit.units import GiB


def _verdict(sentence: str) -> str:
    return re.search(r"^The guide's '[^']*'[^:]*? (?:is|needs) ([^:]+):", sentence).group(1)


def test_the_verdict_functions_are_public_and_each_returns_one_sentence():
    verdicts = planning.guide_claim_verdicts()
    assert set(verdicts) == {
        "a100_price",
        "enterprise_markup",
        "free_tier_memory",
        "free_tier_experiments",
        "colab_a100",
    }
    for name, sentence in verdicts.items():
        assert sentence.startswith("The guide's '"), name
        assert sentence.endswith(".") and sentence.count(". ") == 0, (name, sentence)
        assert getattr(planning, f"{name}_verdict")() == sentence


def test_the_a100_for_about_150_an_hour_is_judged_on_the_gpu_clouds_prices(monkeypatch):
    sentence = planning.a100_price_verdict()
    offers = [
        (e, o) for e in list_environments(tier=2) for o in e.offers if o.gpu.name.startswith("A100")
    ]
    assert len(offers) >= 3
    for env, offer in offers:
        assert f"${offer.price_per_hour.typical:.2f} ({env.name}, {offer.gpu.name})" in sentence
    low = min(o.price_per_hour.low for _, o in offers)
    high = max(o.price_per_hour.high for _, o in offers)
    assert f"${low:.2f}-{high:.2f}" in sentence
    assert _verdict(sentence) == "right"  # $1.64 and $1.29 are within a fifth of $1.50
    monkeypatch.setattr(guide_claims, "GUIDE_A100_PRICE", 5.0)
    assert _verdict(planning.a100_price_verdict()) == "wrong"
    monkeypatch.setattr(guide_claims, "GUIDE_A100_PRICE", 0.70)  # below every offer
    assert _verdict(planning.a100_price_verdict()) == "wrong"


def test_the_enterprise_markup_counts_every_gpu_lambda_and_a_platform_both_rent(monkeypatch):
    sentence = planning.enterprise_markup_verdict()
    lam = get_environment("lambda")
    pairs = []
    for env in list_environments(tier=3):
        for offer in env.offers:
            if offer.gpu in lam.gpus:
                ratio = env.hourly_cost(offer) / lam.hourly_cost(lam.offer(offer.gpu))
                pairs.append(ratio)
                assert f"{offer.gpu.name} on {env.name} {ratio:.1f}x" in sentence
    within = sum(2 <= r <= 3 for r in pairs)
    assert f"{within} of the {len(pairs)} prices compared are 2-3x" in sentence
    assert _verdict(sentence) == ("mostly right" if within / len(pairs) >= 0.5 else "mostly wrong")
    monkeypatch.setattr(guide_claims, "GUIDE_MARKUP", (5.0, 6.0))
    assert _verdict(planning.enterprise_markup_verdict()) == "mostly wrong"


def test_the_free_tiers_12_16gb_is_half_right_and_says_why():
    sentence = planning.free_tier_memory_verdict()
    t4 = get_gpu("T4")
    assert _verdict(sentence) == "half right"
    assert f"{t4.memory_gb:g} GB card, {t4.usable_text} usable" in sentence
    assert "none has 12 GB" in sentence
    assert "2 x T4" in sentence and "P100 16GB has no kernels" in sentence


def test_the_free_tiers_very_small_7b_experiments_is_too_modest_for_qlora():
    sentence = planning.free_tier_experiments_verdict("7B")
    assert _verdict(sentence).startswith("too modest for QLoRA (4-bit), right for full")
    t4 = get_gpu("T4")
    spec = resolve_model("7B")
    qlora = find_fit(spec, "qlora", t4.usable_bytes, 1, native_bf16=False)
    lora = find_fit(spec, "lora", t4.usable_bytes, 1, native_bf16=False)
    assert f"{qlora.peak_bytes / GiB:.1f} of {t4.usable_text}" in sentence
    assert ("LoRA in fp16 fits tightly" in sentence) == lora.tight
    # the tokens a 12 h free Colab session trains agree with the recommender's own timing
    tokens = float(re.search(r"trains about ([\d,]+)M tokens", sentence).group(1)) * 1e6
    within = recommend(spec, method="qlora", platform="colab-free", tokens=0.95 * tokens)
    assert within.options and 11 < within.options[0].hours <= 12
    beyond = recommend(spec, method="qlora", platform="colab-free", tokens=1.05 * tokens)
    assert "longer than one 12 h session" in beyond.left_out["colab-free"]


def test_low_budget_colab_a100_is_said_to_be_the_paid_a100_40gb():
    sentence = planning.colab_a100_verdict()
    paid = get_environment("colab-paid").offer("A100 40GB")
    assert "needs Colab's paid tier" in sentence and "A100 40GB" in sentence
    low, high = paid.price_per_hour.low, paid.price_per_hour.high
    assert f"${low:.2f}-{high:.2f} an hour" in sentence
    assert "free Colab offers only a T4" in sentence
    assert not any(o.gpu.name.startswith("A100") for o in get_environment("colab-free").offers)


def test_the_guides_gpu_table_is_checked_row_by_row():
    rows = planning.guide_gpu_table()
    assert [r.split(",")[0] for r in rows] == [
        "Consumer High-End",
        "Prosumer/Workstation",
        "Enterprise Cloud",
        "State-of-the-Art",
    ]
    h100 = get_gpu("H100 SXM")
    faster = [g for g in list_gpus() if g.bf16_tflops > h100.bf16_tflops]
    assert faster and "is no longer so" in rows[3]
    assert all(f"{g.name} ({g.bf16_tflops:g})" in rows[3] for g in faster)
    assert "holds for QLoRA only" in rows[2] and "pure bf16" in rows[2]
    assert "holds for LoRA only" in rows[1] and "'7B with larger batches' holds" in rows[1]
    assert (
        "'NVIDIA A6000' is the catalog's RTX A6000 (not the RTX 6000 Ada or RTX PRO 6000)"
        in rows[1]
    )
    assert "'NVIDIA A100' is the catalog's A100 80GB (not the A100 40GB)" in rows[2]
    assert "'SFT of 7B/8B models using LoRA' holds" in rows[0]
    for row, gpu in zip(rows, ("RTX 4090", "RTX A6000", "A100 80GB", "H100 SXM"), strict=True):
        assert f"({get_gpu(gpu).memory_gb:g} GB, {get_gpu(gpu).usable_text} usable)" in row


def test_the_gpu_notes_on_the_guide_agree_with_the_calculator():
    """The catalog's notes on the guide's matrix GPUs (data/gpus.json) make claims the
    calculator decides: each one is true."""
    seven, thirteen, seventy = (resolve_model(s) for s in ("7B", "13B", "70B"))

    def fits(spec, method, name):
        gpu = get_gpu(name)
        return find_fit(spec, method, gpu.usable_bytes, 1, native_bf16=gpu.native_bf16).fits

    assert fits(seven, "lora", "RTX 4090") and not fits(seven, "full", "RTX 4090")
    assert fits(thirteen, "lora", "RTX A6000") and not fits(thirteen, "full", "RTX A6000")
    assert fits(seventy, "qlora", "A100 80GB") and not fits(seventy, "lora", "A100 80GB")
    plain, ways = full_on_one_a100_figures(seven)
    assert plain > get_gpu("A100 80GB").usable_bytes and ways  # 'only with 8-bit ... offloading'
    h100 = get_gpu("H100 SXM")
    for name in ("B200", "B300", "MI355X"):
        assert get_gpu(name).bf16_tflops > h100.bf16_tflops
    for name in ("H200", "B200", "B300"):
        assert get_gpu(name).memory_gb > h100.memory_gb
    assert get_gpu("A100 80GB").usable_bytes >= h100.usable_bytes * 0.99  # "same memory"


def test_fastest_is_the_fastest_of_every_offer_not_of_each_environments_cheapest():
    rec = recommend("70B", method="full", tokens=3e8)
    fastest = rec.fastest()
    assert fastest is not None
    assert fastest.hours == min(o.hours for o in rec.options)
    # it is quicker than what any environment's cheapest row would say
    cheapest_rows = {}
    for option in rec.options:
        best = cheapest_rows.get(option.environment)
        if best is None or option.cost_usd < best.cost_usd:
            cheapest_rows[option.environment] = option
    assert fastest.hours <= min(o.hours for o in cheapest_rows.values())
    cheapest = rec.cheapest()
    assert cheapest.cost_usd == min(o.cost_usd for o in rec.options)
    sentence = rec.cheapest_and_fastest()
    assert f"{fastest.name}, {fastest.setup}" in sentence
    assert f"{cheapest.name}, {cheapest.setup}" in sentence
    paid = recommend("7B", method="lora", tokens=1e7).cheapest(paid=True)
    assert paid.price_per_hour > 0


def test_fastest_without_tokens_compares_the_hours_of_a_million_tokens():
    rec = recommend("7B", method="qlora")
    fastest = rec.fastest("qlora")
    assert fastest.hours is None
    assert fastest.hours_per_million_tokens == min(o.hours_per_million_tokens for o in rec.options)
    assert recommend("2T", method="full", seq_len=32768).fastest() is None
