"""The explorers' readout advises with the kit's own computed changes, says where the peak is
and when it moves, labels the batch per GPU and never says "single GPU" with several selected."""

from __future__ import annotations

import html
import itertools
import re

import matplotlib
import pytest

matplotlib.use("Agg")


from lessonkit.hardware import gpu_records
from lessonkit.memory.estimating import estimate
from lessonkit.planning.fitting import fit_changes
from lessonkit.units import GiB
from lessonkit.widgets import advice
from lessonkit.widgets import explorers as widgets

LONG_LORA = dict(method="lora", batch_size=64, seq_len=32768)


def largest_gpu():
    runnable = [
        g
        for g in gpu_records.catalog_gpus()
        if gpu_records.field(g, "current_wheels", default=True)
    ]
    return max(runnable, key=gpu_records.gpu_usable_bytes)


def advice_items(readout: str) -> list[str]:
    return [html.unescape(item) for item in re.findall(r"<li>(.*?)</li>", readout)]


def check_advice(explorer) -> list[advice.Advice]:
    """Every change offered fits the largest GPU, with the peak and phase the estimate gives."""
    gpu = largest_gpu()
    usable = gpu_records.gpu_usable_bytes(gpu)
    report = explorer.report
    found = advice.fixes(report, usable)
    assert found, explorer.readout.value
    items = advice_items(explorer.readout.value)
    assert len(items) == len(found)
    settings = advice.search_settings(report)
    for item, fix in zip(items, found, strict=True):
        new = estimate(report.model, **(settings | fix.change))
        assert new.total_bytes <= usable < report.total_bytes
        assert item == (
            f"{fix.words}: peak {new.total_bytes / GiB:,.1f} GiB per GPU, in the "
            f"{advice.phase_words(new.peak_phase)}"
        )
    # the first change is the kit's own search (the one `lessonkit vram --gpu` prints)
    first, _ = fit_changes(report.model, settings, usable, limit=1, more=True)[0]
    assert found[0].change == first
    assert f"fit the {gpu_records.gpu_label(gpu)}" in explorer.readout.value
    return found


def test_long_lora_is_told_a_shorter_sequence_and_the_chunked_loss_not_qlora():
    # the case: 1,372 GiB, logits over half of it, the weights about 1%
    explorer = widgets.vram_explorer("7B", **LONG_LORA, gradient_checkpointing=True)
    report = explorer.report
    assert report.breakdown["logits"] > 0.5 * report.total_bytes
    assert report.breakdown["weights"] < 0.02 * report.total_bytes
    found = check_advice(explorer)
    readout = html.unescape(explorer.readout.value)
    assert "QLoRA" not in readout and "qlora" not in readout
    assert any(f.change.get("loss") == "chunked" for f in found), readout
    assert any("seq_len" in f.change for f in found), readout
    assert "chunked cross-entropy loss" in readout and "sequence 8,192 tokens" in readout
    note = explorer.chart.note.get_text().replace("\n", " ")
    assert "QLoRA" not in note and "Fits with batch 8 per GPU with 8 accumulation steps" in note


def test_without_checkpointing_the_activations_lever_comes_with_a_shorter_sequence():
    explorer = widgets.vram_explorer("7B", **LONG_LORA)
    report = explorer.report
    assert max(report.breakdown, key=report.breakdown.get) == "activations"
    found = check_advice(explorer)
    assert any(f.change.get("gradient_checkpointing") and "seq_len" in f.change for f in found)
    assert "QLoRA" not in explorer.readout.value


def test_eight_gpus_at_zero_3_are_not_told_qlora_nor_single_gpu():
    explorer = widgets.vram_explorer(
        "7B", **LONG_LORA, gradient_checkpointing=True, n_gpus=8, zero_stage=3
    )
    check_advice(explorer)
    readout = html.unescape(explorer.readout.value)
    assert "QLoRA" not in readout and "single GPU" not in readout
    assert "even with 8 GPUs, the peak per GPU is above every GPU" in readout
    assert "single GPU" not in explorer.chart.note.get_text()
    assert "above every GPU even on 8 GPUs" in explorer.chart.note.get_text()


def test_checkpointing_a_full_batch_64_says_the_peak_moved_to_the_optimizer_step():
    explorer = widgets.vram_explorer("7B", method="full", batch_size=64)
    assert explorer.report.peak_phase == "backward"
    assert "(during the backward pass)" in explorer.readout.value
    assert "moved" not in explorer.readout.value
    explorer.controls["gradient_checkpointing"].value = True
    assert explorer.report.peak_phase == "optimizer"
    readout = explorer.readout.value
    assert "(during the optimizer step)" in readout
    assert "<b>The peak moved to the optimizer step</b> (from the backward pass)" in readout
    parts = sorted(explorer.report.breakdown.items(), key=lambda kv: -kv[1])[:3]
    assert "Largest there: optimizer states 50.2 GiB" in html.unescape(readout)
    assert parts[0][0] == "optimizer"
    explorer.controls["batch_size"].value = 32  # the peak stays where it was: nothing said
    assert "moved" not in explorer.readout.value


