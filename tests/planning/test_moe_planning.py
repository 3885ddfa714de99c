"""The mixture-of-experts presets through planning: the GPU matrix, the recommender, the OOM
doctor and the CLI that prints them. Memory counts every expert; compute counts the active ones."""

from __future__ import annotations

import json
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from lessonkit import estimate, get_gpu, list_gpus, oom_doctor, recommend
from lessonkit.charts import draw_gpu_fit
from lessonkit.cli.main import main
from lessonkit.models.presets import get_preset, preset_names, resolve_model
from lessonkit.planning.fitting import (
    ATTENTION_FLOPS,
    FLOPS_PER_PARAM,
    compute_hours,
    find_fit,
    flops_per_token,
    method_settings,
    rentable_gpus,
)
from lessonkit.units import GiB

MOE = [name for name in preset_names() if get_preset(name).n_experts]
# Today's presets the course's matrix and recommender take: dense and mixture of experts.
NEW_PRESETS = ["qwen3-8b", "qwen3-32b", "gemma-3-12b", "gemma-3-27b", *MOE]
# An A100 80GB's message: the run is far above what was free.
A100_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1002.00 MiB. GPU 0 has a "
    "total capacity of 79.19 GiB of which 382.12 MiB is free. Process 2571 has 78.80 GiB "
    "memory in use. Of the allocated memory 77.97 GiB is allocated by PyTorch, and 262.21 MiB "
    "is reserved by PyTorch but unallocated."
)


def test_the_moe_presets_are_the_two_families_with_experts():
    assert {"qwen3-30b-a3b", "mixtral-8x7b"} <= set(MOE)
    for name in MOE:
        spec = get_preset(name)
        assert spec.active_params < spec.n_params / 3


@pytest.fixture(scope="module")
def moe_lora():
    return recommend("qwen3-30b-a3b", method="lora", tokens="50M")


def test_the_recommender_names_gpus_that_hold_the_whole_moe(moe_lora):
    spec = resolve_model("qwen3-30b-a3b")
    assert moe_lora.options
    every_expert = 2 * spec.n_params  # bf16 weights of all 128 experts, not the 8 active
    for option in moe_lora.options:
        report = estimate(spec, **option.settings, device="cuda")
        assert report.total_bytes == option.peak_bytes
        per_gpu = every_expert / (option.count if option.settings.get("zero_stage") == 3 else 1)
        assert option.peak_bytes > per_gpu
        assert get_gpu(option.gpu).usable_bytes == option.usable_bytes >= option.peak_bytes
    assert moe_lora.best.count == 1  # one 80-96 GB card holds it
    assert get_gpu(moe_lora.best.gpu).usable_bytes >= every_expert


def test_the_needs_line_names_gpus_with_the_memory_it_states(moe_lora):
    (needs,) = [n for n in moe_lora.needs if n.startswith("LoRA")]
    stated = float(re.search(r"needs ([\d,.]+) GiB on one GPU", needs).group(1).replace(",", ""))
    single = re.search(r": 1 x (.+?) \(", needs).group(1)
    every_expert = 2 * get_preset("qwen3-30b-a3b").n_params / GiB
    assert get_gpu(single).usable_bytes / GiB >= stated > every_expert
    # the smallest GPU to rent that holds it: every smaller one is short of what it needs
    smaller = [g for g in rentable_gpus() if g.usable_bytes < get_gpu(single).usable_bytes]
    assert smaller and all(g.usable_bytes / GiB < stated for g in smaller)


def test_the_title_and_json_give_total_and_active_parameters(moe_lora):
    spec = resolve_model("qwen3-30b-a3b")
    assert f"({spec.n_params / 1e9:.2f}B params, {spec.active_params / 1e9:.2f}B active)" in str(
        moe_lora
    )
    data = moe_lora.to_dict()
    assert (data["n_params"], data["active_params"]) == (spec.n_params, spec.active_params)
    dense = recommend("qwen3-8b", method="lora").to_dict()
    assert dense["active_params"] == dense["n_params"]


