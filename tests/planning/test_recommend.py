"""The recommender: answers that match the calculator, the guide's branches, time and cost, bad input."""

from __future__ import annotations

import json
import math

import pytest

from lessonkit import LessonkitError, estimate, get_environment, get_gpu, recommend
from lessonkit.hardware.environments import list_environments
from lessonkit.models.presets import resolve_model
from lessonkit.planning.fitting import (
    QLORA_SLOWDOWN,
    compute_hours,
    find_fit,
    run_hours,
    usual_precision,
)
from lessonkit.units import GiB


@pytest.fixture(scope="module")
def low7b():
    return recommend("7B", budget="low")


@pytest.fixture(scope="module")
def r70b():
    return recommend("70B", tokens="20M")


def test_every_option_matches_the_calculator_and_fits(low7b, r70b):
    for rec in (low7b, r70b):
        assert rec.options
        for option in rec.options[:25]:
            report = estimate(rec.model, **option.settings, device="cuda")
            assert report.total_bytes == option.peak_bytes
            assert option.peak_bytes <= option.usable_bytes == get_gpu(option.gpu).usable_bytes
            assert option.count in get_environment(option.environment).offer(option.gpu).counts


def test_options_are_ranked_comfortable_first_then_cheapest(low7b, r70b):
    keys = [(o.tight, o.usd_per_million_tokens) for o in low7b.options]
    assert keys == sorted(keys)
    costs = [(o.tight, o.cost_usd) for o in r70b.options]
    assert costs == sorted(costs)


def test_low_budget_7b_matches_the_guide_colab_a100_or_lambda(low7b):
    assert all(o.price_per_hour <= 2.0 for o in low7b.options)
    assert low7b.best.price_per_hour == 0  # a free T4 with QLoRA comes first
    assert low7b.best.method == "qlora" and low7b.best.gpu == "T4"
    where = {(o.environment, o.gpu) for o in low7b.options if o.method == "lora"}
    assert ("colab-paid", "A100 40GB") in where
    assert any(env == "lambda" for env, _ in where)
    assert "Flow '7B/8B, low budget" in low7b.guide[0] and "agrees for LoRA" in low7b.guide[0]


def test_the_guides_a100_full_7b_claim_is_shown_to_disagree_with_the_numbers(low7b):
    line = next(g for g in low7b.guide if "A100 80GB: full SFT" in g)
    plain = estimate("7B", method="full", device="cuda").total_bytes
    eight_bit = estimate("7B", method="full", optimizer="adamw-8bit", device="cuda").total_bytes
    assert plain > get_gpu("A100 80GB").usable_bytes >= eight_bit
    assert "disagrees" in line
    assert f"{plain / GiB:.1f} GiB" in line and f"8-bit AdamW ({eight_bit / GiB:.1f} GiB)" in line
    assert not any(
        o.method == "full" and o.count == 1 and o.gpu == "A100 80GB"
        for o in recommend("7B", method="full").options
    )


def test_high_budget_7b_includes_the_guides_local_rtx_4090(low7b):
    high = recommend("7B", budget="high", method="lora")
    local = [o for o in high.options if o.environment == "local" and o.gpu == "RTX 4090"]
    assert local and local[0].purchase_usd and "spread over" in local[0].note
    assert not any(o.environment == "local" for o in low7b.options)  # buying is for a high budget
    assert any("local RTX 4090" in g and "agrees" in g for g in high.guide)


def test_without_a_budget_the_workstation_is_compared_at_its_amortized_price():
    rec = recommend("7B", method="lora", tokens="10M")
    local = [o for o in rec.options if o.environment == "local"]
    assert local and "local" not in rec.left_out
    env = get_environment("local")
    for option in local:
        offer = env.offer(option.gpu)
        spread = sum(offer.purchase_usd) / 2 / env.amortize_hours
        assert option.price_per_hour == pytest.approx(
            (offer.price_per_hour.typical + spread) * option.count
        )
        assert option.cost_usd == pytest.approx(option.hours * option.price_per_hour)
    # A machine you would buy is never offered as one to rent.
    from lessonkit.health.verdict import no_gpu_lines

    assert not any(env.name in line for line in no_gpu_lines(rec.model))


