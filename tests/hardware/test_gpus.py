"""The GPU catalog: complete, sourced, self-consistent, and forgiving lookups."""

from __future__ import annotations

import datetime as dt
import json
import re
from importlib import resources

import pytest

from lessonkit import LessonkitError, get_gpu, list_gpus
from lessonkit.hardware.gpus import find_gpu
from lessonkit.units import GiB

RAW = json.loads(resources.files("lessonkit").joinpath("data/gpus.json").read_text())["gpus"]


def test_catalog_spans_free_t4_to_b200_and_mi300x():
    names = {g.name for g in list_gpus()}
    assert len(names) >= 25
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
    # Vendors' "80 GB" is 80 GiB of chips; a device offers a little less than that, never more
    # (see test_the_share_of_memory_a_device_offers_is_plausible for how much less).
    assert gpu.memory_bytes == gpu.memory_gb * GiB
    assert gpu.usable_bytes * gpu.visible_devices <= gpu.memory_bytes
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
    ("query", "expected"),
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
    ("bad", "suggestion"), [("a1000", "A100"), ("H1000", "H100"), ("rtx 4900", "RTX 4090")]
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


# ----- the GPUs of 2025-26 ---------------------------------------------------------------------
def test_catalog_has_the_gpus_learners_rent_or_buy_in_2025_26():
    names = {g.name for g in list_gpus()}
    assert {"B300", "RTX PRO 6000", "DGX Spark", "MI325X", "MI355X"} <= names
    b300, b200 = get_gpu("B300"), get_gpu("B200")
    # Blackwell Ultra: half again the memory, the same dense bf16 rate
    assert b300.memory_gb == 1.5 * b200.memory_gb and b300.bf16_tflops == b200.bf16_tflops
    assert get_gpu("RTX PRO 6000").memory_gb == 3 * get_gpu("RTX 5090").memory_gb
    assert get_gpu("MI325X").bf16_tflops == get_gpu("MI300X").bf16_tflops  # same CDNA 3 chip


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("NVIDIA B300 SXM6 AC", "B300"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX PRO 6000"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX PRO 6000"),
        ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "RTX PRO 6000"),
        ("NVIDIA GB10", "DGX Spark"),
        ("dgx spark", "DGX Spark"),
        ("AMD Instinct MI325X", "MI325X"),
        ("AMD Instinct MI355X", "MI355X"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
    ],
)
def test_the_names_pytorch_reports_for_the_new_gpus_are_found(query, expected):
    assert get_gpu(query).name == expected


@pytest.mark.parametrize("entry", RAW, ids=[e["name"] for e in RAW])
def test_a_capacity_quoted_in_the_usable_source_is_the_usable_figure(entry):
    """A record that quotes PyTorch's 'total capacity of X GiB' (or, on unified memory, the
    free memory it measured) states that X as its usable memory, and a nvidia-smi MiB figure
    is never below it."""
    text = entry["usable_memory_source"]
    usable = entry["usable_memory_gib"]
    for quoted in re.findall(r"total capacity of ([0-9.]+) GiB", text):
        # the figure itself, or rounded down to a tenth of a GiB (never up: a run must fit)
        value = float(quoted)
        assert round(value, 1) == round(usable, 1) or usable <= value < usable + 0.1, (
            entry["name"],
            quoted,
        )
    for mib in re.findall(r"(?<![0-9.])([0-9]{4,6}) MiB", text):
        # nvidia-smi's total includes what the driver keeps: never less than what PyTorch gets
        assert int(mib) / 1024 * entry.get("visible_devices", 1) >= usable - 0.05, (
            entry["name"],
            mib,
        )
    if entry.get("unified_memory"):
        free = re.search(r"([0-9.]+)-[0-9.]+ GiB free", text)
        assert free and float(free.group(1)) == usable


def test_unified_memory_says_what_usable_means():
    spark = get_gpu("DGX Spark")
    assert spark.unified_memory and not get_gpu("B300").unified_memory
    # usable is what CUDA can hand out on an idle machine, well below the 128 GB pool
    assert 0.7 * spark.memory_bytes <= spark.usable_bytes < 0.85 * spark.memory_bytes
    for text in (spark.usable_memory_source, spark.notes, spark.unified_memory_note):
        assert "mem_get_info" in text and "total_memory" in text
    assert "shared with the CPU" in spark.memory_text and spark.usable_text in spark.memory_text
    assert (
        get_gpu("T4").memory_text == "14.75 GiB usable" and get_gpu("T4").unified_memory_note == ""
    )
    assert spark.to_dict()["unified_memory"] is True


@pytest.mark.parametrize("gpu", list_gpus(), ids=lambda g: g.name)
def test_the_share_of_memory_a_device_offers_is_plausible(gpu):
    share = gpu.usable_bytes * gpu.visible_devices / gpu.memory_bytes
    if gpu.unified_memory:
        assert 0.7 <= share < 0.9  # the OS and the CPU side of the program share the pool
    else:
        assert 0.9 <= share <= 1.0
    if gpu.vendor == "AMD":
        assert gpu.compute_capability.startswith("gfx") and "ROCm" in gpu.caveat


def test_bandwidth_rows_about_a_gpu_read_its_figure_from_the_catalog():
    """A row of bandwidth.json that names a catalog GPU takes that GPU's bandwidth (no second
    copy of the figure that could disagree); the other rows name no GPU."""
    from lessonkit.exercises.expected import bandwidth_data, bandwidth_ladder

    for row in bandwidth_data():
        names = [row["name"], *row.get("aliases", [])]
        named = {g.name for n in names if (g := find_gpu(n)) is not None}
        if "gpu" in row:
            assert "bandwidth_gbs" not in row and named <= {row["gpu"]}, row["name"]
        else:
            assert not named, (row["name"], named)
    for row in bandwidth_ladder():
        if "gpu" in row:
            assert row["bandwidth_gbs"] == get_gpu(row["gpu"]).bandwidth_gbs


def test_the_guides_matrix_notes_say_what_the_guide_gets_wrong():
    notes = {g.name: g.notes for g in list_gpus(in_guide=True)}
    assert "A6000" in notes["RTX A6000"] and "LoRA only" in notes["RTX A6000"]
    assert "QLoRA" in notes["A100 80GB"] and "40GB" in notes["A100 80GB"]
    assert "fastest training available today" in notes["H100 SXM"]
    assert "12-16GB" in get_gpu("T4").notes
