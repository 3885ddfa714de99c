"""The calculator against measurement: estimate() vs measure() on a grid of training steps.

measure() runs each step for real under FakeTensorMode on CPU, so the estimate is compared with
device="cpu" (no CUDA context, no allocator margin, CPU kernels). Targets: weights, gradients and
optimizer states exact to the byte; the tensor peak within 5% for every configuration and
within 2% at the median.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import lessonkit
from lessonkit.models.spec import ModelSpec

SPECS = {
    "llama": ModelSpec(
        name="tiny-llama",
        family="llama",
        n_layers=2,
        hidden_size=256,
        n_heads=4,
        n_kv_heads=4,
        intermediate_size=688,
        vocab_size=4096,
    ),
    "qwen": ModelSpec(
        name="tiny-qwen2",
        family="qwen2",
        n_layers=2,
        hidden_size=256,
        n_heads=8,
        n_kv_heads=2,
        intermediate_size=704,
        vocab_size=4096,
        attention_bias="qkv",
    ),
    "gpt2": ModelSpec(
        name="tiny-gpt2",
        family="gpt2",
        n_layers=2,
        hidden_size=256,
        n_heads=4,
        n_kv_heads=4,
        intermediate_size=1024,
        vocab_size=4096,
        tie_embeddings=True,
        gated_mlp=False,
        norm="layernorm",
        attention_bias="all",
        mlp_bias=True,
        max_positions=1024,
        hidden_act="gelu_new",
    ),
    "llama4": ModelSpec(
        name="small-llama-4L",
        family="llama",
        n_layers=4,
        hidden_size=384,
        n_heads=6,
        n_kv_heads=2,
        intermediate_size=1024,
        vocab_size=8192,
    ),
    # layers outweigh the embeddings, as in real models: under ZeRO-3 the layer-by-layer
    # gathers and reductions decide the peak, and with checkpointing the moment inside the
    # first layer's backward (every other layer's gradients made, its activations recomputed)
    "wide": ModelSpec(
        name="wide-llama-4L",
        family="llama",
        n_layers=4,
        hidden_size=512,
        n_heads=8,
        n_kv_heads=8,
        intermediate_size=1408,
        vocab_size=1000,
    ),
    "one": ModelSpec(
        name="one-layer-llama",
        family="llama",
        n_layers=1,
        hidden_size=512,
        n_heads=8,
        n_kv_heads=8,
        intermediate_size=1408,
        vocab_size=1000,
    ),
    "wgpt2": ModelSpec(
        name="wide-gpt2-4L",
        family="gpt2",
        n_layers=4,
        hidden_size=512,
        n_heads=8,
        n_kv_heads=8,
        intermediate_size=2048,
        vocab_size=1000,
        tie_embeddings=True,
        gated_mlp=False,
        norm="layernorm",
        attention_bias="all",
        mlp_bias=True,
        max_positions=1024,
        hidden_act="gelu_new",
    ),
}


def _family_spec(family: str, **fields: object) -> ModelSpec:
    """A small model of ``family`` read, as a config.json is, through transformers' own
    config class (its defaults for every field not given)."""
    import transformers

    small = dict(
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=4096,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    )
    config = transformers.AutoConfig.for_model(family, **(small | fields)).to_dict()
    return ModelSpec.from_hf_config(config | {"model_type": family}, name=f"tiny-{family}")


# the families of 2025: QK norm (qwen3, gemma3_text per head, olmo2 over the projection),
# norms after each sublayer (olmo2, gemma3_text), fused projections (phi3), layers without
# rotary (smollm3), multipliers (granite: Granite 3's own values)
FAMILY_SPECS = {
    "qwen3": _family_spec("qwen3"),
    "gemma3": _family_spec("gemma3_text", head_dim=64, sliding_window=64, query_pre_attn_scalar=64),
    "phi3": _family_spec("phi3"),
    "olmo2": _family_spec("olmo2"),
    "smollm3": _family_spec("smollm3"),
    "granite": _family_spec(
        "granite",
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        attention_multiplier=0.0078125,
        logits_scaling=8.0,
    ),
}
SPECS.update(FAMILY_SPECS)
# mixture of experts, block by block: every expert's weights, the routed experts' activations
# (bf16: transformers' grouped-GEMM experts)
MOE_SPECS = {
    "qwen3_moe": _family_spec(
        "qwen3_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128
    ),
    "mixtral": _family_spec("mixtral", num_local_experts=4, num_experts_per_tok=2),
}
SPECS.update(MOE_SPECS)
MOE_ROWS = [
    (family, dict(batch_size=4, seq_len=256, **method, gradient_checkpointing=checkpointing))
    for family in MOE_SPECS
    for method in (dict(precision="bf16"), dict(method="lora", precision="bf16"))
    for checkpointing in (False, True)
]
# gpt-oss, block by block: attention sinks (eager, as it trains), biased projections, router
# and experts (clamped SwiGLU), sliding-window (128 < 256 tokens) and full layers in turn
GPT_OSS_SPECS = {
    "gpt_oss": _family_spec(
        "gpt_oss",
        num_local_experts=8,
        num_experts_per_tok=2,
        intermediate_size=128,
        head_dim=32,
    ),
}
SPECS.update(GPT_OSS_SPECS)
GPT_OSS_ROWS = [
    (family, dict(batch_size=4, seq_len=256, **method, gradient_checkpointing=checkpointing))
    for family in GPT_OSS_SPECS
    for method in (
        dict(precision="bf16"),
        dict(method="lora", precision="bf16"),
        dict(method="qlora", precision="bf16"),  # the attention's linear layers in NF4
    )
    for checkpointing in (False, True)
]
# each layer's own attention type: a Gemma 3 whose second layer is a full-attention one (its
# SDPA keeps no mask, and it has rotary tables of its own)
LAYER_TYPE_SPECS = {
    "gemma3_mixed": _family_spec(
        "gemma3_text",
        head_dim=64,
        sliding_window=64,
        query_pre_attn_scalar=64,
        layer_types=["sliding_attention", "full_attention"],
    ),
}
SPECS.update(LAYER_TYPE_SPECS)
LAYER_TYPE_ROWS = [
    (
        "gemma3_mixed",
        dict(batch_size=4, seq_len=256, **method, gradient_checkpointing=checkpointing),
    )
    for method in ({}, dict(method="lora", precision="bf16"))
    for checkpointing in (False, True)
]
# MoE where the experts' activations outweigh the logits (vocabulary 1,000, 4 x 512 tokens):
# the recomputed layer's backward under checkpointing, the last layer's forward without it;
# real expert counts too (128 experts, top-8, as Qwen3-30B-A3B, at hidden 256)
MOE_WIDE_SPECS = {
    f"{family}-{name}": replace(
        _family_spec(family, vocab_size=1000, **fields), name=f"tiny-{family}-{name}"
    )
    for family, name, fields in (
        (
            "qwen3_moe",
            "16x4",
            dict(
                num_experts=16, num_experts_per_tok=4, moe_intermediate_size=128,
                norm_topk_prob=True,
            ),
        ),
        ("mixtral", "8x2", dict(num_local_experts=8, num_experts_per_tok=2)),
        (
            "qwen3_moe",
            "128x8",
            dict(
                num_experts=128, num_experts_per_tok=8, moe_intermediate_size=96,
                norm_topk_prob=True,
            ),
        ),
    )
}  # fmt: skip
SPECS.update(MOE_WIDE_SPECS)
MOE_WIDE_ROWS = [
    (name, dict(batch_size=4, seq_len=512, **method, gradient_checkpointing=checkpointing))
    for name in MOE_WIDE_SPECS
    for method in (dict(precision="bf16"), dict(method="lora", precision="bf16"))
    for checkpointing in (False, True)
]
# QLoRA of MoE models: the attention's linear layers in NF4, the experts' 3D weights and the
# router (nn.Parameters, not nn.Linear) left in bf16 by bitsandbytes' Linear4bit replacement
MOE_QLORA_ROWS = [
    (name, dict(batch_size=4, seq_len=seq_len, method="qlora", precision="bf16", **more))
    for name, seq_len in (("qwen3_moe", 256), ("mixtral", 256), ("qwen3_moe-128x8", 512))
    for more in (dict(gradient_checkpointing=False), dict(gradient_checkpointing=True))
]
# ZeRO-3 of MoE models (FSDP2 on simulated ranks): each decoder layer's unit gathers all its
# experts' weights, and its backward makes their full gradients before the reduce-scatter
MOE_ZERO3_ROWS = [
    (name, dict(batch_size=batch, seq_len=seq_len, n_gpus=n_gpus, zero_stage=3, **more))
    for names, batch, seq_len, n_gpus in (
        (tuple(MOE_SPECS), 2, 128, 2),
        (tuple(MOE_WIDE_SPECS), 4, 512, 4),
    )
    for name in names
    for more in (
        dict(precision="bf16", gradient_checkpointing=False),
        dict(precision="bf16", gradient_checkpointing=True),
    )
]
# LoRA on the experts' 3D weights (peft's target_parameters): the folded copies of the
# expert stacks its forward makes and saves, and their full gradients in the backward; with
# attention LoRA beside it, on the down projection alone, under QLoRA, and at 128 experts
EXPERT_LORA_ROWS = [
    (name, dict(batch_size=batch, seq_len=seq_len, method=method, precision="bf16", **more))
    for name, method, targets, batch, seq_len in (
        ("qwen3_moe", "lora", ["q_proj", "v_proj", "experts"], 4, 256),
        ("qwen3_moe", "lora", ["experts.down_proj"], 4, 256),
        ("mixtral", "lora", ["q_proj", "v_proj", "experts"], 4, 256),
        ("gpt_oss", "lora", ["q_proj", "v_proj", "experts"], 4, 256),
        ("gpt_oss", "qlora", ["q_proj", "v_proj", "experts.gate_up_proj"], 4, 256),
        # few tokens: the folded stacks and their gradients set the peak
        ("qwen3_moe-128x8", "lora", ["experts"], 1, 128),
        ("qwen3_moe-128x8", "lora", ["q_proj", "v_proj", "experts.gate_up_proj"], 1, 128),
    )
    for more in (
        dict(lora_targets=targets, gradient_checkpointing=False),
        dict(lora_targets=targets, gradient_checkpointing=True),
    )
]
# full, LoRA and QLoRA, with and without checkpointing, for each of them
FAMILY_ROWS = [
    (family, dict(batch_size=4, seq_len=256, **method, gradient_checkpointing=checkpointing))
    for family in FAMILY_SPECS
    for method in (
        {},
        dict(method="lora", precision="bf16"),
        dict(method="qlora", precision="bf16"),
    )
    for checkpointing in (False, True)
]

# (family, settings): every method, precision and optimizer, several batch sizes and lengths,
# checkpointing on and off, eager and SDPA attention, one and several GPUs.
# LoRA and QLoRA rows name their precision: bf16-mixed (an fp32 base under autocast) or bf16
# (the usual one, estimate()'s default for them).
GRID = [
    ("llama", dict(batch_size=2, seq_len=64)),
    ("llama", dict(batch_size=4, seq_len=256)),
    ("llama", dict(batch_size=8, seq_len=512)),
    ("llama", dict(batch_size=4, seq_len=256, precision="bf16")),
    ("llama", dict(batch_size=4, seq_len=256, precision="fp32")),
    ("llama", dict(batch_size=4, seq_len=256, attention="eager")),
    ("llama", dict(batch_size=2, seq_len=64, optimizer="adamw-fused")),
    ("llama", dict(batch_size=2, seq_len=64, optimizer="adamw-forloop")),
    ("llama", dict(batch_size=2, seq_len=64, optimizer="sgd")),
    ("llama", dict(batch_size=2, seq_len=64, optimizer="sgd-momentum")),
    ("llama", dict(batch_size=2, seq_len=64, optimizer="adafactor")),
    ("llama", dict(batch_size=2, seq_len=64, optimizer="lion")),
    ("llama", dict(batch_size=2, seq_len=64, optimizer="adamw-8bit")),
    ("llama", dict(batch_size=2, seq_len=64, optimizer="paged-adamw-8bit", precision="bf16")),
    ("llama", dict(batch_size=2, seq_len=64, optimizer="paged-adamw-32bit", precision="bf16")),
    ("llama", dict(batch_size=2, seq_len=64, precision="bf16-master")),
    ("llama", dict(batch_size=2, seq_len=64, precision="bf16", optimizer="adafactor")),
    ("llama", dict(batch_size=4, seq_len=256, gradient_checkpointing=True)),
    ("llama", dict(batch_size=4, seq_len=256, method="lora", precision="bf16-mixed")),
    ("llama", dict(batch_size=4, seq_len=256, method="lora", precision="bf16")),
    (
        "llama",
        dict(
            batch_size=4,
            seq_len=256,
            method="lora",
            precision="bf16-mixed",
            lora_targets="all-linear",
        ),
    ),
    ("llama", dict(batch_size=1, seq_len=512, method="lora", lora_dtype="bf16", precision="bf16")),
    ("llama", dict(batch_size=4, seq_len=256, method="qlora", precision="bf16-mixed")),
    (
        "llama",
        dict(
            batch_size=4, seq_len=256, method="qlora", precision="bf16", gradient_checkpointing=True
        ),
    ),
    ("llama", dict(batch_size=4, seq_len=256, gradient_accumulation=2)),
    ("llama", dict(batch_size=16, seq_len=128, precision="fp32", optimizer="sgd")),
    (
        "llama",
        dict(
            batch_size=4,
            seq_len=256,
            attention="eager",
            precision="bf16",
            gradient_checkpointing=True,
        ),
    ),
    ("llama", dict(batch_size=2, seq_len=128, n_gpus=2)),
    ("llama", dict(batch_size=2, seq_len=128, n_gpus=4, zero_stage=1)),
    ("llama", dict(batch_size=2, seq_len=128, n_gpus=4, zero_stage=2)),
    ("llama", dict(batch_size=2, seq_len=128, n_gpus=4, zero_stage=3)),
    (
        "llama",
        dict(
            batch_size=2, seq_len=128, n_gpus=4, zero_stage=2, method="lora", precision="bf16-mixed"
        ),
    ),
    (
        "llama",
        dict(
            batch_size=2,
            seq_len=128,
            n_gpus=2,
            zero_stage=3,
            method="lora",
            precision="bf16-mixed",
            gradient_checkpointing=True,
        ),
    ),
    ("qwen", dict(batch_size=4, seq_len=256)),
    ("qwen", dict(batch_size=4, seq_len=128, attention="eager")),
    (
        "qwen",
        dict(
            batch_size=2,
            seq_len=256,
            precision="fp16-mixed",
            method="lora",
            lora_targets="all-linear",
        ),
    ),
    ("qwen", dict(batch_size=8, seq_len=128, precision="bf16", gradient_checkpointing=True)),
    (
        "qwen",
        dict(
            batch_size=8,
            seq_len=128,
            method="lora",
            precision="bf16-mixed",
            gradient_checkpointing=True,
        ),
    ),
    (
        "qwen",
        dict(
            batch_size=4,
            seq_len=256,
            method="qlora",
            precision="bf16-mixed",
            double_quant=False,
            optimizer="adamw-8bit",
        ),
    ),
    ("qwen", dict(batch_size=2, seq_len=128, n_gpus=8, zero_stage=3, precision="bf16")),
    ("qwen", dict(batch_size=2, seq_len=128, n_gpus=2, zero_stage=2, offload_optimizer=True)),
    ("gpt2", dict(batch_size=2, seq_len=64)),
    ("gpt2", dict(batch_size=4, seq_len=256)),
    ("gpt2", dict(batch_size=4, seq_len=256, precision="bf16")),
    ("gpt2", dict(batch_size=2, seq_len=128, attention="eager")),
    (
        "gpt2",
        dict(
            batch_size=4,
            seq_len=128,
            method="lora",
            precision="bf16-mixed",
            lora_targets=("c_attn",),
        ),
    ),
    (
        "gpt2",
        dict(
            batch_size=4,
            seq_len=128,
            method="qlora",
            precision="bf16-mixed",
            lora_targets="all-linear",
        ),
    ),
    ("gpt2", dict(batch_size=4, seq_len=256, gradient_checkpointing=True, optimizer="adafactor")),
    ("gpt2", dict(batch_size=4, seq_len=128, precision="fp32", optimizer="lion")),
    ("gpt2", dict(batch_size=2, seq_len=512, precision="bf16-master", optimizer="adamw-fused")),
    ("gpt2", dict(batch_size=2, seq_len=128, n_gpus=4, zero_stage=1, optimizer="adafactor")),
    ("llama4", dict(batch_size=4, seq_len=256)),
    (
        "llama4",
        dict(
            batch_size=2,
            seq_len=512,
            method="lora",
            precision="bf16-mixed",
            lora_targets="all-linear",
            gradient_checkpointing=True,
        ),
    ),
    # ZeRO-3 with a "-mixed" precision: FSDP's mixed precision (layers gathered in 16 bits)
    (
        "llama",
        dict(
            batch_size=2, seq_len=128, n_gpus=4, zero_stage=3, precision="fp16-mixed", method="lora"
        ),
    ),
    ("qwen", dict(batch_size=4, seq_len=256, n_gpus=2, zero_stage=3)),
    ("gpt2", dict(batch_size=2, seq_len=128, n_gpus=2, zero_stage=3)),
    (
        "gpt2",
        dict(
            batch_size=2, seq_len=128, n_gpus=2, zero_stage=3, method="lora", precision="bf16-mixed"
        ),
    ),
    (
        "llama4",
        dict(batch_size=2, seq_len=256, n_gpus=4, zero_stage=3, gradient_checkpointing=True),
    ),
    ("wide", dict(batch_size=1, seq_len=64, n_gpus=4, zero_stage=3)),
    ("wide", dict(batch_size=1, seq_len=128, n_gpus=3, zero_stage=3)),
    ("wide", dict(batch_size=2, seq_len=256, n_gpus=2, zero_stage=3, optimizer="adamw-fused")),
    (
        "wide",
        dict(
            batch_size=1, seq_len=128, n_gpus=4, zero_stage=3, method="lora", precision="bf16-mixed"
        ),
    ),
    ("wide", dict(batch_size=4, seq_len=512, n_gpus=2, zero_stage=3)),
    # ZeRO-3 without mixed precision, where the layer-by-layer gathers decide the peak
    ("wide", dict(batch_size=1, seq_len=64, n_gpus=8, zero_stage=3, precision="bf16")),
    ("wide", dict(batch_size=1, seq_len=64, n_gpus=4, zero_stage=3, precision="fp32")),
    # GPT-2 has no q_proj/v_proj: LoRA's default targets become peft's default, c_attn
    ("gpt2", dict(batch_size=4, seq_len=128, method="lora", precision="bf16-mixed")),
    # checkpointing where the activations outweigh the logits: the peak is inside a layer's
    # backward (its recomputation, its MLP's backward), in the first layer or the last
    ("wide", dict(batch_size=4, seq_len=512, gradient_checkpointing=True, precision="bf16")),
    ("wide", dict(batch_size=4, seq_len=512, gradient_checkpointing=True)),
    (
        "wide",
        dict(
            batch_size=4,
            seq_len=512,
            gradient_checkpointing=True,
            method="lora",
            precision="bf16-mixed",
        ),
    ),
    ("wide", dict(batch_size=4, seq_len=512, n_gpus=2, zero_stage=3, gradient_checkpointing=True)),
    (
        "wide",
        dict(
            batch_size=4,
            seq_len=512,
            gradient_checkpointing=True,
            method="lora",
            lora_targets="all-linear",
            precision="bf16",
        ),
    ),
    (
        "wide",
        dict(
            batch_size=2,
            seq_len=512,
            gradient_checkpointing=True,
            method="qlora",
            precision="bf16-mixed",
            lora_targets="all-linear",
        ),
    ),
    ("wgpt2", dict(batch_size=4, seq_len=512, gradient_checkpointing=True)),
    (
        "wgpt2",
        dict(
            batch_size=4,
            seq_len=512,
            gradient_checkpointing=True,
            method="lora",
            precision="bf16-mixed",
        ),
    ),
    # peft's lora_dropout (recipes use 0.05-0.1): a dropped-out copy of each adapted input
    # and its mask
    (
        "llama",
        dict(batch_size=4, seq_len=256, method="lora", precision="bf16-mixed", lora_dropout=0.1),
    ),
    (
        "llama",
        dict(
            batch_size=4,
            seq_len=256,
            method="lora",
            precision="bf16",
            lora_targets="all-linear",
            lora_dropout=0.1,
        ),
    ),
    (
        "qwen",
        dict(
            batch_size=2,
            seq_len=256,
            precision="fp16-mixed",
            method="lora",
            lora_targets="all-linear",
            lora_dropout=0.05,
        ),
    ),
    (
        "gpt2",
        dict(batch_size=4, seq_len=128, method="lora", precision="bf16-mixed", lora_dropout=0.1),
    ),
    (
        "wide",
        dict(
            batch_size=4,
            seq_len=512,
            gradient_checkpointing=True,
            method="lora",
            lora_targets="all-linear",
            precision="bf16",
            lora_dropout=0.1,
        ),
    ),
    (
        "wide",
        dict(
            batch_size=2,
            seq_len=512,
            gradient_checkpointing=True,
            method="qlora",
            precision="bf16-mixed",
            lora_targets="all-linear",
            lora_dropout=0.1,
        ),
    ),
    # bitsandbytes before 0.43.2: each 4-bit layer kept its input (past checkpointing too)
    (
        "llama",
        dict(
            batch_size=4,
            seq_len=256,
            method="qlora",
            precision="bf16-mixed",
            bitsandbytes="before-0.43.2",
        ),
    ),
    (
        "llama",
        dict(
            batch_size=4,
            seq_len=256,
            method="qlora",
            precision="bf16",
            gradient_checkpointing=True,
            bitsandbytes="before-0.43.2",
        ),
    ),
    (
        "gpt2",
        dict(
            batch_size=4,
            seq_len=128,
            method="qlora",
            precision="bf16-mixed",
            lora_targets="all-linear",
            bitsandbytes="before-0.43.2",
        ),
    ),
    # activation offloading (save_on_cpu) with checkpointing: the saved layer inputs go to the
    # host; the peak at the loss, inside a recomputed layer, or at the optimizer step
    (
        "llama",
        dict(batch_size=4, seq_len=256, gradient_checkpointing=True, activation_offload=True),
    ),
    (
        "llama",
        dict(
            batch_size=4,
            seq_len=256,
            method="lora",
            precision="bf16-mixed",
            gradient_checkpointing=True,
            activation_offload=True,
        ),
    ),
    (
        "llama",
        dict(
            batch_size=4,
            seq_len=256,
            method="qlora",
            precision="bf16-mixed",
            gradient_checkpointing=True,
            activation_offload=True,
        ),
    ),
    (
        "qwen",
        dict(
            batch_size=8,
            seq_len=128,
            precision="fp32",
            gradient_checkpointing=True,
            activation_offload=True,
        ),
    ),
    ("gpt2", dict(batch_size=4, seq_len=256, gradient_checkpointing=True, activation_offload=True)),
    (
        "llama",
        dict(
            batch_size=2,
            seq_len=128,
            n_gpus=4,
            zero_stage=2,
            gradient_checkpointing=True,
            activation_offload=True,
        ),
    ),
    (
        "wide",
        dict(
            batch_size=4,
            seq_len=512,
            precision="bf16",
            gradient_checkpointing=True,
            activation_offload=True,
        ),
    ),
    (
        "wide",
        dict(
            batch_size=4,
            seq_len=512,
            method="lora",
            precision="bf16-mixed",
            lora_targets="all-linear",
            gradient_checkpointing=True,
            activation_offload=True,
        ),
    ),
    (
        "wgpt2",
        dict(
            batch_size=4,
            seq_len=512,
            method="lora",
            precision="bf16-mixed",
            gradient_checkpointing=True,
            activation_offload=True,
        ),
    ),
    # the optimizer step in backward (one optimizer per parameter, stepped by a hook that
    # then frees the gradient): no gradient kept, one tensor's step temporaries at a time
    ("llama", dict(batch_size=4, seq_len=256, optimizer_in_backward=True)),
    (
        "llama",
        dict(
            batch_size=4,
            seq_len=256,
            method="lora",
            precision="bf16-mixed",
            optimizer_in_backward=True,
        ),
    ),
    ("wide", dict(batch_size=1, seq_len=128, optimizer_in_backward=True)),
    (
        "wide",
        dict(
            batch_size=1,
            seq_len=128,
            precision="bf16",
            optimizer="adamw-forloop",
            optimizer_in_backward=True,
        ),
    ),
    (
        "wide",
        dict(
            batch_size=1,
            seq_len=64,
            precision="fp32",
            optimizer="adafactor",
            optimizer_in_backward=True,
        ),
    ),
    (
        "wide",
        dict(
            batch_size=2,
            seq_len=256,
            precision="bf16",
            gradient_checkpointing=True,
            optimizer_in_backward=True,
        ),
    ),
    ("wide", dict(batch_size=1, seq_len=128, precision="bf16-master", optimizer_in_backward=True)),
    (
        "wide",
        dict(
            batch_size=1,
            seq_len=128,
            method="qlora",
            precision="bf16-mixed",
            lora_targets="all-linear",
            optimizer_in_backward=True,
        ),
    ),
    ("gpt2", dict(batch_size=2, seq_len=128, precision="fp32", optimizer_in_backward=True)),
    (
        "wgpt2",
        dict(
            batch_size=1,
            seq_len=128,
            precision="bf16",
            optimizer="lion",
            optimizer_in_backward=True,
        ),
    ),
    ("qwen", dict(batch_size=2, seq_len=64, optimizer="adamw-8bit", optimizer_in_backward=True)),
    # chunked cross-entropy (torchtune's CEWithChunkedOutputLoss): one chunk's fp32 logits at
    # a time; with autocast a frozen lm_head is cast, and saved, once per chunk
    ("llama", dict(batch_size=4, seq_len=256, loss="chunked")),
    (
        "llama",
        dict(batch_size=4, seq_len=256, method="lora", precision="bf16-mixed", loss="chunked"),
    ),
    (
        "llama",
        dict(batch_size=4, seq_len=256, method="qlora", precision="bf16-mixed", loss="chunked"),
    ),
    ("llama", dict(batch_size=4, seq_len=256, precision="fp32", loss="chunked")),
    ("llama", dict(batch_size=4, seq_len=250, loss="chunked", loss_chunks=3)),
    (
        "llama",
        dict(
            batch_size=8,
            seq_len=512,
            precision="bf16",
            loss="chunked",
            loss_chunks=16,
            gradient_checkpointing=True,
        ),
    ),
    (
        "qwen",
        dict(
            batch_size=4, seq_len=256, precision="bf16", gradient_checkpointing=True, loss="chunked"
        ),
    ),
    ("gpt2", dict(batch_size=4, seq_len=256, loss="chunked")),
    ("llama", dict(batch_size=4, seq_len=256, loss="chunked", optimizer_in_backward=True)),
    ("llama", dict(batch_size=4, seq_len=256, loss="chunked", gradient_accumulation=2)),
    # LoRA outside the decoder layers: on the output head (LitGPT's lora_head) its A takes
    # the last hidden state and the logits get a gradient path through B; on the embeddings
    # (peft's LoRA Embedding) the first layer's input needs a gradient
    (
        "llama",
        dict(
            batch_size=4,
            seq_len=256,
            method="lora",
            precision="bf16",
            lora_targets=["q_proj", "v_proj", "lm_head"],
        ),
    ),
    (
        "llama",
        dict(
            batch_size=4,
            seq_len=256,
            method="lora",
            precision="bf16",
            lora_targets=["q_proj", "v_proj", "embed_tokens"],
        ),
    ),
    (
        "llama",
        dict(
            batch_size=4,
            seq_len=256,
            method="lora",
            precision="bf16-mixed",
            lora_targets=["q_proj", "v_proj", "embed_tokens", "lm_head"],
        ),
    ),
    (
        "qwen",
        dict(
            batch_size=4,
            seq_len=256,
            method="qlora",
            precision="bf16",
            gradient_checkpointing=True,
            lora_targets=["q_proj", "v_proj", "lm_head"],
        ),
    ),
    (
        "llama",
        dict(
            batch_size=4,
            seq_len=256,
            method="lora",
            precision="bf16-mixed",
            loss="chunked",
            lora_targets=["q_proj", "v_proj", "lm_head"],
        ),
    ),
    (
        "llama",
        dict(
            batch_size=4,
            seq_len=256,
            method="lora",
            precision="bf16",
            gradient_checkpointing=True,
            activation_offload=True,
            lora_targets=["q_proj", "v_proj", "lm_head"],
        ),
    ),
    # the chunked loss with activation offloading (torchtune turns both on): each chunk's
    # log-softmax goes to the host as it is made, and lm_head's weight once per chunk
    (
        "llama",
        dict(
            batch_size=4,
            seq_len=256,
            gradient_checkpointing=True,
            activation_offload=True,
            loss="chunked",
        ),
    ),
    (
        "llama",
        dict(
            batch_size=4,
            seq_len=256,
            precision="bf16",
            gradient_checkpointing=True,
            activation_offload=True,
            loss="chunked",
            loss_chunks=4,
        ),
    ),
    (
        "qwen",
        dict(
            batch_size=4,
            seq_len=256,
            method="lora",
            precision="bf16-mixed",
            gradient_checkpointing=True,
            activation_offload=True,
            loss="chunked",
        ),
    ),
    # FSDP with no_sync (the Trainer's way under FSDP): full, unsharded gradients accumulated
    # on each GPU until the last micro-batch reduces them
    (
        "wide",
        dict(
            batch_size=2, seq_len=256, n_gpus=2, zero_stage=3, gradient_accumulation=2, no_sync=True
        ),
    ),
    (
        "wide",
        dict(
            batch_size=2,
            seq_len=256,
            n_gpus=2,
            zero_stage=3,
            gradient_accumulation=2,
            precision="bf16",
            no_sync=True,
        ),
    ),
    (
        "wide",
        dict(
            batch_size=2,
            seq_len=256,
            n_gpus=4,
            zero_stage=3,
            gradient_accumulation=3,
            method="lora",
            precision="bf16-mixed",
            no_sync=True,
        ),
    ),
    (
        "llama",
        dict(
            batch_size=2, seq_len=128, n_gpus=4, zero_stage=3, gradient_accumulation=2, no_sync=True
        ),
    ),
    (
        "wide",
        dict(
            batch_size=1,
            seq_len=128,
            n_gpus=4,
            zero_stage=3,
            gradient_accumulation=2,
            gradient_checkpointing=True,
            no_sync=True,
        ),
    ),
    ("llama", dict(batch_size=2, seq_len=128, n_gpus=2, gradient_accumulation=2, no_sync=True)),
    # bf16 adapters under FSDP's mixed precision: the kept gradients are fp32 (reduce dtype)
    (
        "wide",
        dict(
            batch_size=2,
            seq_len=128,
            n_gpus=2,
            zero_stage=3,
            gradient_accumulation=2,
            method="lora",
            precision="bf16-mixed",
            lora_dtype="bf16",
            no_sync=True,
        ),
    ),
    # one layer: the forward of the last micro-batch, beside the full gradients, is the peak
    (
        "one",
        dict(
            batch_size=2,
            seq_len=128,
            n_gpus=2,
            zero_stage=3,
            gradient_accumulation=2,
            gradient_checkpointing=True,
            no_sync=True,
        ),
    ),
]


# ZeRO-3 as FSDP1 (fsdp_version=1): flat parameters per decoder layer and the root,
# use_orig_params, measured with PyTorch's FullyShardedDataParallel; full fine-tuning and LoRA,
# mixed and pure bf16, 2, 3 and 4 GPUs, with and without no_sync
FSDP1 = dict(zero_stage=3, fsdp_version=1)
FSDP1_ROWS = [
    ("wide", dict(batch_size=2, seq_len=256, n_gpus=2, **FSDP1)),
    ("wide", dict(batch_size=2, seq_len=256, n_gpus=4, precision="bf16", **FSDP1)),
    (
        "wide",
        dict(batch_size=2, seq_len=256, n_gpus=2, method="lora", precision="bf16-mixed", **FSDP1),
    ),
    (
        "wide",
        dict(
            batch_size=2,
            seq_len=256,
            n_gpus=4,
            method="lora",
            precision="bf16",
            lora_dtype="bf16",
            **FSDP1,
        ),
    ),
    ("wide", dict(batch_size=4, seq_len=512, n_gpus=2, gradient_checkpointing=True, **FSDP1)),
    (
        "wide",
        dict(
            batch_size=4,
            seq_len=512,
            n_gpus=4,
            method="lora",
            precision="bf16-mixed",
            gradient_checkpointing=True,
            **FSDP1,
        ),
    ),
    ("wide", dict(batch_size=1, seq_len=128, n_gpus=3, precision="fp32", **FSDP1)),
    ("wide", dict(batch_size=2, seq_len=256, n_gpus=2, gradient_accumulation=2, **FSDP1)),
    ("llama", dict(batch_size=2, seq_len=128, n_gpus=4, **FSDP1)),
    (
        "llama",
        dict(batch_size=2, seq_len=128, n_gpus=2, method="lora", precision="bf16-mixed", **FSDP1),
    ),
    (
        "qwen",
        dict(
            batch_size=4,
            seq_len=256,
            n_gpus=2,
            method="lora",
            precision="bf16",
            lora_dtype="bf16",
            **FSDP1,
        ),
    ),
    ("gpt2", dict(batch_size=2, seq_len=128, n_gpus=2, **FSDP1)),
    (
        "wide",
        dict(batch_size=2, seq_len=256, n_gpus=2, gradient_accumulation=2, no_sync=True, **FSDP1),
    ),
    (
        "wide",
        dict(
            batch_size=2,
            seq_len=256,
            n_gpus=4,
            gradient_accumulation=3,
            precision="bf16",
            no_sync=True,
            **FSDP1,
        ),
    ),
    (
        "wide",
        dict(
            batch_size=2,
            seq_len=256,
            n_gpus=2,
            gradient_accumulation=2,
            method="lora",
            precision="bf16-mixed",
            no_sync=True,
            **FSDP1,
        ),
    ),
    (
        "wide",
        dict(
            batch_size=2,
            seq_len=256,
            n_gpus=4,
            gradient_accumulation=3,
            method="lora",
            precision="bf16",
            lora_dtype="bf16",
            no_sync=True,
            **FSDP1,
        ),
    ),
    (
        "wide",
        dict(
            batch_size=1,
            seq_len=256,
            n_gpus=4,
            gradient_accumulation=2,
            method="lora",
            precision="bf16",
            lora_dtype="bf16",
            gradient_checkpointing=True,
            no_sync=True,
            **FSDP1,
        ),
    ),
    (
        "llama",
        dict(batch_size=2, seq_len=128, n_gpus=4, gradient_accumulation=2, no_sync=True, **FSDP1),
    ),
]

# the chunked loss with activation offloading in pure bf16 (fp32) LoRA/QLoRA, torchtune's LoRA
# recipes: the decoder's saved tensors go to the host, lm_head's and the loss's stay (as the
# recipes' no-op region and their loss outside the offloading context keep them), and every
# chunk's logit gradient waits for lm_head's backward
_CHUNKED_OFFLOAD = dict(
    batch_size=4, seq_len=256, gradient_checkpointing=True, activation_offload=True, loss="chunked"
)
CHUNKED_OFFLOAD_ROWS = [
    ("llama", dict(_CHUNKED_OFFLOAD, method="lora", precision="bf16")),
    ("qwen", dict(_CHUNKED_OFFLOAD, method="lora", precision="bf16")),
    ("gpt2", dict(_CHUNKED_OFFLOAD, method="lora", precision="bf16")),
    ("llama", dict(_CHUNKED_OFFLOAD, method="qlora", precision="bf16", lora_dtype="bf16")),
    ("llama", dict(_CHUNKED_OFFLOAD, method="lora", precision="fp32")),
    (
        "llama",
        dict(
            _CHUNKED_OFFLOAD,
            method="lora",
            precision="bf16",
            loss_chunks=4,
            lora_targets=["q_proj", "v_proj", "lm_head"],
        ),
    ),
    (
        "llama",
        dict(
            _CHUNKED_OFFLOAD,
            method="lora",
            precision="bf16-mixed",
            loss_chunks=4,
            lora_targets=["q_proj", "v_proj", "lm_head"],
        ),
    ),
    ("wide", dict(_CHUNKED_OFFLOAD, method="lora", precision="bf16", batch_size=2, seq_len=512)),
    ("llama", dict(_CHUNKED_OFFLOAD, method="lora", precision="bf16", batch_size=1, seq_len=1024)),
]


# torch.compile of each decoder layer (pure bf16, as torchtune's compiled recipes): the
# layers keep AOTAutograd's partitioner's saved tensors.
# Heads wider than hidden / n_heads (as Mistral Nemo's, Gemma's and Qwen 3's) tell the query
# width from the hidden width.
COMPILE_SPECS = {
    "mistral_hd": _family_spec("mistral", head_dim=64),
    "gemma_hd": _family_spec("gemma", head_dim=64),
    "qwen3_hd": _family_spec("qwen3", head_dim=64),
}
SPECS.update(COMPILE_SPECS)
COMPILE_ROWS = [
    (family, dict(batch_size=batch, seq_len=seq, precision="bf16", compile=True, **method))
    for family, batch, seq in (
        ("llama", 4, 256),
        ("wide", 2, 512),
        ("qwen", 4, 256),
        ("mistral_hd", 4, 256),
        ("qwen3", 4, 256),
        ("qwen3_hd", 2, 512),
        ("gemma_hd", 4, 256),
        ("phi3", 4, 256),
        ("olmo2", 4, 256),
        ("smollm3", 4, 256),
        ("granite", 4, 256),
    )
    for method in ({}, dict(method="lora"))
]
# bf16 autocast over fp32 weights: the compiled layers save autocast's bf16 copies of their
# weights (counted as eager mode's weight copies) beside their per-token tensors
COMPILE_ROWS += [
    (family, dict(batch_size=batch, seq_len=seq, precision="bf16-mixed", compile=True, **method))
    for family, batch, seq in (
        ("llama", 4, 256),
        ("wide", 2, 512),
        ("mistral_hd", 4, 256),
        ("qwen3_hd", 4, 256),
        ("gemma_hd", 4, 256),
        ("phi3", 4, 256),
        ("olmo2", 4, 256),
    )
    for method in ({}, dict(method="lora"))
]
# LoRA with gradient checkpointing around each compiled layer (torchtune's order): each layer
# keeps its input, its backward runs the compiled forward again; where the layers decide the
# peak (wide, 4 x 512 and 2 x 1024 tokens) and where the logits do
COMPILE_ROWS += [
    (
        family,
        dict(
            batch_size=batch,
            seq_len=seq,
            precision="bf16",
            compile=True,
            method="lora",
            gradient_checkpointing=True,
        ),
    )
    for family, batch, seq in (
        ("wide", 4, 512),
        ("wide", 2, 1024),
        ("llama", 4, 256),
        ("qwen3_hd", 2, 512),
        ("phi3", 4, 256),
        ("olmo2", 4, 256),
        ("granite", 4, 256),
    )
]

# compile=True with the chunked loss: torchtune's compile_loss compiles each chunk's
# cross-entropy, which keeps the chunk's logits and no fp32 log-softmax; in full fine-tuning
# lm_head's backward then sums its weight gradients beside every chunk's logit gradient, and
# without checkpointing the compiled layers' backward graphs hold their own moments
_COMPILED_CHUNKED = dict(precision="bf16", compile=True, loss="chunked")
COMPILE_ROWS += [
    ("llama", dict(_COMPILED_CHUNKED, batch_size=4, seq_len=256)),
    ("llama", dict(_COMPILED_CHUNKED, batch_size=4, seq_len=256, method="lora")),
    (
        "llama",
        dict(
            _COMPILED_CHUNKED,
            batch_size=2,
            seq_len=512,
            method="lora",
            gradient_checkpointing=True,
        ),
    ),
    ("wide", dict(_COMPILED_CHUNKED, batch_size=2, seq_len=512)),
    ("qwen", dict(_COMPILED_CHUNKED, batch_size=4, seq_len=256, loss_chunks=4)),
    ("llama", dict(_COMPILED_CHUNKED, batch_size=4, seq_len=256, precision="bf16-mixed")),
    (
        "llama",
        dict(_COMPILED_CHUNKED, batch_size=4, seq_len=256, precision="bf16-mixed", method="lora"),
    ),
    ("gemma_hd", dict(_COMPILED_CHUNKED, batch_size=4, seq_len=256)),
    ("qwen3", dict(_COMPILED_CHUNKED, batch_size=1, seq_len=1024, method="lora", loss_chunks=16)),
]


# checkpointing around compiled layers in full fine-tuning and bf16-mixed, the optimizer step
# in backward and activation offloading with compiled layers (torchtune's later README rows):
# each compiled layer's backward graph frees its saved tensors after their last use, as
# inductor's code does, and under checkpointing the tensors its forward made again
_CK = dict(compile=True, gradient_checkpointing=True)
_LLAMA_CK = dict(_CK, batch_size=4, seq_len=256, precision="bf16")
_WIDE_CK = dict(_CK, batch_size=4, seq_len=512, precision="bf16")
COMPILE_ROWS += [
    ("wide", _WIDE_CK),
    ("llama", _LLAMA_CK),
    ("qwen3_hd", dict(_CK, batch_size=2, seq_len=512, precision="bf16")),
    ("gemma_hd", dict(_LLAMA_CK)),
    ("wide", dict(_CK, batch_size=4, seq_len=512, precision="bf16-mixed")),
    ("phi3", dict(_CK, batch_size=4, seq_len=256, precision="bf16-mixed")),
    ("wide", dict(_CK, batch_size=4, seq_len=512, precision="bf16-mixed", method="lora")),
    ("llama", dict(_CK, batch_size=4, seq_len=256, precision="bf16-mixed", method="lora")),
    ("llama", dict(_LLAMA_CK, loss="chunked")),
    ("wide", dict(_CK, batch_size=2, seq_len=1024, precision="bf16", loss="chunked")),
    (
        "llama",
        dict(compile=True, batch_size=4, seq_len=256, precision="bf16", optimizer_in_backward=True),
    ),
    ("wide", dict(_WIDE_CK, optimizer_in_backward=True)),
    ("llama", dict(_LLAMA_CK, loss="chunked", optimizer_in_backward=True)),
    ("llama", dict(_LLAMA_CK, activation_offload=True)),
    ("wide", dict(_WIDE_CK, method="lora", activation_offload=True)),
    ("llama", dict(_LLAMA_CK, loss="chunked", activation_offload=True, optimizer_in_backward=True)),
    ("llama", dict(_LLAMA_CK, loss="chunked", method="lora", activation_offload=True)),
]


# compiled layers on several GPUs: DDP, ZeRO-1 and ZeRO-3 (FSDP2, each layer compiled over its
# gathered weights; FSDP's mixed precision gathers them in bf16 and runs without autocast);
# ZeRO-3 with the chunked loss, which runs through the model's own call so that FSDP2's root
# gathers the embeddings and the head
_SHARDED = dict(precision="bf16", compile=True, n_gpus=2, zero_stage=3)
COMPILE_ROWS += [
    ("wide", dict(_SHARDED, batch_size=2, seq_len=512)),
    ("wide", dict(_SHARDED, batch_size=2, seq_len=512, gradient_checkpointing=True)),
    ("wide", dict(_SHARDED, batch_size=2, seq_len=512, precision="bf16-mixed")),
    ("wide", dict(_SHARDED, batch_size=2, seq_len=512, loss="chunked")),
    ("wide", dict(_SHARDED, batch_size=2, seq_len=512, zero_stage=1)),
    ("wide", dict(_SHARDED, batch_size=2, seq_len=512, zero_stage=0)),
    (
        "wide",
        dict(
            _SHARDED,
            batch_size=2,
            seq_len=512,
            n_gpus=4,
            method="lora",
            gradient_checkpointing=True,
        ),
    ),
    ("qwen3_hd", dict(_SHARDED, batch_size=2, seq_len=512)),
    ("llama", dict(_SHARDED, batch_size=4, seq_len=256, n_gpus=4, method="lora")),
]
GRID += [
    (
        "wide",
        dict(batch_size=2, seq_len=512, precision="bf16", n_gpus=2, zero_stage=3, loss="chunked"),
    )
]

# the chunked loss with activation offloading where the logits decide the peak (a vocabulary
# 128 times the hidden size): every chunk's loss is differentiated first, then lm_head's
# backward takes the chunks one by one (in full fine-tuning summing the weight's gradients);
# a compiled loss's backward releases the logits each chunk kept
SPECS["llama_vocab"] = replace(SPECS["llama"], name="tiny-llama-32k-vocab", vocab_size=32768)
_HEAD_OFFLOAD = dict(
    batch_size=2,
    seq_len=512,
    loss="chunked",
    gradient_checkpointing=True,
    activation_offload=True,
)
HEAD_OFFLOAD_ROWS = [
    ("llama_vocab", dict(_HEAD_OFFLOAD, precision="bf16")),
    ("llama_vocab", dict(_HEAD_OFFLOAD, precision="bf16-mixed")),
    ("llama_vocab", dict(_HEAD_OFFLOAD, precision="bf16", compile=True)),
    (
        "llama_vocab",
        dict(_HEAD_OFFLOAD, precision="bf16", compile=True, optimizer_in_backward=True),
    ),
    ("llama_vocab", dict(_HEAD_OFFLOAD, precision="bf16", compile=True, method="lora")),
    ("llama_vocab", dict(_HEAD_OFFLOAD, precision="bf16", method="lora", loss_chunks=4)),
]

GRID += FAMILY_ROWS
GRID += MOE_ROWS
GRID += GPT_OSS_ROWS
GRID += LAYER_TYPE_ROWS
GRID += FSDP1_ROWS
GRID += CHUNKED_OFFLOAD_ROWS
GRID += MOE_WIDE_ROWS
GRID += MOE_QLORA_ROWS
GRID += MOE_ZERO3_ROWS
GRID += EXPERT_LORA_ROWS
GRID += COMPILE_ROWS
GRID += HEAD_OFFLOAD_ROWS


def _id(case: tuple[str, dict]) -> str:
    family, kw = case
    return family + "-" + "-".join(f"{k}={v}" for k, v in kw.items())


class _Results(dict[str, tuple]):
    """Each configuration measured once per session, with its estimate, when first asked for
    (so that a selection of the grid measures only its own rows).

    Under pytest-xdist the workers share the measurements through ``shared`` (a folder of the
    session's temporary directory): the first worker to ask for a row measures it while holding
    that row's lock and stores the report; a worker asking later (another test of the row, or
    the median over the whole grid) waits for the lock and reads it. The estimate, cheap and
    deterministic, is computed where it is asked for."""

    def __init__(self, shared: Path | None = None) -> None:
        super().__init__()
        self._shared = shared

    def __missing__(self, key: str) -> tuple:
        family, kw = next(case for case in GRID if _id(case) == key)
        measured = self._measured(key, family, kw)
        estimated = lessonkit.estimate(SPECS[family], device="cpu", **kw)
        self[key] = (measured, estimated)
        return self[key]

    def _measured(self, key: str, family: str, kw: dict):
        if self._shared is None:
            return lessonkit.measure(SPECS[family], device="cpu", **kw)
        import fcntl

        name = hashlib.sha256(key.encode()).hexdigest()
        stored = self._shared / f"{name}.pickle"
        with open(self._shared / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if stored.exists():
                return pickle.loads(stored.read_bytes())
            measured = lessonkit.measure(SPECS[family], device="cpu", **kw)
            try:
                data = pickle.dumps(measured)
            except (pickle.PicklingError, AttributeError, TypeError):
                return measured  # not shareable: a worker asking later measures it again
            partial = stored.with_suffix(".partial")
            partial.write_bytes(data)
            partial.replace(stored)
            return measured


def _rows(cases: list[tuple[str, dict]]) -> list:
    """The rows as parameters, each in the pytest-xdist group of its configuration: with
    --dist loadgroup a row's checks run on one worker, after one measurement."""
    return [pytest.param(c, id=_id(c), marks=pytest.mark.xdist_group(_id(c))) for c in cases]