def test_each_environment_left_out_says_the_true_reason():
    names = {e.key for e in list_environments()}
    low = recommend("7B", method="lora", budget="low")
    # Every environment either has an option or a reason.
    assert {o.environment for o in low.options} | set(low.left_out) == names
    assert not {o.environment for o in low.options} & set(low.left_out)
    assert "budget per hour" in low.left_out["local"] and "memory" not in low.left_out["local"]
    assert "RTX 3090" in low.left_out["local"]  # it would fit
    free = recommend("7B", method="lora", budget="free")
    for key in ("colab-paid", "lambda", "runpod"):
        assert free.left_out[key].startswith("over budget")
        cheapest = min(
            o.price_per_hour for o in recommend("7B", method="lora", platform=key).options
        )
        assert f"${cheapest:.2f}/h" in free.left_out[key]
    # Memory comes first: a run no setup holds is left out for memory, whatever the budget.
    for budget in (None, "low", "free"):
        huge = recommend("70B", method="full", budget=budget)
        assert "enough memory" in huge.left_out["local"]
        assert "enough memory" in huge.left_out["colab-free"]
    kaggle = recommend("70B", method="lora").left_out["kaggle"]
    assert "enough memory" in kaggle and "P100 16GB not usable" in kaggle
    assert recommend("7B", platform="colab").left_out["lambda"] == "not on the platform asked for"
    assert "Not here: Your own workstation: buying a card" in low.text()
    assert recommend("7B", method="lora", budget="high").left_out == {}


def test_an_environment_whose_gpus_all_fail_says_so(monkeypatch):
    import dataclasses

    from lessonkit.planning import recommender

    kaggle = get_environment("kaggle")
    broken = dataclasses.replace(kaggle, offers=(kaggle.offer("P100 16GB"),))
    monkeypatch.setattr(recommender, "list_environments", lambda: [broken])
    rec = recommend("0.5B", platform=None)
    assert rec.options == []
    assert rec.left_out["kaggle"].startswith("none of the GPUs it offers is usable: P100 16GB")


def test_the_usual_precision_per_method_is_what_the_options_use(low7b):
    assert {
        o.method: o.settings["precision"] for o in low7b.options if get_gpu(o.gpu).native_bf16
    } == {"full": "bf16-mixed", "lora": "bf16", "qlora": "bf16"}
    assert [usual_precision(m) for m in ("full", "lora", "qlora")] == ["bf16-mixed", "bf16", "bf16"]
    assert usual_precision("full", native_bf16=False) == "fp16-mixed"


def test_70b_needs_a_cluster_for_lora_and_says_so_for_full(r70b):
    lora = [o for o in r70b.options if o.method == "lora"]
    assert lora and all(o.count > 1 or get_gpu(o.gpu).usable_memory_gib > 100 for o in lora)
    assert any(o.gpu == "A100 80GB" and o.count == 8 for o in lora)
    full = [o for o in r70b.options if o.method == "full"]
    assert not any(o.gpu == "A100 80GB" and o.count <= 8 for o in full)  # the guide's 8x A100
    # Enterprise clouds run one job over several 8-GPU nodes, so a full fine-tune has an answer.
    nodes = [o for o in full if o.tier == "enterprise" and o.count > 8]
    assert nodes and all(f"{o.count // 8} nodes of 8 GPUs" in o.note for o in nodes)
    # Weights, gradients and AdamW states alone are 16 bytes per parameter over the GPUs.
    assert all(o.count * o.usable_bytes >= 16 * r70b.model.n_params for o in full)
    flow = next(g for g in r70b.guide if g.startswith("Flow '70B"))
    assert "agrees for LoRA, not for full fine-tuning" in flow
    qlora = find_fit(r70b.model, "qlora", get_gpu("A100 80GB").usable_bytes)
    assert qlora.fits and any("true for QLoRA only" in g for g in r70b.guide)


