"""The explorers' model menu: the presets grouped by family, newest generation first."""

from __future__ import annotations

import pytest

from lessonkit.models.presets import get_preset, preset_groups, preset_names
from lessonkit.units import GiB
from lessonkit.widgets import explorers as widgets
from lessonkit.widgets.controls import MODEL_SIZES, build_control, model_menu


def release(preset: str) -> str:
    return get_preset(preset).note.rsplit("as of ", 1)[1][:10]


def test_every_preset_is_offered_once_under_its_family() -> None:
    presets = model_menu()[len(MODEL_SIZES) :]
    assert sorted(value for _, value in presets) == sorted(preset_names())
    family_of = {name: family for family, names in preset_groups().items() for name in names}
    for label, value in presets:
        assert label == f"{family_of[value]} — {value}"


def test_families_are_contiguous_and_newest_generation_first() -> None:
    presets = model_menu()[len(MODEL_SIZES) :]
    families = [label.split(" — ")[0] for label, _ in presets]
    order = list(dict.fromkeys(families))
    assert len(order) == len(preset_groups())  # each family in one run, not scattered
    newest = [max(release(p) for p in preset_groups()[family]) for family in order]
    assert newest == sorted(newest, reverse=True)
    assert order[-1] == "GPT-2"  # released 2019, the oldest
    # within a family, preset_groups' order
    for family, names in preset_groups().items():
        assert [v for label, v in presets if label.startswith(family + " — ")] == names


def test_sizes_come_first_with_their_own_labels() -> None:
    assert model_menu()[: len(MODEL_SIZES)] == [(size, size) for size in MODEL_SIZES]


@pytest.mark.parametrize("preset", ["qwen3-8b", "gpt2", "llama-3.3-70b"])
def test_the_control_value_stays_the_preset_name(preset: str) -> None:
    control = build_control("model", preset, continuous=False)
    assert control.value == preset
    assert control.label == f"{_family(preset)} — {preset}"


def _family(preset: str) -> str:
    return next(family for family, names in preset_groups().items() if preset in names)


def test_explorer_menu_picks_a_new_preset_and_estimates_it() -> None:
    explorer = widgets.vram_explorer("qwen3-8b", method="qlora")
    menu = explorer.controls["model"]
    assert menu.value == "qwen3-8b" and menu.label == "Qwen3 — qwen3-8b"
    before = explorer.readout.value
    menu.value = "smollm3-3b"
    assert menu.label == "SmolLM — smollm3-3b"
    fresh = widgets.vram_explorer("smollm3-3b", method="qlora")
    assert explorer.readout.value == fresh.readout.value != before


MOE_PRESETS = [name for name in preset_names() if get_preset(name).n_experts]


def test_the_mixture_of_experts_presets_are_in_the_menu() -> None:
    assert {"qwen3-30b-a3b", "mixtral-8x7b"} <= set(MOE_PRESETS)
    offered = {value for _, value in model_menu()}
    assert set(MOE_PRESETS) <= offered


@pytest.mark.parametrize("preset", MOE_PRESETS)
def test_picking_a_mixture_of_experts_says_total_and_active_parameters(preset: str) -> None:
    spec = get_preset(preset)
    explorer = widgets.vram_explorer("7B", method="lora")
    assert "active parameters" not in explorer.readout.value  # a dense model says nothing
    explorer.controls["model"].value = preset
    readout = explorer.readout.value
    assert explorer.report.model.name == preset
    total, active = f"{spec.n_params / 1e9:.2f}B", f"{spec.active_params / 1e9:.2f}B"
    assert spec.active_params < spec.n_params / 3  # far fewer computed with than held
    assert f"({total} parameters in total)" in readout
    assert f"({active} active parameters)" in readout
    assert f"all {spec.n_experts} experts" in readout
    assert f"with {spec.experts_per_token} of them" in readout
    # the peak shown is the estimate of that preset, weights of every expert included
    peak = f"Peak per GPU: {explorer.report.total_bytes / GiB:,.1f} GiB"
    assert peak in readout and explorer.report.breakdown["weights"] >= 2 * spec.n_params * 0.99


def test_the_gpu_matrix_readout_of_a_mixture_of_experts_says_qlora_keeps_experts_whole() -> None:
    explorer = widgets.gpu_matrix_explorer("mixtral-8x7b", method="qlora")
    readout = explorer.readout.value
    assert "active parameters" in readout and "experts unquantized" in readout
    explorer.controls["method"].value = "lora"
    assert "experts unquantized" not in explorer.readout.value
    assert "active parameters" in explorer.readout.value