def _shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """The folder the pytest-xdist workers of one session share (None without xdist, or
    without POSIX file locks)."""
    if "PYTEST_XDIST_WORKER" not in os.environ or os.name != "posix":
        return None
    # each worker's base temporary directory is a folder of the session's
    folder = tmp_path_factory.getbasetemp().parent / "accuracy-measurements"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    return _Results(_shared_folder(tmp_path_factory))


def _error(measured, estimated) -> float:
    return (estimated.tensor_bytes - measured.tensor_bytes) / measured.tensor_bytes


def test_grid_covers_what_it_claims() -> None:
    from lessonkit.options import METHODS, OPTIMIZERS, PRECISIONS

    assert len(GRID) >= 40
    assert {SPECS[f].family for f, _ in GRID} >= {"llama", "qwen2", "gpt2"}
    assert {kw.get("method", "full") for _, kw in GRID} == set(METHODS)
    assert {kw.get("precision", "bf16-mixed") for _, kw in GRID} == set(PRECISIONS)
    assert {kw.get("optimizer", "adamw") for _, kw in GRID} == set(OPTIMIZERS)
    assert {kw.get("zero_stage", 0) for _, kw in GRID} == {0, 1, 2, 3}
    assert {kw.get("gradient_checkpointing", False) for _, kw in GRID} == {True, False}
    assert len({kw.get("batch_size") for _, kw in GRID}) >= 4
    assert len({kw.get("seq_len") for _, kw in GRID}) >= 4
    sharded_mixed = [
        (f, kw)
        for f, kw in GRID
        if kw.get("zero_stage") == 3 and kw.get("precision", "bf16-mixed").endswith("-mixed")
    ]
    assert {kw.get("precision", "bf16-mixed") for _, kw in sharded_mixed} == {
        "bf16-mixed",
        "fp16-mixed",
    }
    assert {kw.get("method", "full") for _, kw in sharded_mixed} == {"full", "lora"}
    assert {SPECS[f].family for f, _ in sharded_mixed} >= {"llama", "qwen2", "gpt2"}
    assert any(
        SPECS[f].family == "gpt2" and kw.get("method") == "lora" and "lora_targets" not in kw
        for f, kw in GRID
    )
    # checkpointing where activations outweigh the logits, for every method and ZeRO-3
    wide_ckpt = [
        kw
        for f, kw in GRID
        if SPECS[f].vocab_size <= 1000
        and kw.get("gradient_checkpointing")
        and kw["batch_size"] * kw["seq_len"] >= 1024
    ]
    assert {kw.get("method", "full") for kw in wide_ckpt} == set(METHODS)
    assert any(kw.get("zero_stage") == 3 for kw in wide_ckpt)
    assert {SPECS[f].family for f, kw in GRID if kw in wide_ckpt} >= {"llama", "gpt2"}
    dropout = [kw for _, kw in GRID if kw.get("lora_dropout")]
    assert {kw["method"] for kw in dropout} == {"lora", "qlora"}
    assert any(kw.get("gradient_checkpointing") for kw in dropout)
    legacy = [kw for _, kw in GRID if kw.get("bitsandbytes") == "before-0.43.2"]
    assert any(kw.get("gradient_checkpointing") for kw in legacy) and len(legacy) >= 3
    offload = [(SPECS[f].family, kw) for f, kw in GRID if kw.get("activation_offload")]
    assert {kw.get("method", "full") for _, kw in offload} == set(METHODS)
    assert {family for family, _ in offload} >= {"llama", "qwen2", "gpt2"}
    in_backward = [(SPECS[f].family, kw) for f, kw in GRID if kw.get("optimizer_in_backward")]
    assert {kw.get("method", "full") for _, kw in in_backward} == set(METHODS)
    assert {family for family, _ in in_backward} >= {"llama", "qwen2", "gpt2"}
    assert len({kw.get("optimizer", "adamw") for _, kw in in_backward}) >= 5
    chunked = [(SPECS[f].family, kw) for f, kw in GRID if kw.get("loss") == "chunked"]
    assert {kw.get("method", "full") for _, kw in chunked} == set(METHODS)
    assert {family for family, _ in chunked} >= {"llama", "qwen2", "gpt2"}
    assert len({kw.get("loss_chunks", 8) for _, kw in chunked}) >= 3
    no_sync = [kw for _, kw in GRID if kw.get("no_sync")]
    assert {kw.get("zero_stage", 0) for kw in no_sync} == {0, 3}
    assert {kw.get("method", "full") for kw in no_sync} >= {"full", "lora"}
    assert {kw.get("precision", "bf16-mixed") for kw in no_sync} >= {"bf16-mixed", "bf16"}
    assert any(kw.get("gradient_checkpointing") for kw in no_sync)
    fsdp1 = [kw for _, kw in GRID if kw.get("fsdp_version") == 1]
    assert {kw.get("method", "full") for kw in fsdp1} == {"full", "lora"}
    assert {kw.get("precision", "bf16-mixed") for kw in fsdp1} >= {"bf16-mixed", "bf16"}
    assert {kw["n_gpus"] for kw in fsdp1} >= {2, 4}
    assert {
        (kw.get("method", "full"), kw.get("precision", "bf16-mixed"))
        for kw in fsdp1
        if kw.get("no_sync")
    } >= {
        ("full", "bf16-mixed"),
        ("full", "bf16"),
        ("lora", "bf16-mixed"),
        ("lora", "bf16"),
    }
    for family in FAMILY_SPECS:
        rows = {
            (kw.get("method", "full"), kw["gradient_checkpointing"])
            for f, kw in GRID
            if f == family and not kw.get("compile")
        }
        assert rows == {(m, c) for m in METHODS for c in (False, True)}, family