def test_time_and_cost_follow_6_n_t_plus_attention_and_overheads_at_the_stated_mfu(r70b):
    option = r70b.options[0]
    gpu = get_gpu(option.gpu)
    spec = r70b.model
    ckpt = option.settings["gradient_checkpointing"]
    per_token = {"full": 6, "lora": 4, "qlora": 4}[option.method] + (2 if ckpt else 0)
    attention = (12 + (4 if ckpt else 0)) * spec.n_layers * spec.n_heads * spec.head_dim * 512
    steps = (
        (per_token * spec.n_params + attention)
        * 20e6
        / (option.count * gpu.bf16_tflops * 1e12 * 0.35)
        / 3600
    )
    steps *= QLORA_SLOWDOWN if option.method == "qlora" else 1
    startup = 5 / 60 + 2 * spec.n_params / 200e6 / 3600
    save = 12 * spec.n_params / 500e6 / 3600 if option.method == "full" else 0.0
    assert option.hours == pytest.approx(steps + startup + int(steps) * save)
    assert option.cost_usd == pytest.approx(option.hours * option.price_per_hour)
    slower = recommend("70B", tokens="20M", mfu=0.175)
    same = next(
        o
        for o in slower.options
        if (o.environment, o.gpu, o.count, o.method)
        == (option.environment, option.gpu, option.count, option.method)
    )
    assert same.hours == pytest.approx(2 * steps + startup + int(2 * steps) * save)


def test_lora_skips_weight_gradients_and_qlora_is_slower_than_lora():
    spec = resolve_model("7B")
    full = compute_hours(spec, "full", 1e7, 312)
    lora = compute_hours(spec, "lora", 1e7, 312)
    assert full * 2 / 3 < lora < full
    assert compute_hours(spec, "qlora", 1e7, 312) == pytest.approx(lora * QLORA_SLOWDOWN)


def test_run_time_grows_with_the_sequence_and_counts_fixed_overheads():
    spec = resolve_model("qwen2.5-0.5b")
    short, long = (compute_hours(spec, "full", 1e7, 312, seq_len=n) for n in (128, 32768))
    assert long > 2 * short  # attention's FLOPs grow with the tokens each token attends to
    assert run_hours(spec, "full", 1e7, 312, seq_len=128) > short + 5 / 60
    assert run_hours(spec, "lora", 1e7, 312, sessions=3) == pytest.approx(
        run_hours(spec, "lora", 1e7, 312) + 2 * (5 / 60 + 2 * spec.n_params / 200e6 / 3600)
    )


def test_free_tiers_keep_their_session_and_weekly_limits():
    long = recommend("7B", method="qlora", tokens=1e8)
    assert not any(o.environment in ("colab-free", "kaggle") for o in long.options)
    assert "longer than one 12 h session" in long.left_out["colab-free"]
    assert "30 GPU-hours a week" in long.left_out["kaggle"]
    assert "break a session or weekly limit" in long.rejected
    for option in long.options:
        env = get_environment(option.environment)
        assert env.session_hours is None or option.hours <= option.sessions * env.session_hours
    # A run of about a day on a T4: too long for one free Colab session, three Kaggle sessions.
    mid = recommend("7B", method="qlora", tokens=3e7)
    kaggle = next(o for o in mid.options if o.environment == "kaggle")
    assert 12 < kaggle.hours <= 30 and kaggle.sessions == math.ceil(kaggle.hours / 12)
    assert f"{kaggle.sessions} sessions of up to 12 h" in kaggle.note and "quota" in kaggle.note
    assert "colab-free" in mid.left_out and not any(
        o.environment == "colab-free" for o in mid.options
    )
    short = recommend("0.5B", method="qlora", tokens=1e6)
    colab = next(o for o in short.options if o.environment == "colab-free")
    assert colab.sessions == 1 and colab.hours < 12


def test_gpus_without_current_kernels_or_native_bf16_are_handled():
    rec = recommend("7B", tokens=1e7)
    assert not any(get_gpu(o.gpu).name == "P100 16GB" for o in rec.options)
    assert not get_gpu("P100").current_wheels and "sm_60" in get_gpu("P100").caveat
    for o in rec.options:
        if not get_gpu(o.gpu).native_bf16:
            assert "fp16" in o.note and "in bf16" not in o.note
            assert o.method != "full" or o.settings["precision"] == "fp16-mixed"


def test_arm_and_rocm_gpus_carry_a_caveat():
    rec = recommend("7B", method="qlora", tokens=1e7)
    for name, word in (("GH200", "aarch64"), ("MI300X", "ROCm")):
        options = [o for o in rec.options if o.gpu == name]
        assert options and all(word in o.note for o in options), name


