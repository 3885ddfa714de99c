"""The environment catalog: the guide's three tiers, sourced, priced and forgiving lookups."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from lessonkit import LessonkitError, get_environment, list_environments

GUIDE = {
    "colab-free",
    "colab-paid",
    "kaggle",
    "lambda",
    "runpod",
    "vast-ai",
    "sagemaker",
    "vertex-ai",
    "azure-ml",
}


def test_the_guides_environments_are_all_there_in_their_tiers():
    envs = {e.key: e for e in list_environments()}
    assert set(envs) >= GUIDE
    assert {k for k, e in envs.items() if e.tier == 1} == {"colab-free", "colab-paid", "kaggle"}
    assert {k for k, e in envs.items() if e.tier == 2} == {"lambda", "runpod", "vast-ai"}
    assert {k for k, e in envs.items() if e.tier == 3} == {"sagemaker", "vertex-ai", "azure-ml"}


@pytest.mark.parametrize("env", list_environments(), ids=lambda e: e.key)
def test_every_environment_is_sourced_and_complete(env):
    assert env.source and dt.date.fromisoformat(env.as_of)
    assert env.pros and env.cons and env.quotas and env.session_limits and env.offers
    for offer in env.offers:
        p = offer.price_per_hour
        assert 0 <= p.low <= p.typical <= p.high
        assert offer.counts and all(c >= 1 for c in offer.counts)


def test_free_tiers_are_free_and_enterprise_costs_more_than_tier_two():
    assert get_environment("colab").free and get_environment("kaggle").free
    assert not get_environment("lambda").free
    # The guide: enterprise is "often 2-3x the price of Lambda Labs" for the same GPU.
    lam = get_environment("lambda").offer("H100").price_per_hour.typical
    for key in ("sagemaker", "vertex-ai", "azure-ml"):
        assert get_environment(key).offer("H100").price_per_hour.typical >= 2 * lam


def test_kaggle_offers_two_t4_and_flags_its_p100():
    kaggle = get_environment("Kaggle")
    assert 2 in kaggle.offer("T4").counts
    assert kaggle.offer("P100").broken and "T4 x2" in kaggle.hints["no_kernel_image"]


def test_the_guides_a100_for_about_150_an_hour_is_in_tier_two():
    prices = [
        e.offer("a100 80gb").price_per_hour
        for e in list_environments(tier=2)
        if any(g.name == "A100 80GB" for g in e.gpus)
    ]
    assert min(p.low for p in prices) <= 1.5 <= max(p.high for p in prices)


@pytest.mark.parametrize(
    ("query", "key"),
    [
        ("Lambda Labs", "lambda"),
        ("colab", "colab-free"),
        ("Colab Pro", "colab-paid"),
        ("vast.ai", "vast-ai"),
        ("AWS", "sagemaker"),
        ("Azure ML", "azure-ml"),
    ],
)
def test_lookups_forgive_spelling(query, key):
    assert get_environment(query).key == key


def test_unknown_environment_suggests_close_matches():
    with pytest.raises(LessonkitError, match="Did you mean 'lambda'"):
        get_environment("lamda")


def test_an_offer_for_a_gpu_not_offered_says_what_is():
    with pytest.raises(LessonkitError, match="offers T4"):
        get_environment("colab").offer("H100")


@pytest.mark.parametrize("env", list_environments(), ids=lambda e: e.key)
def test_memory_quoted_in_the_texts_is_the_catalogs(env):
    usable = {f"{o.gpu.usable_memory_gib:g}" for o in env.offers}
    for text in env.pros + env.cons:
        for number in re.findall(r"([0-9.]+) GiB usable", text):
            assert number in usable, (env.key, text)


@pytest.mark.parametrize("env", list_environments(), ids=lambda e: e.key)
def test_hourly_ranges_count_a_bought_card_like_the_hourly_cost(env):
    for offer in env.offers:
        low, high = env.hourly_range(offer)
        assert low <= env.hourly_cost(offer) <= high
        assert env.price_range[0] <= low and high <= env.price_range[1]
    if env.amortize_hours:
        offer = env.offers[0]
        low, high = env.hourly_range(offer)
        assert low == offer.price_per_hour.low + offer.purchase_usd[0] / env.amortize_hours
        assert high == offer.price_per_hour.high + offer.purchase_usd[1] / env.amortize_hours
        assert f"-{env.price_range[1]:.2f} per GPU-hour" in str(env) and "spread over" in str(env)


def test_the_workstation_options_price_range_holds_its_hourly_price():
    from lessonkit import recommend

    options = list(recommend("7B", method="lora", platform="local").options)
    assert options
    for option in options:
        low, high = option.price_range
        assert low <= option.price_per_hour <= high


@pytest.mark.parametrize("env", list_environments(), ids=lambda e: e.key)
def test_a_card_size_quoted_next_to_a_gpu_is_the_catalogs(env):
    """'the 96 GB RTX PRO 6000', "the DGX Spark's 128 GB", '(16 GiB card' of a T4: a size
    written beside a GPU's name in an environment's texts is that GPU's memory_gb."""
    from lessonkit import list_gpus

    texts = [*env.pros, *env.cons, env.quotas, env.session_limits, *(o.note for o in env.offers)]
    for gpu in list_gpus():
        name = re.escape(gpu.name)
        for text in texts:
            for size in re.findall(rf"(\d+) GB {name}\b", text) + re.findall(
                rf"{name}'s (\d+) GB", text
            ):
                assert float(size) == gpu.memory_gb, (env.key, gpu.name, text)


def test_the_new_offers_are_rented_where_the_catalog_says():
    runpod, local = get_environment("runpod"), get_environment("local")
    assert runpod.offer("B300").price_per_hour.as_of == "2026-10-07"
    assert "runpod.io/pricing" in runpod.offer("B300").source
    assert runpod.offer("RTX PRO 6000").as_of < runpod.as_of
    spark = local.offer("DGX Spark")
    assert spark.purchase_usd == (3999, 4700) and spark.counts == (1,)
    # bought hardware: power for the board's watts at $0.15-0.30 per kWh (600 W card, 240 W box)
    for gpu, watts in (("RTX PRO 6000", 600), ("DGX Spark", 240)):
        price = local.offer(gpu).price_per_hour
        assert price.low == pytest.approx(watts / 1000 * 0.15, abs=0.006)
        assert price.high == pytest.approx(watts / 1000 * 0.30, abs=0.006)
    # MI325X and MI355X are rented only by clouds outside the guide's tiers: no offer here
    for name in ("MI325X", "MI355X"):
        assert not any(o.gpu.name == name for e in list_environments() for o in e.offers)