@pytest.mark.parametrize("case", _rows(GRID))
def test_weights_gradients_optimizer_exact(results, case) -> None:
    measured, estimated = results[_id(case)]
    m, e = measured.settings["measured"], estimated.settings["estimated"]
    assert e["weight_bytes"] == m["parameter_bytes"] + m["buffer_bytes"]
    assert e["gradient_bytes"] == m["gradient_bytes"]
    assert e["optimizer_bytes"] == m["optimizer_bytes"]
    assert e["trainable_parameters"] == m["trainable_parameters"]
    assert estimated.managed_bytes == measured.managed_bytes  # paged optimizer states


@pytest.mark.parametrize("case", _rows(GRID))
def test_tensor_peak_within_5_percent(results, case) -> None:
    measured, estimated = results[_id(case)]
    assert measured.breakdown["cuda_context"] == estimated.breakdown["cuda_context"] == 0
    error = _error(measured, estimated)
    assert abs(error) <= 0.05, (
        f"estimate {estimated.tensor_bytes:,} vs measured {measured.tensor_bytes:,} "
        f"({error:+.2%}); phases: estimated {estimated.phase_peaks}, "
        f"measured {measured.phase_peaks}"
    )


@pytest.mark.parametrize("case", _rows([c for c in GRID if c[1].get("activation_offload")]))
def test_offloaded_host_bytes_within_12_percent(results, case) -> None:
    """What activation offloading puts in CPU RAM (the assumptions' PCIe time comes from it)
    is approximate: the estimate leaves out a few small saved tensors."""
    measured, estimated = results[_id(case)]
    host = measured.settings["measured"]["offloaded_peak_bytes"]
    error = estimated.settings["estimated"]["offloaded_bytes"] / host - 1
    assert abs(error) <= 0.12, f"{error:+.2%}"


