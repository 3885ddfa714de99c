"""measure(): exact bytes, fake == real, the effects the course teaches, several GPUs, bad input."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from small_models import TINY_LLAMA

from lessonkit.errors import LessonkitError
from lessonkit.memory.measuring import measure, real_bitsandbytes, run_step, validate
from lessonkit.models.spec import ModelSpec

TINY = TINY_LLAMA
TINY_GPT2 = ModelSpec(
    name="tiny-gpt2",
    family="gpt2",
    n_layers=2,
    hidden_size=64,
    n_heads=4,
    n_kv_heads=4,
    intermediate_size=256,
    vocab_size=500,
    tie_embeddings=True,
    gated_mlp=False,
    norm="layernorm",
    attention_bias="all",
    mlp_bias=True,
    max_positions=128,
    hidden_act="gelu_new",
)
SHORT = dict(seq_len=64)
DEFAULTS = dict(
    method="full",
    precision="bf16-mixed",
    optimizer="adamw",
    batch_size=1,
    seq_len=64,
    gradient_checkpointing=False,
    lora_rank=8,
    lora_targets=("q_proj", "v_proj"),
    n_gpus=1,
    zero_stage=0,
    attention="sdpa",
    offload_optimizer=False,
    double_quant=True,
    lora_dtype="fp32",
    gradient_accumulation=1,
    device="cpu",
)


def tensor_numels(spec: ModelSpec) -> list[int]:
    """Element counts of every parameter tensor of a Llama-style spec, from its shape alone."""
    h, v = spec.hidden_size, spec.vocab_size
    per_layer = [a * b for a, b in spec.linear_shapes().values()] + [h, h]
    return [v * h, v * h, h] + per_layer * spec.n_layers


def measured(report):
    return report.settings["measured"]


# ----- exact bytes ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("precision", "optimizer", "weight_b", "grad_b", "state_b"),
    [
        ("fp32", "adamw", 4, 4, 8),
        ("bf16", "adamw", 2, 2, 4),
        ("bf16-mixed", "adamw-fused", 4, 4, 8),
        ("bf16-master", "adamw", 2, 2, 12),
        ("bf16-mixed", "sgd", 4, 4, 0),
        ("bf16-mixed", "sgd-momentum", 4, 4, 4),
        ("fp32", "lion", 4, 4, 4),
    ],
)
def test_full_finetuning_bytes_are_exact(precision, optimizer, weight_b, grad_b, state_b):
    n = TINY.n_params
    assert sum(tensor_numels(TINY)) == n
    r = measure(TINY, precision=precision, optimizer=optimizer, **SHORT)
    m = measured(r)
    assert m["parameter_bytes"] == n * weight_b
    assert m["gradient_bytes"] == n * grad_b
    # fused AdamW keeps a 4-byte step counter per tensor on the device; the others keep none
    steps = 4 * len(tensor_numels(TINY)) if optimizer == "adamw-fused" else 0
    assert m["optimizer_bytes"] == n * state_b + steps
    assert r.breakdown["optimizer"] == m["optimizer_bytes"]  # states are live at any peak
    assert r.breakdown["weights"] == m["parameter_bytes"] + m["buffer_bytes"]


def test_adafactor_keeps_factored_states():
    r = measure(TINY, precision="bf16-mixed", optimizer="adafactor", **SHORT)
    h, v = TINY.hidden_size, TINY.vocab_size
    matrices = [(v, h), (v, h)] + [(o, i) for i, o in TINY.linear_shapes().values()] * TINY.n_layers
    vectors = h * (2 * TINY.n_layers + 1)
    rms = len(tensor_numels(TINY))  # Adafactor keeps a 0-dim fp32 RMS tensor per parameter
    assert measured(r)["optimizer_bytes"] == 4 * (sum(a + b for a, b in matrices) + vectors + rms)


@pytest.mark.parametrize("optimizer", ["adamw-8bit", "paged-adamw-8bit"])
def test_8bit_optimizer_layout(optimizer):
    r = measure(TINY, precision="bf16-mixed", optimizer=optimizer, **SHORT)
    expected = 2 * 256 * 4  # the two shared quantization maps
    for n in tensor_numels(TINY):
        expected += 8 * n if n < 4096 else 2 * n + 2 * 4 * math.ceil(n / 256)
    assert measured(r)["optimizer_bytes"] == expected
    name = "PagedAdamW8bit" if optimizer.startswith("paged") else "AdamW8bit"
    if real_bitsandbytes():  # bitsandbytes itself steps, on CPU
        assert any(a == f"bitsandbytes {name}." for a in r.assumptions)
    else:
        assert any("stand-in" in a for a in r.assumptions)


def test_tied_embeddings_are_counted_once():
    r = measure(TINY_GPT2, precision="fp32", lora_targets=("c_attn",), **SHORT)
    assert measured(r)["parameter_bytes"] == TINY_GPT2.n_params * 4


@pytest.mark.parametrize(("lora_dtype", "adapter_b"), [("fp32", 4), ("bf16", 2)])
def test_lora_bytes_are_exact(lora_dtype, adapter_b):
    r = measure(TINY, method="lora", precision="bf16", lora_dtype=lora_dtype, **SHORT)
    lora = TINY.lora_params(16, ("q_proj", "v_proj"))
    m = measured(r)
    assert m["trainable_parameters"] == lora
    assert m["parameter_bytes"] == TINY.n_params * 2 + lora * adapter_b
    assert m["gradient_bytes"] == lora * adapter_b
    assert m["optimizer_bytes"] == 2 * lora * adapter_b


@pytest.mark.parametrize("double_quant", [True, False])
def test_qlora_weights_use_the_nf4_layout(double_quant):
    full = measure(TINY, method="lora", precision="bf16", **SHORT)
    r = measure(TINY, method="qlora", precision="bf16", double_quant=double_quant, **SHORT)
    quantized = TINY.linear_params
    nf4 = 0
    for a, b in TINY.linear_shapes().values():
        blocks = math.ceil(a * b / 64)
        constants = blocks + 4 * math.ceil(blocks / 256) if double_quant else 4 * blocks
        # each weight's QuantState: the 16 NF4 values (fp32); with double quantization also
        # the 256-entry map of the absmax values and their fp32 offset
        code = 4 * 16 + (4 * 256 + 4 if double_quant else 0)
        nf4 += (a * b) // 2 + constants + code
    lora = TINY.lora_params(16, ("q_proj", "v_proj"))
    m, mf = measured(r), measured(full)
    weights = m["parameter_bytes"] + m["buffer_bytes"]
    assert weights - mf["buffer_bytes"] == (
        (TINY.n_params - quantized) * 2 + lora * 4 + nf4 * TINY.n_layers
    )
    assert r.breakdown["weights"] == weights
    assert r.total_bytes < full.total_bytes
    if real_bitsandbytes():
        assert any(a.startswith("bitsandbytes ") and "Linear4bit (NF4" in a for a in r.assumptions)
    else:
        assert any("stand-in for bitsandbytes Linear4bit" in a for a in r.assumptions)


# ----- the fake run is the real run ------------------------------------------------------------
@pytest.mark.parametrize(
    "changes",
    [
        dict(),
        dict(method="qlora", precision="bf16", gradient_checkpointing=True, batch_size=2),
        dict(precision="bf16-master", optimizer="adamw-forloop", gradient_accumulation=2),
        dict(precision="bf16", n_gpus=4, zero_stage=3),
        dict(n_gpus=4, zero_stage=3),
    ],
    ids=["full-mixed", "qlora-ckpt", "master-accum", "zero3", "zero3-mixed"],
)
def test_fake_measurement_equals_a_real_cpu_run(changes):
    settings = validate(TINY, **(DEFAULTS | changes))
    fake, _ = run_step(TINY, settings, fake=True)
    real, _ = run_step(TINY, settings, fake=False)
    assert "FakeTensorMode" in fake.source and "real tensors" in real.source
    assert fake.breakdown == real.breakdown
    assert fake.phase_peaks == real.phase_peaks
    assert fake.peak_phase == real.peak_phase


# ----- what the course teaches ----------------------------------------------------------------
def forward_activations(report) -> int:
    """Activations (with logits) at the forward peak: the forward peak minus the weights and
    optimizer states (there are no gradients during the forward)."""
    m = measured(report)
    persistent = m["parameter_bytes"] + m["buffer_bytes"] + m["optimizer_bytes"]
    return report.phase_peaks["forward"] - persistent


def test_checkpointing_eager_attention_and_batch_size_change_activations():
    base = measure(TINY, precision="bf16", seq_len=256)
    ckpt = measure(TINY, precision="bf16", seq_len=256, gradient_checkpointing=True)
    eager = measure(TINY, precision="bf16", seq_len=256, attention="eager")
    batch2 = measure(TINY, precision="bf16", seq_len=256, batch_size=2)
    assert forward_activations(ckpt) < 0.8 * forward_activations(base)
    assert forward_activations(eager) > forward_activations(base)
    assert 1.8 < forward_activations(batch2) / forward_activations(base) < 2.2
    assert measured(ckpt)["optimizer_bytes"] == measured(base)["optimizer_bytes"]


def test_foreach_adamw_needs_more_at_the_step_than_forloop_and_fused():
    peaks = {
        opt: measure(TINY, precision="bf16", optimizer=opt, **SHORT).phase_peaks["optimizer"]
        for opt in ("adamw", "adamw-forloop", "adamw-fused")
    }
    assert peaks["adamw"] > peaks["adamw-forloop"] > peaks["adamw-fused"]


def test_gradient_accumulation_keeps_activations_flat():
    r = measure(TINY, precision="bf16", gradient_accumulation=3, **SHORT)
    first, second, third = measured(r)["micro_batch_forward_peaks"]
    assert second - first == measured(r)["gradient_bytes"]  # the gradients stay allocated
    assert third == second  # and activations do not grow


# ----- several GPUs ------------------------------------------------------------------------------
def test_zero3_over_four_gpus_shards_exactly_by_four():
    one = measured(measure(TINY, precision="bf16", **SHORT))
    r = measure(TINY, precision="bf16", n_gpus=4, zero_stage=3, **SHORT)
    four = measured(r)
    for key in ("parameter_bytes", "gradient_bytes", "optimizer_bytes"):
        assert four[key] * 4 == one[key], key
    assert any("ZeRO-3" in a for a in r.assumptions)


@pytest.mark.parametrize(
    ("spec", "kw"),
    [
        (TINY, dict()),
        (TINY_GPT2, dict(method="lora", lora_dtype="bf16")),
    ],
    ids=["llama-full", "gpt2-lora"],
)
def test_zero3_mixed_gathers_in_16_bits_without_autocast(spec, kw):
    """FSDP's mixed precision: fp32 shards, layers gathered in bf16, the model computing as in
    pure bf16; so the forward holds exactly what pure bf16 ZeRO-3 holds beyond its own
    weights and states."""

    def forward_extra(report):
        m = measured(report)
        return (
            report.phase_peaks["forward"]
            - m["parameter_bytes"]
            - m["buffer_bytes"]
            - m["optimizer_bytes"]
        )

    # bf16-mixed named: LoRA's own default is pure bf16
    mixed = measure(spec, n_gpus=4, zero_stage=3, precision="bf16-mixed", **SHORT, **kw)
    pure = measure(spec, n_gpus=4, zero_stage=3, precision="bf16", **SHORT, **kw)
    assert forward_extra(mixed) == forward_extra(pure)
    assert any(
        "MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)" in a for a in mixed.assumptions
    )
    if kw.get("method") is None:
        one = measured(measure(spec, precision="bf16-mixed", **SHORT))  # autocast, one GPU
        for key in ("parameter_bytes", "gradient_bytes", "optimizer_bytes"):
            assert measured(mixed)[key] * 4 == one[key], key
    # ZeRO-2 keeps autocast (replicated fp32 weights): the forward holds bf16 weight copies
    z2 = measure(spec, n_gpus=4, zero_stage=2, precision="bf16-mixed", **SHORT, **kw)
    assert any("autocast" in a for a in z2.assumptions)


def test_zero_stages_shard_what_they_should():
    one = measured(measure(TINY, precision="bf16", **SHORT))
    ddp = measured(measure(TINY, precision="bf16", n_gpus=2, **SHORT))
    z1 = measured(measure(TINY, precision="bf16", n_gpus=2, zero_stage=1, **SHORT))
    z2 = measured(measure(TINY, precision="bf16", n_gpus=2, zero_stage=2, **SHORT))
    off = measure(TINY, precision="bf16", n_gpus=2, zero_stage=2, offload_optimizer=True, **SHORT)
    assert ddp["gradient_bytes"] == 2 * one["gradient_bytes"]  # gradients + DDP buckets
    assert z1["gradient_bytes"] == one["gradient_bytes"]
    assert z1["optimizer_bytes"] * 2 == one["optimizer_bytes"]
    assert z2["gradient_bytes"] * 2 == one["gradient_bytes"]
    assert z2["parameter_bytes"] == one["parameter_bytes"]
    assert measured(off)["optimizer_bytes"] == 0 and off.breakdown["optimizer"] == 0


# ----- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(precision="bf17"), "Did you mean 'bf16'"),
        (dict(optimizer="adamm"), "Allowed:"),
        (dict(method="qlor"), "qlora"),
        (dict(batch_size=0), "batch_size"),
        (dict(seq_len=2.5), "seq_len"),
        (dict(zero_stage=4), "zero_stage"),
        (dict(offload_optimizer=True), "needs ZeRO"),
        (dict(method="lora", lora_targets=("q_prj",)), "LoRA target"),
        (dict(device="tpu"), "device"),
        (dict(gradient_checkpointing="yes"), "True or False"),
    ],
)
def test_bad_input_is_explained(kwargs, message):
    with pytest.raises(LessonkitError, match=message):
        measure(TINY, **kwargs)


def test_estimate_and_measure_refuse_the_same_input_in_the_same_words():
    from lessonkit.memory.estimating import estimate

    bad = [
        dict(precision="bf17"),
        dict(batch_size=0),
        dict(batch_size=5000),
        dict(seq_len=129),
        dict(zero_stage=4),
        dict(zero_stage=True),
        dict(n_gpus=0),
        dict(offload_optimizer=True),
        dict(method="lora", lora_targets="c_attn"),
        dict(method="lora", lora_targets=("q_proj", "v_proj")),
        dict(method="lora", lora_rank=65),
        dict(method="qlora", precision="fp32"),
        dict(method="qlora", n_gpus=2, zero_stage=3),
        dict(lora_dtype="int4"),
        dict(device="tpu"),
        dict(double_quant=1),
        dict(gradient_accumulation=0),
    ]
    for kwargs in bad:
        with pytest.raises(LessonkitError) as from_measure:
            measure(TINY_GPT2, **kwargs)
        with pytest.raises(LessonkitError) as from_estimate:
            estimate(TINY_GPT2, **kwargs)
        assert str(from_measure.value) == str(from_estimate.value), kwargs


def test_measure_adds_only_what_it_cannot_run():
    from lessonkit.memory.estimating import estimate
    from lessonkit.memory.settings import MAX_ACCUMULATION

    for kwargs, message in [
        (dict(gradient_accumulation=65), "measure runs every micro-batch"),
        (dict(gradient_accumulation=65), f"estimate\\(\\) takes up to {MAX_ACCUMULATION:,}\\."),
        (dict(method="qlora", n_gpus=2, zero_stage=2), "cannot shard"),
    ]:
        estimate(TINY, **kwargs)  # accepted there
        with pytest.raises(LessonkitError, match=message):
            measure(TINY, **kwargs)


def test_gpt2_lora_defaults_to_peft_target_c_attn():
    r = measure(TINY_GPT2, method="lora", **SHORT)
    assert r.settings["lora_targets"] == ["c_attn"]
    assert measured(r)["trainable_parameters"] == TINY_GPT2.lora_params(16, ("c_attn",))
    assert any("peft's default target for gpt2" in a for a in r.assumptions)
    llama = measure(TINY, method="lora", **SHORT)
    assert llama.settings["lora_targets"] == ["q_proj", "v_proj"]
    with pytest.raises(LessonkitError, match="LoRA target for gpt2.*Allowed: c_attn"):
        measure(TINY_GPT2, method="lora", lora_targets=["q_proj", "v_proj"], **SHORT)


def test_bad_model_and_sequence_length():
    with pytest.raises(LessonkitError, match="Unknown model"):
        measure("llama-9000")
    with pytest.raises(LessonkitError, match="seq_len must be at most 128"):
        measure(TINY_GPT2, seq_len=129, lora_targets=("c_attn",))


def test_a_model_without_sdpa_is_measured_with_eager_attention_and_says_so():
    gemma2 = ModelSpec(
        name="tiny-gemma2",
        family="gemma2",
        n_layers=1,
        hidden_size=64,
        n_heads=4,
        n_kv_heads=2,
        intermediate_size=128,
        vocab_size=500,
        tie_embeddings=True,
        hidden_act="gelu_pytorch_tanh",
    )
    r = measure(gemma2, precision="bf16", **SHORT)
    assert measured(r)["attention_implementation"] == "eager"
    assert any("eager attention only" in a for a in r.assumptions)
    assert measured(r)["parameter_bytes"] == gemma2.n_params * 2


def test_cuda_without_a_gpu_says_so():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    with pytest.raises(LessonkitError, match="needs a CUDA GPU"):
        measure(TINY, device="cuda", **SHORT)


# ----- a real model shape -----------------------------------------------------------------------
@pytest.mark.slow
def test_llama2_7b_bf16_adamw_step():
    r = measure("llama-2-7b", precision="bf16", optimizer="adamw", batch_size=1, seq_len=512)
    m = measured(r)
    n = 6_738_415_616
    assert m["parameter_bytes"] == 2 * n  # 12.551 GiB
    assert round(m["parameter_bytes"] / 2**30, 3) == 12.551
    assert m["gradient_bytes"] == 2 * n and m["optimizer_bytes"] == 4 * n
    assert r.peak_phase == "optimizer"
    # foreach AdamW: weights + gradients + states + one parameter-sized temporary
    assert r.breakdown["temporaries"] == 2 * n
    assert 2.5 * 2**30 < forward_activations(r) < 4.5 * 2**30


def test_cpu_only_figures_say_so():
    """CPU kernels keep more than CUDA's with dropout (GPT-2's, peft's): the measurement says
    its figure is CPU-only, and estimate(device='cuda') is below estimate(device='cpu')."""
    from lessonkit.memory.estimating import estimate

    gpt2 = measure(TINY_GPT2, precision="fp32", lora_targets=("c_attn",), **SHORT)
    assert measured(gpt2)["cpu_only"] is True
    assert any(a.startswith("CPU-only figure: GPT-2's dropout") for a in gpt2.assumptions)
    kw = dict(precision="fp32", **SHORT)
    assert (
        estimate(TINY_GPT2, device="cuda", **kw).tensor_bytes
        < estimate(TINY_GPT2, device="cpu", **kw).tensor_bytes
    )
    plain = measure(TINY, **SHORT)
    assert measured(plain)["cpu_only"] is False
    assert not any("CPU-only" in a for a in plain.assumptions)
    lora = measure(TINY, method="lora", lora_dropout=0.1, **SHORT)
    assert measured(lora)["cpu_only"] is True


# ----- what a fuzzing pass over estimate's accepted settings made measure raise -------------
def _refused_by_both(spec, words: str, **kw) -> None:
    from lessonkit.memory.estimating import estimate

    for run in (estimate, measure):
        with pytest.raises(LessonkitError, match=words):
            run(spec, device="cpu", **kw)


@pytest.mark.parametrize("optimizer", ["adamw-8bit", "paged-adamw-8bit", "paged-adamw-32bit"])
def test_fsdp2_refuses_bitsandbytes_optimizers(optimizer):
    """Their kernels have no DTensor sharding rule: torch raised NotImplementedError."""
    _refused_by_both(TINY, "bitsandbytes' optimizer kernels", optimizer=optimizer, zero_stage=3)
    measure(TINY, optimizer=optimizer, zero_stage=3, fsdp_version=1, **SHORT)  # FSDP1 steps them


def test_fsdp2_refuses_adafactor():
    _refused_by_both(
        TINY, "Adafactor makes its factored states", optimizer="adafactor", zero_stage=3
    )


def test_all_linear_on_experts_with_dropout_is_refused_by_both():
    """peft's all-linear also puts LoRA on the experts' fused weights, whose ParamWrapper
    refuses dropout (measure raised peft's ValueError)."""
    import transformers

    config = transformers.AutoConfig.for_model(
        "qwen3_moe",
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
    ).to_dict()
    moe = ModelSpec.from_hf_config(config | {"model_type": "qwen3_moe"}, name="tiny-qwen3-moe")
    _refused_by_both(
        moe, "refuses lora_dropout > 0", method="lora", lora_targets="all-linear", lora_dropout=0.1
    )
    with pytest.raises(LessonkitError, match="grouped matmul, which takes bf16"):
        measure(moe, method="full", precision="bf16-mixed", **SHORT)
    measure(moe, method="lora", precision="bf16", lora_targets=("q_proj", "experts"), **SHORT)


def test_fsdp1_runs_the_chunked_loss_through_its_root():
    """The chunked loss goes through FSDP1's root forward, which gathers the embeddings (the
    decoder had been called past it: an AssertionError from torch)."""
    from lessonkit.memory.estimating import estimate

    kw = dict(loss="chunked", n_gpus=2, zero_stage=3, fsdp_version=1, **SHORT)
    measured_bytes = measure(TINY, **kw).tensor_bytes
    assert abs(estimate(TINY, device="cpu", **kw).tensor_bytes / measured_bytes - 1) < 0.05


@pytest.mark.parametrize("optimizer", ["sgd", "lion", "adafactor", "adamw-8bit"])
def test_master_weights_are_modelled_with_adamw_only(optimizer):
    """measure steps fp32 masters with AdamW only; with other optimizers the estimate's
    masters had no counterpart (+20% to +150%)."""
    _refused_by_both(TINY, "modelled with AdamW", precision="bf16-master", optimizer=optimizer)
    measure(TINY, precision="bf16-master", optimizer="adamw", **SHORT)
