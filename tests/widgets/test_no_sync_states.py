"""A fixed no_sync=True in the VRAM explorer: the readout is true in every state of its controls."""

from __future__ import annotations

import html
import itertools
import re

import matplotlib

matplotlib.use("Agg")

import pytest

from lessonkit.errors import LessonkitError
from lessonkit.memory.estimating import estimate
from lessonkit.widgets import explorers as widgets
from lessonkit.widgets.controls import estimate_settings

STATES = {
    "method": ("full", "lora", "qlora"),
    "n_gpus": (1, 2, 4, 8),
    "zero_stage": (0, 1, 2, 3),
    "gradient_checkpointing": (False, True),
    "loss": ("standard", "chunked"),
    "activation_offload": (False, True),
}


def states():
    names = list(STATES)
    for values in itertools.product(*STATES.values()):
        yield dict(zip(names, values, strict=True))


def refused(settings: dict) -> str | None:
    """estimate()'s message where it refuses these settings, else None."""
    try:
        estimate("1B", **settings)
    except LessonkitError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("accumulation", [2, 4])
def test_a_fixed_no_sync_readout_is_true_in_every_state(accumulation):
    explorer = widgets.vram_explorer(
        "1B", no_sync=True, gradient_accumulation=accumulation, batch_size=2
    )
    explorer.png = lambda: b""  # the readout is under test here, not the picture
    seen = 0
    for state in states():
        for name, value in state.items():
            explorer.controls[name].value = value
        controls = {k: w.value for k, w in explorer.controls.items()}
        fixed = {"no_sync": True, "gradient_accumulation": accumulation}
        settings = estimate_settings(explorer.controls, fixed)
        readout = explorer.readout.value
        refusal = refused(settings)
        if refusal is not None:  # only a combination estimate itself refuses
            assert explorer.error is not None, state
            assert refusal[:40] in html.unescape(readout), state
            continue
        expected = estimate("1B", **settings)
        assert explorer.error is None, (state, readout)
        assert explorer.report.total_bytes == expected.total_bytes, state
        applies = controls["n_gpus"] > 1 and controls["zero_stage"] != 2
        assert expected.settings["no_sync"] is applies, state
        assert ("no_sync" in readout) is applies, (state, readout)
        for said in re.findall(r"n_gpus=(\d+)", readout):  # never a count the control lacks
            assert int(said) == controls["n_gpus"], (state, readout)
        for said in re.findall(r"(\d+) GPUs at ZeRO-0", readout):
            assert int(said) == controls["n_gpus"], (state, readout)
        if applies:
            assert f"last of {accumulation} micro-batches" in readout, state
        seen += 1
    # every state but the ones estimate refuses for reasons of their own was looked at
    assert seen > 300


def test_the_ddp_note_at_zero_0_with_no_sync_compares_with_one_gpu_without_it():
    explorer = widgets.vram_explorer("7B", no_sync=True, gradient_accumulation=2, n_gpus=2)
    assert explorer.error is None, explorer.readout.value
    one = estimate("7B", gradient_accumulation=2)
    rise = explorer.report.total_bytes - one.total_bytes
    assert "2 GPUs at ZeRO-0 (plain DDP)" in explorer.readout.value
    assert f"rises by {rise / 2**30:,.1f} GiB over one GPU" in explorer.readout.value