def test_the_batch_is_labelled_per_gpu_in_every_explorer():
    for explorer in (widgets.vram_explorer("7B"), widgets.gpu_matrix_explorer("7B")):
        assert explorer.controls["batch_size"].description == "Batch size per GPU"
    explorer = widgets.vram_explorer("7B", **LONG_LORA)
    assert all(
        "per GPU" in item for item in advice_items(explorer.readout.value) if "batch" in item
    )


def test_single_gpu_is_never_said_while_several_are_selected():
    explorer = widgets.vram_explorer("13B", method="full", seq_len=8192)
    explorer.png = lambda: b""  # the text is under test here
    said = 0
    for n, batch, seq, ckpt in itertools.product(
        (1, 2, 4, 8), (1, 64), (512, 32768), (False, True)
    ):
        controls = explorer.controls
        controls["n_gpus"].value, controls["zero_stage"].value = n, 3 if n > 1 else 0
        controls["batch_size"].value, controls["seq_len"].value = batch, seq
        controls["gradient_checkpointing"].value = ckpt
        assert explorer.error is None, explorer.readout.value
        text = explorer.readout.value + explorer.chart.note.get_text()
        if n > 1:
            assert "single GPU" not in text, (n, batch, seq, ckpt)
        elif "Does not fit" in text:
            said += "single GPU" in text
    assert said > 0  # on one GPU it is said where it is true


def test_a_run_that_fits_gets_no_advice():
    explorer = widgets.vram_explorer("7B", method="lora")
    assert "Changes that make it fit" not in explorer.readout.value
    assert advice.fixes(explorer.report, gpu_records.gpu_usable_bytes(largest_gpu())) == []


def test_advice_when_no_change_tried_fits():
    explorer = widgets.vram_explorer("70B", method="full", batch_size=64, seq_len=32768)
    found = advice.fixes(explorer.report, gpu_records.gpu_usable_bytes(largest_gpu()))
    if not found:
        assert "No change the kit tries makes it fit" in explorer.readout.value
    else:
        check_advice(explorer)


def test_the_environment_explorers_fastest_is_the_fastest_offer():
    explorer = widgets.environment_explorer("70B", method="qlora", tokens=1e8)
    fastest = explorer.recommendation.fastest()
    assert fastest is not None
    every_row = min(r["hours"] for r in explorer.rows if r["hours"] is not None)
    assert fastest.hours <= every_row
    gpu = fastest.gpu if fastest.count == 1 else f"{fastest.count}x {fastest.gpu}"
    assert f"Fastest: {fastest.name} on {gpu}, " in html.unescape(explorer.readout.value)


def test_above_every_gpu_the_y_axis_moves_in_steps_so_most_moves_keep_the_saved_picture():
    explorer = widgets.vram_explorer("7B", method="full", seq_len=4096)
    tops, keys = [], set()
    for batch in range(8, 65):
        explorer.controls["batch_size"].value = batch
        assert explorer.error is None
        top = explorer.chart.ax.get_ylim()[1]
        assert top >= 1.4 * explorer.report.total_bytes / GiB - 1e-6  # room for bar and note
        tops.append(top)
        keys.add(explorer.chart.static_key())
    assert len(set(tops)) <= 6 and len(keys) <= 8  # 57 batches, not one axis each
    assert all(b >= a for a, b in itertools.pairwise(tops))


def test_the_decision_flow_has_every_answer_before_a_control_moves(monkeypatch):
    explorer = widgets.decision_flow_explorer()
    calls = []
    monkeypatch.setattr(widgets, "_recommend", lambda *a, **k: calls.append(a))
    for size in widgets.MODEL_SIZES:
        for budget in ("High", "Low"):
            explorer.controls["budget"].value = budget
            explorer.controls["size"].value = size
            assert explorer.error is None and explorer.recommendation is not None
    assert calls == []  # computed when the explorer was built


@pytest.mark.parametrize("model", ["7B", "13B", "70B"])
def test_leaving_out_hopeless_groups_finds_the_same_changes_as_the_full_search(model):
    from lessonkit.widgets.controls import SETUP_DEFAULTS

    usable = gpu_records.gpu_usable_bytes(largest_gpu())
    compared = 0
    for method, batch, seq, ckpt, gpus in itertools.product(
        ("full", "lora", "qlora"), (4, 64), (512, 8192, 32768), (False, True), (1, 8)
    ):
        settings = {k: v for k, v in SETUP_DEFAULTS.items() if k != "loss_chunks"} | dict(
            method=method,
            precision="bf16-mixed" if method == "full" else "bf16",
            batch_size=batch,
            seq_len=seq,
            gradient_checkpointing=ckpt,
            n_gpus=gpus,
            zero_stage=0 if gpus == 1 or method == "qlora" else 3,
            gradient_accumulation=1,
        )
        report = estimate(model, **settings)
        if report.total_bytes <= usable:
            continue
        full = fit_changes(model, settings, usable, limit=3, more=True)
        quick = fit_changes(model, settings, usable, limit=3, more=True, skip_hopeless=True)
        assert [c for c, _ in quick] == [c for c, _ in full], settings
        compared += 1
    assert compared >= 10
