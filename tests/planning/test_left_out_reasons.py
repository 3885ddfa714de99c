"""Every reason the recommender gives for leaving an environment out is true, recomputed here
for every environment x model size x method x budget (and with a token count, for the session
and weekly limits): 'no GPU setup it offers has enough memory' means no offer at any count fits
with any method tried, and so on for each kind of reason."""

from __future__ import annotations

import re

import pytest

from lessonkit import get_environment, get_gpu, list_environments, recommend, resolve_model
from lessonkit.planning.fitting import find_fit
from lessonkit.units import GiB

SIZES = ("llama-3.2-1b", "7B", "13B", "70B", "qwen2.5-72b")
METHODS = ("full", "lora", "qlora")
RUNS = [
    (size, method, budget, tokens)
    for size in SIZES
    for method in METHODS
    for budget in (None, "low", "free")
    for tokens in (None, 3e8)
]


def _fits(spec, gpu, count, methods):
    return any(
        (fit := find_fit(spec, m, gpu.usable_bytes, count, native_bf16=gpu.native_bf16)) is not None
        and fit.fits
        for m in methods
    )


def _check_memory(spec, env, reason, methods):
    usable = [o for o in env.offers if not o.broken and o.gpu.current_wheels]
    for offer in usable:
        for count in offer.counts:
            assert not _fits(spec, offer.gpu, count, methods), (env.key, offer.gpu.name, count)
    closest = re.search(r"on (\d+) x (.+?), needs ([\d,.]+) GiB per GPU", reason)
    if usable:
        assert closest, reason
        count, gpu, need = int(closest.group(1)), get_gpu(closest.group(2)), closest.group(3)
        offer = env.offer(gpu)
        assert count in offer.counts and float(need.replace(",", "")) * GiB > gpu.usable_bytes
        assert f"against {gpu.memory_text}" in reason
    for name in re.findall(r"\(([^()]+) not usable\)", reason):
        for gpu_name in name.split(", "):
            offer = env.offer(gpu_name)
            assert offer.broken or not offer.gpu.current_wheels


def _check(spec, method, budget, tokens, key, reason):
    env = get_environment(key)
    methods = [method]
    if reason.startswith("no GPU setup it offers has enough memory"):
        _check_memory(spec, env, reason, methods)
    elif reason.startswith("none of the GPUs it offers is usable"):
        assert all(o.broken or not o.gpu.current_wheels for o in env.offers)
    elif " would fit, but " in reason:
        count, gpu = re.match(r"(\d+) x (.+?) would fit, but ", reason).groups()
        assert _fits(spec, get_gpu(gpu), int(count), methods)
        hours = float(re.search(r"the run takes ([\d,.]+) h", reason).group(1).replace(",", ""))
        assert env.too_long(hours), reason
    elif reason.startswith("buying a card is not compared"):
        assert env.tier == 0 and budget not in (None, "high")
        count, gpu = re.search(r": (\d+) x (.+?) would fit", reason).groups()
        assert _fits(spec, get_gpu(gpu), int(count), methods)
    elif reason.startswith("over budget"):
        count, gpu, price, cap = re.search(
            r"fits \((\d+) x (.+?)\) costs \$([\d.]+)/h, the budget is \$([\d.]+)/h", reason
        ).groups()
        assert float(price) > float(cap)
        assert _fits(spec, get_gpu(gpu), int(count), methods)
        unbounded = recommend(spec, method=method, platform=key, tokens=tokens)
        assert min(o.price_per_hour for o in unbounded.options) == pytest.approx(
            float(price), abs=0.005
        )
    else:
        pytest.fail(f"{key}: a reason of no known kind: {reason}")


@pytest.mark.parametrize(("size", "method", "budget", "tokens"), RUNS)
def test_every_reason_for_leaving_an_environment_out_holds(size, method, budget, tokens):
    spec = resolve_model(size)
    rec = recommend(spec, method=method, budget=budget, tokens=tokens)
    keys = {e.key for e in list_environments()}
    with_options = {o.environment for o in rec.options}
    assert with_options | set(rec.left_out) == keys and not with_options & set(rec.left_out)
    for key, reason in rec.left_out.items():
        _check(spec, method, budget, tokens, key, reason)


def test_qlora_of_70b_is_possible_on_sagemakers_eight_a100s():
    """SageMaker rents A100 80GB by 8 or more: QLoRA runs data parallel there, each GPU with
    the whole 4-bit model, and its peak per GPU is what one GPU holds."""
    rec = recommend("70B", method="qlora", tokens=1e7)
    assert "sagemaker" not in rec.left_out
    options = [o for o in rec.options if o.environment == "sagemaker"]
    eight = next(o for o in options if o.gpu == "A100 80GB")
    assert eight.count == 8 and "data parallel (each GPU holds the whole model)" in eight.note
    assert eight.settings["zero_stage"] == 0 and eight.settings["n_gpus"] == 8
    one = find_fit(resolve_model("70B"), "qlora", get_gpu("A100 80GB").usable_bytes, 1)
    assert one.fits and eight.peak_bytes >= one.peak_bytes  # more GPUs never lower it
    # ... and eight GPUs do the work about eight times faster than one would
    single = next(
        o for o in rec.options if o.gpu == "A100 80GB" and o.count == 1 and o.method == "qlora"
    )
    assert single.hours_per_million_tokens == pytest.approx(
        8 * eight.hours_per_million_tokens, rel=1e-6
    )


def test_the_reason_for_a_run_too_big_names_the_setup_that_comes_closest():
    reason = recommend("70B", method="qlora").left_out["colab-free"]
    assert reason.startswith("no GPU setup it offers has enough memory for this run: the closest")
    assert "QLoRA (4-bit) on 1 x T4" in reason and "14.75 GiB usable" in reason
    full = recommend("70B", method="full").left_out["vast-ai"]
    assert "on 8 x H200" in full and "ZeRO-3" in full
