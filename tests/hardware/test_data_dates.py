"""As-of dates in the data files are the day a figure was published or observed, not the day of an edit.

A datasheet, a model's config.json or a standard has its own publication day, so such records carry
different dates that follow the order in which the things appeared; a price is observed on a day, after
the GPU it prices was published.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
from importlib import resources
from typing import Any

import pytest

from lessonkit import list_gpus
from lessonkit.hardware.environments import list_environments


def _load(name: str) -> dict[str, Any]:
    return json.loads(
        resources.files("lessonkit").joinpath(f"data/{name}").read_text(encoding="utf-8")
    )


GPUS = _load("gpus.json")["gpus"]
ENVIRONMENTS = _load("environments.json")["environments"]
MODELS = _load("models.json")["models"]
LINKS = [
    row for row in _load("bandwidth.json")["links"] if "as_of" in row
]  # GPU rows borrow gpus.json's
PUBLISHED = {"gpus.json": GPUS, "models.json": MODELS, "bandwidth.json": LINKS}

# Generations in the order each vendor brought them out (Hopper and Ada Lovelace came the same year).
GENERATIONS = {
    "NVIDIA": [
        {"Pascal"},
        {"Volta"},
        {"Turing"},
        {"Ampere"},
        {"Hopper", "Ada Lovelace"},
        {"Blackwell"},
    ],
    "AMD": [{"CDNA 2"}, {"CDNA 3"}, {"CDNA 4"}],
}


def _date(text: str) -> dt.date:
    return dt.date.fromisoformat(text)


def _all_dates() -> list[tuple[str, str]]:
    found = [(f"gpus.json {g['name']}", g["as_of"]) for g in GPUS]
    found += [
        (f"gpus.json {g['name']} price", g["price_per_hour"]["as_of"])
        for g in GPUS
        if g["price_per_hour"]
    ]
    found += [(f"environments.json {e['key']}", e["as_of"]) for e in ENVIRONMENTS]
    found += [
        (f"environments.json {e['key']} {o['gpu']}", o["as_of"])
        for e in ENVIRONMENTS
        for o in e["offers"]
        if "as_of" in o
    ]
    found += [(f"models.json {m['name']}", m["as_of"]) for m in MODELS]
    found += [(f"bandwidth.json {row['name']}", row["as_of"]) for row in LINKS]
    found.append(("cuda_constants.json", _load("cuda_constants.json")["as_of"]))
    return found


@pytest.mark.parametrize(
    ("where", "as_of"), _all_dates(), ids=lambda x: x if isinstance(x, str) else ""
)
def test_every_as_of_is_a_real_date_not_in_the_future(where, as_of):
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", as_of), f"{where}: {as_of!r} is not YYYY-MM-DD"
    assert _date(as_of) <= dt.date.today(), f"{where}: as_of {as_of} is in the future"


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_figures_carry_their_own_publication_dates(name):
    records = PUBLISHED[name]
    for record in records:
        assert record.get("as_of_basis", "").strip(), (
            f"{name} {record['name']}: say what the as_of date is"
        )
        assert record["as_of"] in record["as_of_basis"], (
            f"{name} {record['name']}: as_of_basis names another day"
        )
    dates = {r["as_of"] for r in records}
    assert len(dates) > 1, (
        f"every record of {name} has as_of {dates.pop()}: the day of an edit, not of a source"
    )


def test_gpu_datasheets_follow_the_order_of_their_generations():
    for vendor, generations in GENERATIONS.items():
        gpus = [g for g in list_gpus() if g.vendor == vendor]
        first = []
        for generation in generations:
            dates = [_date(g.as_of) for g in gpus if g.architecture in generation]
            first.append(min(dates) if dates else None)
        for gpu in gpus:
            rank = next(i for i, gen in enumerate(generations) if gpu.architecture in gen)
            for earlier in filter(None, first[:rank]):
                assert _date(gpu.as_of) > earlier, (
                    f"{gpu.name} ({gpu.architecture}) dated {gpu.as_of}, not after an earlier generation's "
                    f"first datasheet ({earlier})"
                )


def test_a_gpu_is_priced_after_its_datasheet_appeared():
    spec = {g.name: _date(g.as_of) for g in list_gpus()}
    for gpu in list_gpus():
        if gpu.price_per_hour is not None:
            assert _date(gpu.price_per_hour.as_of) > spec[gpu.name], gpu.name
    for env in list_environments():
        for offer in env.offers:
            assert _date(offer.as_of) > spec[offer.gpu.name], f"{env.key} offers {offer.gpu.name}"


# The GPUs and offers of 2025-26 (issue: GPUs and environments of 2025-26), each read from a page.
NEW_GPUS = {"B300", "RTX PRO 6000", "DGX Spark", "MI325X", "MI355X"}


@pytest.mark.parametrize("name", sorted(NEW_GPUS))
def test_the_gpus_of_2025_26_carry_a_source_and_their_own_publication_day(name):
    record = next(g for g in GPUS if g["name"] == name)
    for key in ("source", "as_of_basis", "usable_memory_source", "tflops_note"):
        assert record[key].strip(), f"{name}: {key}"
    assert record["as_of"] in record["as_of_basis"]
    # published in 2024-25, never the day the catalog was edited
    assert dt.date(2024, 1, 1) <= _date(record["as_of"]) < dt.date(2026, 1, 1), name
    assert record["as_of"] not in {e["as_of"] for e in ENVIRONMENTS}


def test_an_offer_with_its_own_date_names_its_own_page():
    own = [
        (e["key"], o) for e in ENVIRONMENTS for o in e["offers"] if "as_of" in o or "source" in o
    ]
    assert own, "the offers of 2025-26 carry their own price page and day"
    for key, offer in own:
        assert offer.get("source", "").strip() and offer.get("as_of"), (key, offer["gpu"])
        # the page was read on its own day: no later than the environment's own snapshot
        env = next(e for e in ENVIRONMENTS if e["key"] == key)
        assert _date(offer["as_of"]) <= _date(env["as_of"]), (key, offer["gpu"])
        assert re.search(r"\d{4}-\d\d-\d\d", offer["source"]), (key, offer["gpu"])
    offered = {offer["gpu"] for _, offer in own}
    assert {"B300", "RTX PRO 6000", "DGX Spark"} <= offered


def _version(name: str) -> tuple[str, float] | None:
    match = re.fullmatch(r"([a-z]+)-?(\d+(?:\.\d+)?)-[\d.]+b", name)
    return (match.group(1), float(match.group(2))) if match else None


def test_model_releases_follow_their_version_numbers():
    by_family: dict[str, dict[float, list[dt.date]]] = {}
    for model in MODELS:
        version = _version(model["name"])
        if version:
            by_family.setdefault(version[0], {}).setdefault(version[1], []).append(
                _date(model["as_of"])
            )
    assert {"llama", "qwen", "gemma"} <= set(by_family)
    for family, versions in by_family.items():
        ordered = sorted(versions)
        for older, newer in itertools.pairwise(ordered):
            assert max(versions[older]) < min(versions[newer]), (
                f"{family} {older} not released before {newer}"
            )


def test_pcie_generations_are_dated_in_order():
    pcie = {
        int(m.group(1)): _date(row["as_of"])
        for row in LINKS
        if (m := re.match(r"PCIe (\d)\.0", row["name"]))
    }
    assert len(pcie) >= 2
    ordered = sorted(pcie)
    for older, newer in itertools.pairwise(ordered):
        assert pcie[older] < pcie[newer], (
            f"PCIe {older}.0 dated {pcie[older]}, PCIe {newer}.0 {pcie[newer]}"
        )