def test_a_run_no_setup_can_hold_says_so_clearly():
    # 2T parameters at 32k tokens: the activations alone outgrow any GPU, however many.
    rec = recommend("2T", method="full", seq_len=32768)
    assert rec.options == [] and rec.best is None
    assert "fits no GPU setup" in rec.needs[0] and "batch 1 x 32768" in rec.needs[0]
    assert "Nothing in the catalog fits" in str(rec)


def test_free_budget_and_platforms_restrict_the_options():
    free = recommend("7B", budget="free")
    assert free.options and all(o.price_per_hour == 0 for o in free.options)
    colab = recommend("7B", platform="colab")
    assert {o.environment for o in colab.options} == {"colab-free", "colab-paid"}
    tier2 = recommend("7B", platform="engineer")
    assert {o.tier for o in tier2.options} == {"engineer"}
    assert {o.environment for o in recommend("7B", platform=3).options} <= {
        "sagemaker",
        "vertex-ai",
        "azure-ml",
    }
    assert {o.environment for o in recommend("7B", platform="local").options} == {"local"}
    assert all(o.price_per_hour <= 1.0 for o in recommend("7B", budget="$1/h").options)


def test_outputs_are_complete(low7b):
    data = json.loads(low7b.to_json())
    assert data["options"][0]["peak_bytes"] == low7b.best.peak_bytes
    assert data["budget_per_hour"] == 2.0 and data["assumptions"]
    assert "<table>" in low7b._repr_html_()
    assert str(low7b).startswith("Recommendation for 7B")
    assert math.isclose(low7b.best.headroom_bytes, low7b.best.usable_bytes - low7b.best.peak_bytes)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(budget=-1), "budget"),
        (dict(budget="cheap"), "budget"),
        (dict(tokens=0), "tokens"),
        (dict(tokens="lots"), "tokens"),
        (dict(method="qlroa"), "method"),
        (dict(platform="lamda"), "Did you mean 'lambda'"),
        (dict(mfu=1.5), "mfu"),
        (dict(batch_size="4"), "batch_size must be a whole number"),
        (dict(batch_size=0), "batch_size"),
        (dict(batch_size=2.5), "batch_size"),
        (dict(batch_size=10**6), "batch_size must be at most"),
        (dict(seq_len=None), "seq_len must be a whole number"),
        (dict(seq_len=-512), "seq_len"),
        (dict(seq_len=10**9), "seq_len must be at most"),
        (dict(mfu="0.3"), "mfu"),
        (dict(budget=[2]), "budget"),
        (dict(tokens=[1]), "tokens"),
        (dict(method=3), "method"),
        (dict(platform=[1]), "environment"),
        (dict(platform=2.5), "environment"),
    ],
)
def test_bad_input_is_a_clear_lessonkit_error(kwargs, message):
    with pytest.raises(LessonkitError, match=message):
        recommend("7B", **kwargs)


@pytest.mark.parametrize("model", [None, True, [7], float("nan"), 1e15])
def test_bad_models_are_a_clear_lessonkit_error(model):
    with pytest.raises(LessonkitError, match="model|size"):
        recommend(model)


def test_fits_takes_bytes_sizes_and_gpus_and_refuses_anything_else():
    report = estimate("7B", method="qlora", precision="bf16")
    t4 = get_gpu("T4")
    peak = report.total_bytes
    assert report.fits(peak) and not report.fits(peak - 1)
    assert report.fits(f"{peak / 1e9 + 0.01:.2f} GB") and not report.fits(
        f"{peak / 1e9 - 0.01:.2f} GB"
    )
    assert report.fits(f"{peak / GiB + 0.01:.2f} GiB") and not report.fits(
        f"{peak / GiB - 0.01:.2f}GiB"
    )
    assert report.fits(t4) == t4.fits(report) == (peak <= t4.usable_bytes)
    for bad, message in [
        ("lots", "size such as '16 GB'"),
        ("16 parsecs", "unit"),
        (None, "GPU memory must be"),
        ([16e9], "GPU memory must be"),
        (True, "GPU memory must be"),
        (float("nan"), "finite"),
        (-1, ">= 0"),
    ]:
        with pytest.raises(LessonkitError, match=message):
            report.fits(bad)


