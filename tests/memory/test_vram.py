"""Properties of estimate() that can fail: monotonicity, orderings, exact sharding, the guide's case,
the report's shape, and clear errors for bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import lessonkit
from lessonkit import LessonkitError, estimate
from lessonkit.memory.estimating import cuda_constants
from lessonkit.memory.report import CATEGORIES
from lessonkit.models.presets import get_preset
from lessonkit.units import GB, GiB

BASE = [
    dict(model="llama-2-7b"),
    dict(model="llama-3.1-8b", method="qlora"),
    dict(model="qwen2.5-0.5b", method="lora", precision="bf16", attention="eager"),
    dict(model="gpt2", precision="fp32", gradient_checkpointing=True),
    dict(model="mistral-7b", n_gpus=4, zero_stage=3),
]


def _est(model: str, **kw):
    return estimate(model, **kw)


@pytest.mark.parametrize("case", BASE, ids=lambda c: "-".join(map(str, c.values())))
def test_grows_with_batch_and_length(case) -> None:
    kw = dict(case)
    model = kw.pop("model")
    by_batch = [_est(model, batch_size=b, seq_len=256, **kw).total_bytes for b in (1, 2, 4, 8)]
    by_len = [_est(model, batch_size=2, seq_len=n, **kw).total_bytes for n in (64, 128, 256, 512)]
    assert by_batch == sorted(by_batch) and len(set(by_batch)) == len(by_batch)
    assert by_len == sorted(by_len) and len(set(by_len)) == len(by_len)


@pytest.mark.parametrize("model", ["llama-2-7b", "qwen2.5-1.5b", "gpt2"])
def test_checkpointing_lowers_activations_and_forward_peak(model) -> None:
    plain = _est(model, batch_size=8, seq_len=1024)
    ckpt = _est(model, batch_size=8, seq_len=1024, gradient_checkpointing=True)
    assert ckpt.phase_peaks["forward"] < plain.phase_peaks["forward"]
    assert ckpt.total_bytes < plain.total_bytes
    spec = get_preset(model)
    # what checkpointing keeps: one input per layer, far less than everything
    kept = spec.n_layers * 4 * 8 * 1024 * spec.hidden_size
    assert ckpt.phase_peaks["forward"] - plain.phase_peaks["forward"] < -kept


def test_checkpointed_backward_peaks_in_the_first_layer_when_gradients_outgrow_inputs() -> None:
    """Each finished layer frees its 16-bit input (4 x 512 tokens x 512 = 2 MiB here) and leaves
    its gradients (6 MiB): the peak is inside the first layer's backward, with every other
    layer's gradients made; with LoRA (tiny gradients) it is inside the last layer's."""
    from lessonkit.models.spec import ModelSpec

    wide = ModelSpec(
        name="wide",
        family="llama",
        n_layers=4,
        hidden_size=512,
        n_heads=8,
        n_kv_heads=8,
        intermediate_size=1408,
        vocab_size=1000,
    )
    layer = 2 * sum(math.prod(t.shape) for t in wide.parameter_tensors().layer)
    kw = dict(
        batch_size=4, seq_len=512, gradient_checkpointing=True, precision="bf16", device="cpu"
    )
    full = estimate(wide, **kw)
    assert full.peak_phase == "backward"
    assert full.breakdown["gradients"] > (wide.n_layers - 1) * layer
    lora = estimate(wide, method="lora", **kw)
    assert lora.peak_phase == "backward"
    four_inputs = wide.n_layers * 2 * 4 * 512 * 512
    assert lora.breakdown["activations"] > four_inputs  # every checkpoint still held


def test_qlora_below_lora_below_full() -> None:
    totals = [
        _est("llama-2-7b", method=m, batch_size=2, seq_len=1024).total_bytes
        for m in ("qlora", "lora", "full")
    ]
    assert totals[0] < totals[1] < totals[2]
    weights = [
        _est("llama-2-7b", method=m, precision="bf16-mixed").settings["estimated"]["weight_bytes"]
        for m in ("qlora", "lora")
    ]
    assert weights[0] < weights[1] / 5  # 4-bit linears versus fp32 weights


def test_eager_attention_keeps_the_score_matrix() -> None:
    sdpa = _est("llama-2-7b", method="lora", batch_size=1, seq_len=4096)
    eager = _est("llama-2-7b", method="lora", batch_size=1, seq_len=4096, attention="eager")
    spec = get_preset("llama-2-7b")
    scores = spec.n_layers * spec.n_heads * 4096**2 * 4  # the fp32 softmax alone
    assert eager.total_bytes - sdpa.total_bytes > scores


def test_zero3_on_8_gpus_shards_exactly() -> None:
    spec = get_preset("llama-2-7b")  # every dimension divides by 8
    one = _est("llama-2-7b").settings["estimated"]
    eight = _est("llama-2-7b", n_gpus=8, zero_stage=3).settings["estimated"]
    buffers = 2 * 4 * (spec.head_dim // 2)
    assert eight["weight_bytes"] - buffers == (one["weight_bytes"] - buffers) // 8
    assert eight["gradient_bytes"] == one["gradient_bytes"] // 8
    assert eight["optimizer_bytes"] == one["optimizer_bytes"] // 8
    assert one["weight_bytes"] - buffers == 4 * spec.n_params


def test_zero3_buffers_are_what_the_assumption_says() -> None:
    """At the backward peak: the root gathered, plus four layer-sized 16-bit buffers (the
    layer's parameters, the next one's all-gather buffer, its unsharded gradients, one
    reduce-scatter buffer) and lm_head's unsharded gradient, as the assumption text says; the
    gradients at the peak are shards only."""
    spec = get_preset("llama-2-7b")  # every dimension divides by 8: no padding
    tensors = spec.parameter_tensors()
    layer = 2 * sum(math.prod(t.shape) for t in tensors.layer)
    root = 2 * sum(math.prod(t.shape) for t in tensors.outer)
    for kw in (dict(), dict(seq_len=64), dict(gradient_checkpointing=True)):
        r = _est("llama-2-7b", n_gpus=8, zero_stage=3, precision="bf16", device="cpu", **kw)
        assert r.peak_phase == "backward"
        head = 2 * spec.vocab_size * spec.hidden_size
        assert r.breakdown["temporaries"] == root + 4 * layer + head
        assert r.breakdown["gradients"] <= r.settings["estimated"]["gradient_bytes"]
        note = next(a for a in r.assumptions if "ZeRO-3" in a)
        assert "one decoder layer's parameters" in note and "four layer-sized" in note
        assert "lm_head's unsharded gradient" in note
        assert "two decoder layers" not in note


def test_zero_stages_shard_what_they_say() -> None:
    e = {z: _est("llama-2-7b", n_gpus=4, zero_stage=z).settings["estimated"] for z in range(4)}
    full = _est("llama-2-7b").settings["estimated"]
    assert e[0]["gradient_bytes"] == 2 * full["gradient_bytes"]  # DDP's buckets
    assert e[1]["optimizer_bytes"] == full["optimizer_bytes"] // 4
    assert e[1]["gradient_bytes"] == full["gradient_bytes"]
    assert e[2]["gradient_bytes"] == full["gradient_bytes"] // 4
    assert e[2]["weight_bytes"] == full["weight_bytes"]
    assert e[3]["weight_bytes"] < full["weight_bytes"] // 3
    off = _est("llama-2-7b", n_gpus=4, zero_stage=2, offload_optimizer=True)
    assert off.settings["estimated"]["optimizer_bytes"] == 0
    assert any("CPU RAM" in a for a in off.assumptions)


def test_guide_case_7b_full_16bit() -> None:
    """The guide: '~120GB to 160GB' and a single 80 GB A100 for full SFT of a 7B model.

    Mixed-precision AdamW keeps 4 (fp32 weights) + 4 (fp32 grads) + 8 (two fp32 states) =
    16 bytes per parameter: 107.8 GB for Llama-2-7B before activations; the default foreach
    step adds a parameter-sized temporary (4 B/param), so the peak is ~142 GB with the CUDA
    context and margin: inside the guide's range, and far above one 80 GB GPU.
    """
    r = _est("7B", precision="bf16-mixed")
    n = r.model.n_params
    e = r.settings["estimated"]
    rotary_buffers = 2 * 4 * (r.model.head_dim // 2)
    assert e["weight_bytes"] + e["gradient_bytes"] + e["optimizer_bytes"] - rotary_buffers == 16 * n
    assert 108 * GB < r.total_bytes < 160 * GB
    assert r.total_bytes >= 120 * GB  # within the guide's range, for the reason above
    assert not r.fits(80 * GB)
    assert not _est("7B", optimizer="adamw-fused").fits(80 * GB)
    assert r.peak_phase == "optimizer"
    assert any("llama-2-7b" in a for a in r.assumptions)  # which shape a bare size means


def test_report_shape_and_phases() -> None:
    r = _est("llama-3.1-8b", method="lora", batch_size=2, seq_len=2048)
    assert set(CATEGORIES) <= set(r.breakdown)
    assert r.total_bytes == sum(r.breakdown.values())
    assert set(r.phase_peaks) == {"forward", "backward", "optimizer"}
    assert r.peak_phase == max(r.phase_peaks, key=r.phase_peaks.get)
    assert r.tensor_bytes == r.phase_peaks[r.peak_phase]
    const = cuda_constants()
    assert r.breakdown["cuda_context"] == const["cuda_context_bytes"]
    assert r.breakdown["allocator_margin"] == int(
        r.tensor_bytes * (const["allocator_margin_ratio"] - 1)
    )
    assert const["source"] and const["as_of"]
    assert r.breakdown["logits"] >= 4 * 2 * 2048 * 128256  # fp32 log-softmax, 128k vocabulary
    cpu = _est("llama-3.1-8b", method="lora", batch_size=2, seq_len=2048, device="cpu")
    assert cpu.breakdown["cuda_context"] == cpu.breakdown["allocator_margin"] == 0
    assert cpu.total_bytes == r.tensor_bytes
    text, html = str(r), r._repr_html_()
    assert f"{r.total_bytes / GiB:.2f} GiB" in text and f"{r.total_bytes / GiB:.2f} GiB" in html
    assert " GB" not in text and " GB" not in html  # one unit for memory: GiB
    assert "<table>" in html
    json.dumps(r.to_dict(), default=str)
    assert len(r.assumptions) >= 5


def test_gradient_accumulation_keeps_gradients_in_forward() -> None:
    one = _est("llama-2-7b", optimizer="adamw-fused", batch_size=4)
    four = _est("llama-2-7b", optimizer="adamw-fused", batch_size=4, gradient_accumulation=4)
    grads = one.settings["estimated"]["gradient_bytes"]
    assert four.phase_peaks["forward"] - one.phase_peaks["forward"] == grads
    assert four.phase_peaks["optimizer"] == one.phase_peaks["optimizer"]


def test_optimizers_order_by_state_size() -> None:
    states = {
        o: _est("llama-2-7b", optimizer=o).settings["estimated"]["optimizer_bytes"]
        for o in ("adamw", "adamw-8bit", "lion", "adafactor", "sgd")
    }
    n = get_preset("llama-2-7b").n_params
    assert states["adamw"] == 8 * n
    assert states["lion"] == 4 * n
    assert states["sgd"] == 0
    assert states["adafactor"] < states["adamw-8bit"] < states["lion"] < states["adamw"]
    master = _est("llama-2-7b", precision="bf16-master").settings["estimated"]
    assert master["optimizer_bytes"] == 12 * n and master["gradient_bytes"] == 2 * n


def test_lora_dtype_and_double_quant() -> None:
    fp32 = _est("llama-2-7b", method="lora").settings["estimated"]
    bf16 = _est("llama-2-7b", method="lora", lora_dtype="bf16").settings["estimated"]
    assert bf16["gradient_bytes"] * 2 == fp32["gradient_bytes"]
    dq = _est("llama-2-7b", method="qlora").settings["estimated"]["weight_bytes"]
    no_dq = _est("llama-2-7b", method="qlora", double_quant=False).settings["estimated"]
    linear = get_preset("llama-2-7b").linear_params
    # 4 bytes per 64 values versus 1 byte per 64 plus 4 per 256 x 64
    saved = no_dq["weight_bytes"] - dq
    assert math.isclose(saved, linear * (4 / 64 - 1 / 64 - 4 / (256 * 64)), rel_tol=1e-3)


def test_import_stays_light_and_estimate_needs_no_torch() -> None:
    code = (
        "import sys, lessonkit; r = lessonkit.estimate('7B'); "
        "assert r.total_bytes > 0; "
        "bad = [m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# lessonkit's modules that need torch, as their docstrings say; measure() imports them
NEEDS_TORCH = {
    "memory.tracking",
    "memory.standins",
    "memory.real_bitsandbytes",
    "memory.fsdp1_wrapping",
}


def test_every_public_module_imports_without_torch() -> None:
    import pkgutil

    import lessonkit

    names = sorted(
        m.name.removeprefix("lessonkit.")
        for m in pkgutil.walk_packages(lessonkit.__path__, "lessonkit.")
        if not m.name.endswith("__main__")
    )
    assert set(names) >= NEEDS_TORCH
    public = [n for n in names if n not in NEEDS_TORCH]
    for name in NEEDS_TORCH:
        source = (Path(lessonkit.__file__).parent / (name.replace(".", "/") + ".py")).read_text()
        assert "Private, and needs torch" in source, name
    code = (
        "import importlib, sys\n"
        "sys.modules['torch'] = None  # import torch now raises ImportError\n"
        f"for name in {public!r}:\n"
        "    importlib.import_module('lessonkit.' + name)\n"
        "import lessonkit\n"
        "try:\n"
        "    lessonkit.measure('7B')\n"
        "except lessonkit.LessonkitError as err:\n"
        "    assert 'pip install' in str(err), err\n"
        "else:\n"
        "    raise AssertionError('measure ran without torch')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ----- bad input: what was wrong and what is allowed ------------------------------------------
BAD = [
    (dict(model="lama-2-7b"), "Did you mean 'llama-2-7b'"),
    (dict(model="7B", method="qlorra"), "Did you mean 'qlora'"),
    (dict(model="7B", precision="bf17"), "Allowed: fp32"),
    (dict(model="7B", optimizer="adam"), "Did you mean"),
    (dict(model="7B", attention="flash2"), "Allowed: sdpa, flash, eager"),
    (dict(model="7B", batch_size=0), ">= 1"),
    (dict(model="7B", batch_size=-3), ">= 1"),
    (dict(model="7B", batch_size=10**9), "at most 4,096"),
    (dict(model="7B", batch_size=2.5), "whole number"),
    (dict(model="7B", batch_size="4"), "whole number"),
    (dict(model="7B", seq_len=10**8), "at most 1,048,576"),
    (dict(model="gpt2", seq_len=2048), "at most 1,024"),
    (dict(model="7B", lora_rank=0, method="lora"), ">= 1"),
    (dict(model="7B", lora_rank=8192, method="lora"), "at most the hidden size"),
    (dict(model="7B", method="lora", lora_targets=("q_prj",)), "Did you mean 'q_proj'"),
    (dict(model="gpt2", method="lora", lora_targets=("q_proj", "v_proj")), "LoRA target for gpt2"),
    (dict(model="gpt2", method="lora", lora_targets="q_proj"), "lora_targets must be a list"),
    (dict(model="7B", method="lora", lora_targets=()), "lora_targets"),
    (dict(model="gpt2", method="lora", lora_targets=("c_attn", "lm_head")), "untied output head"),
    (dict(model="llama-3.2-1b", method="lora", lora_targets=("lm_head",)), "ties lm_head"),
    (dict(model="7B", method="lora", lora_targets=("q_proj", "lm_hed")), "Did you mean"),
    (dict(model="7B", zero_stage=4), "zero_stage must be one of 0, 1, 2, 3"),
    (dict(model="7B", zero_stage=True), "zero_stage"),
    (dict(model="7B", n_gpus=0), "n_gpus must be >= 1"),
    (dict(model="7B", n_gpus=10**6), "at most 1,024"),
    (dict(model="7B", method="qlora", precision="fp32"), "makes no sense"),
    (dict(model="7B", method="qlora", precision="bf16-master"), "makes no sense"),
    (dict(model="7B", offload_optimizer=True), "needs ZeRO"),
    (dict(model="7B", gradient_checkpointing="yes"), "True or False"),
    (dict(model="7B", lora_dtype="int4", method="lora"), "Allowed: fp32, bf16"),
    (dict(model="7B", device="tpu"), "Allowed: cuda, cpu"),
    (dict(model="7B", gradient_accumulation=0), ">= 1"),
    (dict(model=0), "at least 1M"),
    (dict(model=5e13), "at most 2T"),
    (dict(model=None), "A model is a preset name"),
]


@pytest.mark.parametrize(("kw", "message"), BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_input_gets_a_clear_error(kw, message) -> None:
    kw = dict(kw)
    model = kw.pop("model")
    with pytest.raises(LessonkitError) as err:
        estimate(model, **kw)
    assert message in str(err.value)
    assert isinstance(err.value, ValueError)


def test_zero3_mixed_is_fsdp_mixed_precision() -> None:
    """ZeRO-3 with "bf16-mixed" gathers each layer in bf16 from fp32 shards (no autocast
    copies): weights, gradients and states are 16 bytes per parameter over the GPUs, and the
    forward holds what a pure bf16 ZeRO-3 run holds on top of its own weights and states."""
    spec = get_preset("llama-2-70b")
    buffers = 2 * 4 * (spec.head_dim // 2)
    peaks = {}
    for n in (8, 16, 32, 64):
        r = _est("llama-2-70b", n_gpus=n, zero_stage=3)
        e = r.settings["estimated"]
        assert e["weight_bytes"] + e["gradient_bytes"] + e["optimizer_bytes"] - buffers == (
            16 * spec.n_params // n
        )  # every dimension of Llama-2-70B divides by 64
        assert any("MixedPrecisionPolicy" in a for a in r.assumptions)
        assert not any("autocast's" in a for a in r.assumptions)
        peaks[n] = r.total_bytes
    assert peaks[16] < 0.55 * peaks[8] and peaks[32] < 0.65 * peaks[16]
    assert peaks[32] < 80 * GB  # full fine-tuning of 70B fits on 32 A100/H100 80 GB
    for model, kw in (("llama-2-7b", {}), ("gpt2", dict(method="lora", lora_dtype="bf16"))):
        mixed = _est(model, n_gpus=4, zero_stage=3, device="cpu", **kw)
        pure = _est(model, n_gpus=4, zero_stage=3, precision="bf16", device="cpu", **kw)

        def forward_extra(r):
            e = r.settings["estimated"]
            return r.phase_peaks["forward"] - e["weight_bytes"] - e["optimizer_bytes"]

        assert forward_extra(mixed) == forward_extra(pure)


def test_zero_1_and_2_keep_autocast() -> None:
    for zero in (0, 1, 2):
        r = _est("llama-2-7b", n_gpus=4, zero_stage=zero)
        assert any("autocast's bf16 copy" in a for a in r.assumptions)
        assert not any("MixedPrecisionPolicy" in a for a in r.assumptions)
    # autocast's copies of every layer (143 GB for 70B) would keep ZeRO-3 above that per GPU
    assert _est("llama-2-70b", n_gpus=64, zero_stage=3).total_bytes < 50 * GB


def test_gpt2_lora_uses_peft_default_targets() -> None:
    spec = get_preset("gpt2")
    r = _est("gpt2", method="lora")
    assert r.settings["lora_targets"] == ["c_attn"]
    assert r.settings["estimated"]["trainable_parameters"] == spec.lora_params(16, ("c_attn",))
    assert any("peft's default target for gpt2" in a for a in r.assumptions)
    for targets in (None, ("c_attn",)):
        same = _est("gpt2", method="lora", lora_targets=targets)
        assert same.total_bytes == r.total_bytes
    llama = _est("llama-2-7b", method="lora")
    assert llama.settings["lora_targets"] == ["q_proj", "v_proj"]
    assert not any("peft's default target" in a for a in llama.assumptions)
    assert _est("llama-2-7b", method="lora", lora_targets=None).total_bytes == llama.total_bytes
    rec = lessonkit.recommend("gpt2", method="lora")
    assert rec is not None


def test_exported_from_the_package() -> None:
    assert lessonkit.estimate is estimate


def test_zero3_with_accumulation_counts_each_gradient_shard_once() -> None:
    """With several micro-batches the shards exist from the first one and are added to in
    place: the gradients at the peak are the shards, and ZeRO-3 stays below ZeRO-2."""
    kw = dict(n_gpus=8, gradient_accumulation=2)
    z3 = estimate("llama-2-7b", zero_stage=3, **kw)
    z2 = estimate("llama-2-7b", zero_stage=2, **kw)
    assert z3.breakdown["gradients"] == z3.settings["estimated"]["gradient_bytes"]
    assert z3.total_bytes < z2.total_bytes


def test_one_layer_lora_under_zero3_has_no_negative_activations() -> None:
    from lessonkit.models.spec import ModelSpec

    one = ModelSpec(
        name="one-layer",
        family="llama",
        n_layers=1,
        hidden_size=256,
        n_heads=4,
        n_kv_heads=4,
        intermediate_size=688,
        vocab_size=4096,
    )
    totals = []
    for batch in (1, 2, 4):
        r = estimate(
            one, method="lora", n_gpus=2, zero_stage=3, batch_size=batch, seq_len=64, device="cpu"
        )
        assert min(r.breakdown.values()) >= 0
        totals.append(r.total_bytes)
    assert totals == sorted(totals)


def test_zero2_gradients_are_whole_bytes_on_an_odd_gpu_count() -> None:
    r = estimate("llama-2-7b", n_gpus=3, zero_stage=2)
    grads = r.settings["estimated"]["gradient_bytes"]
    assert r.breakdown["gradients"] <= grads
    assert all(isinstance(v, int) for v in r.phase_peaks.values())


def test_lora_on_the_head_and_embeddings_adds_their_adapters() -> None:
    """LitGPT's lora_head and peft's LoRA Embedding: rank x (in + out) each, outside the layers."""
    spec = lessonkit.resolve_model("llama-2-7b")
    kw = dict(method="lora", batch_size=1, seq_len=512)
    base = lessonkit.estimate(spec, lora_targets=("q_proj", "v_proj"), **kw)
    both = lessonkit.estimate(
        spec, lora_targets=("q_proj", "v_proj", "lm_head", "embed_tokens"), **kw
    )
    trained = both.settings["estimated"]["trainable_parameters"]
    added = trained - base.settings["estimated"]["trainable_parameters"]
    assert added == 2 * 16 * (spec.hidden_size + spec.vocab_size)
    # fp32 adapters: their gradients and two AdamW states grow by the same count
    grads = (
        both.settings["estimated"]["gradient_bytes"] - base.settings["estimated"]["gradient_bytes"]
    )
    assert grads == 4 * added