def test_compute_counts_the_active_parameters_and_loading_every_one():
    spec = resolve_model("qwen3-30b-a3b")
    attention = ATTENTION_FLOPS * spec.n_layers * spec.n_heads * spec.head_dim * 512
    assert flops_per_token(spec, "full", 512) == FLOPS_PER_PARAM["full"] * spec.active_params + (
        attention
    )
    dense_as_large = FLOPS_PER_PARAM["full"] * spec.n_params + attention
    assert flops_per_token(spec, "full", 512) < dense_as_large / 5
    # a run's time: the steps on the active parameters, the start-up loading all of them
    option = next(o for o in recommend(spec, method="lora", tokens="50M").options if o.count == 1)
    gpu = get_gpu(option.gpu)
    steps = compute_hours(
        spec,
        "lora",
        50e6,
        gpu.bf16_tflops,
        1,
        gradient_checkpointing=option.settings["gradient_checkpointing"],
    )
    startup = 5 / 60 + 2 * spec.n_params / 200e6 / 3600
    assert option.hours == pytest.approx(steps + startup)


@pytest.mark.parametrize("model", NEW_PRESETS)
@pytest.mark.parametrize("method", ["lora", "qlora", "full"])
def test_the_matrix_line_for_each_new_preset_is_its_estimate(model, method):
    spec = resolve_model(model)
    for gpu in list_gpus(in_guide=True):
        fit = find_fit(spec, method, gpu.usable_bytes, native_bf16=gpu.native_bf16)
        settings = {
            **method_settings(method, native_bf16=gpu.native_bf16),
            "batch_size": fit.batch_size,
            "seq_len": fit.seq_len,
            "gradient_checkpointing": fit.gradient_checkpointing,
        }
        assert estimate(spec, **settings, device="cuda").total_bytes == fit.peak_bytes
        assert fit.fits == (fit.peak_bytes <= gpu.usable_bytes)
        if spec.n_experts and method != "full":  # every expert is held, in 16 bits
            assert fit.peak_bytes > 2 * (spec.n_params - spec.active_params)


@pytest.mark.parametrize("model", MOE)
def test_the_fit_chart_colours_the_gpus_that_hold_a_moe(model):
    report = estimate(model, **method_settings("lora"))
    figure, ax = plt.subplots(figsize=(8, 6.5))
    try:
        drawn = draw_gpu_fit(ax, report, list_gpus())
        expected = [g.usable_bytes >= report.total_bytes for g in drawn["gpus"]]
        assert drawn["fits"] == expected and any(expected) and not all(expected)
        assert drawn["need"] == pytest.approx(report.total_bytes / GiB)
    finally:
        plt.close(figure)


@pytest.mark.parametrize("model", MOE)
def test_the_oom_doctor_advises_changes_that_fit_a_moe_run(model):
    run = dict(model=model, method="lora", precision="bf16", batch_size=8, seq_len=2048)
    diagnosis = oom_doctor(A100_OOM, **run)
    assert diagnosis.recognized and diagnosis.report.model.name == model
    assert diagnosis.report.total_bytes > diagnosis.budget_bytes  # it did not fit
    settings = {k: v for k, v in run.items() if k != "model"}
    widest = estimate(model, **settings, n_gpus=8, zero_stage=3, gradient_checkpointing=True)
    if widest.total_bytes > diagnosis.budget_bytes:
        # no change the doctor tries fits (gpt-oss-120b: 79.9 GiB per GPU on 8 GPUs with
        # checkpointing): it says so and points to the recommender instead of a wrong fix
        assert not diagnosis.fixes and "lessonkit recommend" in " ".join(str(diagnosis).split())
        return
    assert diagnosis.fixes
    for fix in diagnosis.fixes:
        assert fix.change and fix.peak_bytes is not None, fix
        changed = {**{k: v for k, v in run.items() if k != "model"}, **fix.change}
        again = estimate(model, **changed, device="cuda")
        assert again.total_bytes == fix.peak_bytes <= diagnosis.budget_bytes, fix
        # LoRA on an MoE goes on attention: the experts are not linear layers
        targets = fix.change.get("lora_targets", ())
        assert not any("expert" in str(t) for t in targets)
    text = str(diagnosis)
    assert f"({diagnosis.report.model.name}, lora" in text
    assert "1. " + diagnosis.fixes[0].title in text