def test_cached_estimates_are_copies_a_caller_may_change():
    from lessonkit.planning.fitting import _estimate, estimate_cached

    spec = resolve_model("7B")
    first = find_fit(spec, "lora", get_gpu("A100 80GB").usable_bytes).report
    peak, notes = first.total_bytes, list(first.assumptions)
    first.breakdown["weights"] += 10**12
    first.assumptions.append("changed by a caller")
    first.settings["lora_targets"].append("k_proj")
    again = find_fit(spec, "lora", get_gpu("A100 80GB").usable_bytes).report
    assert again is not first and again.total_bytes == peak and again.assumptions == notes
    assert again.settings["lora_targets"] == ["q_proj", "v_proj"]
    # One cache for every caller: the same settings give equal reports, never the same object.
    a = estimate_cached("7B", method="lora", precision="bf16", batch_size=4, seq_len=1024)
    b = estimate_cached("7B", method="lora", precision="bf16", batch_size=4, seq_len=1024)
    assert (
        a is not b
        and a.to_dict()
        == b.to_dict()
        == estimate("7B", method="lora", precision="bf16", batch_size=4, seq_len=1024).to_dict()
    )
    # True is not 1: a setting's type is part of the key, so bad input stays bad.
    estimate_cached("7B", gradient_checkpointing=True)
    with pytest.raises(LessonkitError):
        estimate_cached("7B", gradient_checkpointing=1)
    # Unhashable arguments are estimated afresh rather than refused.
    listed = estimate_cached("7B", method="lora", lora_targets=["q_proj", "v_proj"])
    assert listed.total_bytes == estimate("7B", method="lora").total_bytes
    assert (
        _estimate(spec, "lora", True, 1, 0, 4, 512, False).total_bytes
        == find_fit(spec, "lora", 10**15).peak_bytes
    )
    assert find_fit(spec, "lora", 10**15).report is not _estimate(
        spec, "lora", True, 1, 0, 4, 512, False
    )


def test_the_widgets_use_the_one_cached_estimate_and_the_exercises_none(monkeypatch):
    from lessonkit.exercises import expected as exercise_answers
    from lessonkit.planning import fitting
    from lessonkit.widgets import explorers as widgets

    calls = []
    monkeypatch.setattr(fitting, "estimate_cached", lambda *a, **k: calls.append(a) or "report")
    assert widgets._estimate("7B", method="lora") == "report" and len(calls) == 1
    # Exercise answers ask the calculator itself each time (see test_exercises).
    assert not hasattr(exercise_answers, "_estimate")


def test_the_assumptions_quote_the_t4_from_the_catalog(low7b):
    t4 = get_gpu("T4")
    memory = next(a for a in low7b.assumptions if a.startswith("Memory"))
    assert f"about {t4.usable_text} on a 16 GB T4" in memory


def test_unknown_model_is_a_lessonkit_error():
    with pytest.raises(LessonkitError, match="model"):
        recommend("no-such-model")


@pytest.mark.parametrize(("model", "budget"), [("70B", "high"), ("70B", "low"), ("7B", None)])
def test_tight_fits_rank_after_comfortable_ones(model, budget):
    options = recommend(model, budget=budget, tokens=1e8).options
    tight = [o.tight for o in options]
    assert tight == sorted(tight), "a tight fit is ranked above a comfortable one"
    for o in options:
        assert o.tight == (o.usable_bytes - o.peak_bytes < 0.05 * o.usable_bytes)
    assert not options[0].tight


def test_the_health_verdict_and_the_decision_readout_carry_the_caveats_too():
    from lessonkit.health.verdict import no_gpu_lines
    from lessonkit.widgets.explorers import decision_readout

    lines = no_gpu_lines(resolve_model("7B"))
    for line in lines:
        for gpu in ("GH200", "MI300X"):
            if f"x {gpu} on" in line:
                assert get_gpu(gpu).caveat in line
    rec = recommend("7B")
    html_text = decision_readout(["goal", "size", "budget", "colab_lambda"], rec)
    for option in rec.best_per_method().values():
        caveat = get_gpu(option.gpu).caveat
        if caveat:
            assert caveat.replace("'", "&#x27;").replace('"', "&quot;") in html_text