def test_median_error_within_2_percent(results) -> None:
    errors = [abs(_error(*results[_id(case)])) for case in GRID]
    assert statistics.median(errors) <= 0.02


# ----- 7B/8B shapes -----------------------------------------------------------------------
LARGE = [
    ("llama-2-7b", dict(batch_size=1, seq_len=512)),
    (
        "llama-3.1-8b",
        dict(
            batch_size=1,
            seq_len=1024,
            method="qlora",
            precision="bf16-mixed",
            gradient_checkpointing=True,
        ),
    ),
    ("llama-2-7b", dict(batch_size=2, seq_len=512, method="lora", precision="bf16")),
    (
        "llama-2-7b",
        dict(batch_size=1, seq_len=1024, n_gpus=8, zero_stage=3, optimizer="adamw-fused"),
    ),
    # checkpointing on real shapes
    (
        "llama-2-7b",
        dict(
            batch_size=4, seq_len=512, method="qlora", precision="bf16", gradient_checkpointing=True
        ),
    ),
    (
        "llama-2-7b",
        dict(
            batch_size=4, seq_len=1024, method="lora", precision="bf16", gradient_checkpointing=True
        ),
    ),
    ("qwen2.5-0.5b", dict(batch_size=8, seq_len=2048, gradient_checkpointing=True)),
    # the memory savers on a 128k vocabulary, where the logits weigh most
    (
        "llama-3.1-8b",
        dict(
            batch_size=2,
            seq_len=2048,
            method="lora",
            precision="bf16",
            gradient_checkpointing=True,
            activation_offload=True,
        ),
    ),
    ("llama-3.1-8b", dict(batch_size=1, seq_len=512, precision="bf16", optimizer_in_backward=True)),
    (
        "llama-3.1-8b",
        dict(
            batch_size=4,
            seq_len=1024,
            method="qlora",
            precision="bf16",
            gradient_checkpointing=True,
            loss="chunked",
        ),
    ),
]


# torchtune's LoRA recipe at full size: pure bf16, the chunked loss and activation offloading
CHUNKED_OFFLOAD_LARGE = [
    (
        "llama-3.1-8b",
        dict(
            _CHUNKED_OFFLOAD,
            batch_size=2,
            seq_len=1024,
            method="lora",
            precision="bf16",
            lora_dtype="bf16",
        ),
    ),
]
LARGE += CHUNKED_OFFLOAD_LARGE


@pytest.mark.slow
@pytest.mark.parametrize("case", LARGE, ids=lambda c: _id(c))
def test_large_shapes(case) -> None:
    name, kw = case
    measured = lessonkit.measure(name, device="cpu", **kw)
    estimated = lessonkit.estimate(name, device="cpu", **kw)
    m, e = measured.settings["measured"], estimated.settings["estimated"]
    assert e["weight_bytes"] == m["parameter_bytes"] + m["buffer_bytes"]
    assert e["gradient_bytes"] == m["gradient_bytes"]
    assert e["optimizer_bytes"] == m["optimizer_bytes"]
    assert abs(_error(measured, estimated)) <= 0.05