def test_the_cli_reads_a_moe_preset(capsys):
    spec = resolve_model("qwen3-30b-a3b")
    assert main(["vram", "--model", "qwen3-30b-a3b", "--method", "lora", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["n_params"], data["active_params"]) == (spec.n_params, spec.active_params)
    assert data["total_bytes"] == estimate(spec, **method_settings("lora")).total_bytes
    assert main(["vram", "--model", "qwen3-30b-a3b", "--method", "lora"]) == 0
    assert f"{spec.active_params / 1e9:.2f}B active" in capsys.readouterr().out
    assert main(["vram", "--model", "qwen3-30b-a3b", "--method", "lora", "--gpu", "T4"]) != 0
    capsys.readouterr()
    code = main(["recommend", "--model", "qwen3-30b-a3b", "--method", "lora", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["active_params"] == spec.active_params
    for option in data["options"]:
        assert get_gpu(option["gpu"]).usable_bytes >= option["peak_bytes"]


def test_the_oom_cli_diagnoses_a_moe_run(capsys):
    args = ["oom", A100_OOM, "--model", "mixtral-8x7b", "--method", "lora", "--batch-size", "8"]
    assert main([*args, "--seq-len", "2048", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    direct = oom_doctor(A100_OOM, model="mixtral-8x7b", method="lora", batch_size=8, seq_len=2048)
    assert [f["key"] for f in data["fixes"]] == [f.key for f in direct.fixes]
    assert data["fixes"] and all(f["peak_bytes"] <= direct.budget_bytes for f in data["fixes"])


@pytest.mark.parametrize("model", NEW_PRESETS)
@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_the_recommender_takes_each_new_preset(model, method):
    spec = resolve_model(model)
    rec = recommend(model, method=method)
    assert rec.options and rec.model.name == model
    for option in rec.options[:12]:
        report = estimate(spec, **option.settings, device="cuda")
        assert report.total_bytes == option.peak_bytes <= option.usable_bytes
        assert option.usable_bytes == get_gpu(option.gpu).usable_bytes
        if spec.n_experts and option.count == 1:  # QLoRA too: the experts stay in 16 bits
            assert option.peak_bytes > 2 * (spec.n_params - spec.active_params)


def test_the_doctor_reads_lora_on_the_experts_and_offers_it_off():
    """A peft LoraConfig with target_parameters on the experts' weights: the doctor counts
    their adapters and folded copies, and offers attention-only LoRA as a change that fits."""
    peft = pytest.importorskip("peft")
    lora = peft.LoraConfig(
        r=16,
        target_modules=["q_proj", "v_proj"],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate"],
    )
    d = oom_doctor(
        A100_OOM, lora, model="qwen3-30b-a3b", seq_len=2048, gradient_checkpointing=False
    )
    targets = ("q_proj", "v_proj", "experts.down_proj", "experts.gate_up_proj")
    expected = estimate("qwen3-30b-a3b", method="lora", seq_len=2048, lora_targets=targets)
    assert d.report.total_bytes == expected.total_bytes
    assert any("['mlp.gate'] are not read" in note for note in d.notes)
    off = [fix for fix in d.fixes if fix.key == "lora_targets"]
    assert off and off[0].change == {"lora_targets": ("q_proj", "v_proj")}
    assert "--lora-targets q_proj,v_proj" in off[0].how
    attention_only = estimate("qwen3-30b-a3b", method="lora", seq_len=2048)
    assert off[0].peak_bytes == attention_only.total_bytes
