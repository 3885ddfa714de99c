"""The GPU catalog: complete, sourced, self-consistent, and forgiving lookups."""

from __future__ import annotations

import datetime as dt
import json
from importlib import resources

import pytest

from lessonkit import LessonkitError, get_gpu, list_gpus
from lessonkit.hardware.gpus import find_gpu
from lessonkit.units import GiB

RAW = json.loads(resources.files("lessonkit").joinpath("data/gpus.json").read_text())["gpus"]


def test_catalog_spans_free_t4_to_b200_and_mi300x():
    names = {g.name for g in list_gpus()}
    assert len(names) >= 20
    assert {"T4", "A100 80GB", "H100 SXM", "B200", "MI300X", "RTX 4090"} <= names


@pytest.mark.parametrize("entry", RAW, ids=[e["name"] for e in RAW])
def test_every_record_has_sources_dates_and_known_unconfirmed_fields(entry):
    for key in ("source", "as_of", "usable_memory_source"):
        assert entry[key].strip(), key
    dt.date.fromisoformat(entry["as_of"])
    for name in entry["unconfirmed"]:
        assert name in entry, f"unconfirmed names a missing field {name!r}"
    price = entry["price_per_hour"]
    if price is not None:
        assert price["source"] and dt.date.fromisoformat(price["as_of"])
        assert 0 < price["low"] <= price["typical"] <= price["high"]


@pytest.mark.parametrize("gpu", list_gpus(), ids=lambda g: g.name)
def test_figures_are_consistent(gpu):
    assert gpu.bandwidth_gbs > 0 and gpu.bf16_tflops > 0
    # Vendors' "80 GB" is 80 GiB of chips; a device offers a little less than that, never more.
    assert gpu.memory_bytes == gpu.memory_gb * GiB
    assert 0.9 * gpu.memory_bytes <= gpu.usable_bytes * gpu.visible_devices <= gpu.memory_bytes
    if gpu.vendor == "NVIDIA":
        major, minor = (int(x) for x in gpu.compute_capability.split("."))
        assert gpu.native_bf16 == ((major, minor) >= (8, 0))


def test_the_guides_matrix_gpus_are_flagged():
    assert {g.name for g in list_gpus(in_guide=True)} == {
        "RTX 4090",
        "RTX A6000",
        "A100 80GB",
        "H100 SXM",
    }


def test_memory_is_read_in_binary_units():
    a100, t4 = get_gpu("A100 80GB"), get_gpu("T4")
    assert a100.memory_bytes == 81920 * 2**20 and t4.memory_bytes == 16 * GiB
    assert "2**30" in type(a100).memory_bytes.__doc__
    about = json.loads(resources.files("lessonkit").joinpath("data/gpus.json").read_text())["about"]
    assert "81920 MiB" in about and "memory_gb * 2**30" in about and "decimal GB" not in about


def test_t4_offers_what_pytorch_reports_on_colab_not_nvidia_smis_15_gib():
    t4 = get_gpu("t4")
    assert t4.memory_gb == 16 and not t4.native_bf16
    # PyTorch's total_memory on a Colab T4: about 14.75 GiB, below nvidia-smi's 15360 MiB.
    assert 14.7 * GiB <= t4.usable_bytes < 15 * GiB
    assert "total_memory" in t4.usable_memory_source and "usable_memory_gib" in t4.unconfirmed
    assert t4.label == f"T4 ({t4.usable_memory_gib:.2f} GiB usable)"
    assert get_gpu("A100 80GB").usable_text == "79.2 GiB"


@pytest.mark.parametrize(
    "query,expected",
    [
        ("a100", "A100 80GB"),
        ("A100 80GB", "A100 80GB"),
        ("h100-sxm", "H100 SXM"),
        ("H100", "H100 SXM"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
        ("AMD Instinct MI300X", "MI300X"),
        ("a6000", "RTX A6000"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ],
)
def test_lookups_forgive_spelling(query, expected):
    assert get_gpu(query).name == expected


def test_device_names_are_matched_with_their_memory():
    assert find_gpu("NVIDIA A100-PCIE-40GB", 39.4 * GiB).name == "A100 40GB"
    assert find_gpu("NVIDIA A100-PCIE-80GB", 79.2 * GiB).name == "A100 80GB"
    assert find_gpu("NVIDIA RTX A1000") is None


@pytest.mark.parametrize(
    "bad,suggestion", [("a1000", "A100"), ("H1000", "H100"), ("rtx 4900", "RTX 4090")]
)
def test_unknown_names_suggest_close_matches(bad, suggestion):
    with pytest.raises(LessonkitError, match="Did you mean") as err:
        get_gpu(bad)
    assert suggestion in str(err.value)


def test_non_string_names_are_refused():
    with pytest.raises(LessonkitError, match="name"):
        get_gpu(80)


def test_to_dict_round_trips_the_figures():
    d = get_gpu("H100").to_dict()
    assert d["memory_gb"] == 80 and d["bf16_tflops"] == 989 and d["in_guide"] is True
    assert d["price_per_hour"]["low"] <= d["price_per_hour"]["high"]
    json.dumps(d)


def test_fits_compares_the_peak_with_usable_memory():
    from lessonkit import estimate

    t4 = get_gpu("T4")
    qlora = estimate("7B", method="qlora", precision="bf16", gradient_checkpointing=True)
    full = estimate("7B", method="full")
    assert t4.fits(qlora) == (qlora.total_bytes <= t4.usable_bytes) is True
    assert not t4.fits(full)


def test_catalog_prices_are_the_span_of_the_environments_offers():
    """A GPU's price range in gpus.json says what the offers in environments.json say."""
    from lessonkit.hardware.environments import offered_price

    for gpu in list_gpus():
        offered = offered_price(gpu)
        if offered is None:
            assert gpu.price_per_hour is None, gpu.name
            continue
        price = gpu.price_per_hour
        assert (price.low, price.high, price.typical) == pytest.approx(
            (offered["low"], offered["high"], offered["typical"])
        ), gpu.name
        assert price.source == offered["source"] and price.as_of == offered["as_of"]
    # The cases that disagreed: RunPod's RTX A6000 and MI300X, Vast.ai's H200.
    assert get_gpu("RTX A6000").price_per_hour.low <= 0.49
    assert get_gpu("MI300X").price_per_hour.high >= 2.49
    assert get_gpu("H200").price_per_hour.low <= 2.3
