"""The calculator against published measured runs (tests/published_runs.json).

Each row is a run someone published with its peak memory and complete settings; the estimate
is computed with the same settings and compared with what the source measured (for
``torch.cuda.max_memory_allocated``: the estimate's tensor peak, without the CUDA context and
the allocator margin). Target: median |error| within 10% over the rows in the target, and every
row over 10% (or left out of the target) explained in its note.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from lessonkit import estimate

DATA = json.loads((Path(__file__).with_name("published_runs.json")).read_text())
ROWS = DATA["rows"]


def estimated_gb(row: dict, **changes) -> float:
    settings = dict(row["settings"]) | changes
    model = settings.pop("model")
    if isinstance(settings.get("lora_targets"), list):
        settings["lora_targets"] = tuple(settings["lora_targets"])
    return estimate(model, **settings).tensor_bytes / 1e9


def error(row: dict, **changes) -> float:
    return (estimated_gb(row, **changes) - row["published_gb"]) / row["published_gb"]


def test_every_row_names_its_source_and_what_it_measured() -> None:
    for row in ROWS:
        source = DATA["sources"][row["source"]]
        assert len(source["commit"]) == 40 and source["repository"] and source["path"]
        assert source["as_of"][:2] == "20" and "max_memory_allocated" in source["measured"]
        assert row["published_gb"] > 0
    assert len([r for r in ROWS if r["in_target"]]) >= 7


def test_median_error_within_10_percent() -> None:
    errors = [abs(error(row)) for row in ROWS if row["in_target"]]
    assert statistics.median(errors) <= 0.10, errors


@pytest.mark.parametrize("row", ROWS, ids=[r["label"] for r in ROWS])
def test_rows_over_10_percent_or_left_out_are_explained(row) -> None:
    if abs(error(row)) > 0.10 or not row["in_target"]:
        assert len(row["note"]) > 40


def test_the_2023_qlora_rows_need_the_old_bitsandbytes_behaviour() -> None:
    """bitsandbytes 0.41.1 (2023) kept each 4-bit layer's input: modelled, the QLoRA rows come
    within 10%; with today's behaviour they would be about 20% low."""
    qlora = [r for r in ROWS if r["settings"]["method"] == "qlora"]
    assert qlora
    for row in qlora:
        assert abs(error(row)) <= 0.10
        assert error(row, bitsandbytes="current") < -0.15
