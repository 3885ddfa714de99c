"""Each block of a decoder layer on its own: its parameters and what it saves for backward.

The parameters a layer's blocks state are exactly the layer's parameter tensors. What a block
says it saves is compared with what transformers' own module saves for backward, counted with
``torch.autograd.graph.saved_tensors_hooks`` (each storage once) on a small real forward.
"""

from __future__ import annotations

import math

import pytest

from lessonkit.memory import activations as acts
from lessonkit.memory import layers
from lessonkit.models.presets import resolve_model
from lessonkit.models.spec import ModelSpec

SPEC = ModelSpec(
    name="tiny-gqa",
    family="llama",
    n_layers=2,
    hidden_size=64,
    n_heads=4,
    n_kv_heads=2,
    intermediate_size=160,
    vocab_size=128,
)
GPT2 = resolve_model("gpt2")


def _context(trains_base: bool = True, attention: str = "sdpa") -> acts.StepContext:
    return acts.StepContext(
        batch_size=2,
        seq_len=8,
        residual_bytes=4,
        compute_bytes=4,
        autocast=False,
        trains_base=trains_base,
        lora_targets=frozenset(),
        adapter_bytes=4,
        lora_rank=8,
        qlora=False,
        attention=attention,
        dropout=0.0,
        cpu_kernels=True,
    )


@pytest.mark.parametrize("spec", [SPEC, GPT2], ids=lambda s: s.family)
def test_the_blocks_own_every_parameter_of_a_layer_once(spec: ModelSpec) -> None:
    layer = layers.decoder_layer(spec)
    names = [t.name for t in layer.parameters(spec)]
    assert sorted(names) == sorted(t.name for t in spec.parameter_tensors().layer)
    assert len(names) == len(set(names))
    outer = layers.Embeddings().parameters(spec) + layers.Head().parameters(spec)
    assert sorted(t.name for t in outer) == sorted(t.name for t in spec.parameter_tensors().outer)


def test_each_block_owns_its_own_part() -> None:
    attention = acts.Attention().parameters(SPEC)
    mlp = acts.DenseMLP().parameters(SPEC)
    norm = acts.RMSNorm("input_layernorm", "n1").parameters(SPEC)
    assert sum(math.prod(t.shape) for t in attention) == 64 * (64 + 32 + 32) + 64 * 64
    assert sum(math.prod(t.shape) for t in mlp) == 3 * 64 * 160
    assert [t.shape for t in norm] == [(64,)]


def _measured_saved(module, *inputs, **kwargs) -> int:
    """Bytes a module's forward saves for backward, each storage counted once, leaving out
    its own parameters (which the weights count)."""
    import torch

    weights = {p.untyped_storage().data_ptr() for p in module.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        module(*inputs, **kwargs)
    return sum(storages.values())


def _input(ctx: acts.StepContext, width: int):
    import torch

    return torch.randn(ctx.batch_size, ctx.seq_len, width, requires_grad=True)


def test_dense_mlp_saves_what_the_llama_mlp_saves() -> None:
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP

    ctx = _context()
    saved = acts.Saved()
    flow = acts.Flow("x", 4, True)
    acts.DenseMLP().forward(saved, ctx, SPEC, 0, flow)
    module = LlamaMLP(SPEC.to_hf_config())
    assert saved.activations == _measured_saved(module, _input(ctx, SPEC.hidden_size))


@pytest.mark.parametrize("trains_base", [True, False])
def test_rmsnorm_saves_what_the_llama_norm_saves(trains_base: bool) -> None:
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    ctx = _context(trains_base)
    saved = acts.Saved()
    acts.RMSNorm("input_layernorm", "n1").forward(saved, ctx, SPEC, 0, acts.Flow("x", 4, True))
    module = LlamaRMSNorm(SPEC.hidden_size)
    module.weight.requires_grad_(trains_base)
    assert saved.activations == _measured_saved(module, _input(ctx, SPEC.hidden_size))


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_attention_saves_what_the_llama_attention_saves(attention: str) -> None:
    pytest.importorskip("transformers")
    import torch
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    ctx = _context(attention=attention)
    saved = acts.Saved()
    acts.Attention().forward(saved, ctx, SPEC, 0, acts.Flow("x", 4, True))
    config = SPEC.to_hf_config()
    config._attn_implementation = attention
    module = LlamaAttention(config, layer_idx=0)
    x = _input(ctx, SPEC.hidden_size)
    # one row of positions, broadcast over the batch, and a causal mask left to the kernel
    # (SDPA then takes the key/value heads as they are): as the model runs its layers
    cos_sin = LlamaRotaryEmbedding(config)(x, torch.arange(ctx.seq_len)[None])
    mask = None
    if attention == "eager":
        mask = torch.full((ctx.seq_len, ctx.seq_len), -math.inf).triu(1)[None, None]
    measured = _measured_saved(module, x, position_embeddings=cos_sin, attention_mask=mask)
    assert saved.activations == measured


@pytest.mark.parametrize("family", ["qwen3", "olmo2", "gemma3", "phi3"])
@pytest.mark.parametrize("trains_base", [True, False])
def test_a_decoder_layer_saves_what_transformers_layer_saves(
    family: str, trains_base: bool
) -> None:
    """The blocks of each 2025 family's layer against its transformers decoder layer, in fp32
    (full fine-tuning) or bf16 with frozen weights; rotary tables given as the model makes
    them (one row, shared by every layer, so left out of both)."""
    pytest.importorskip("transformers")
    import torch
    import transformers

    from tests.memory.test_accuracy import FAMILY_SPECS

    spec = FAMILY_SPECS[family]
    dtype, width = (torch.float32, 4) if trains_base else (torch.bfloat16, 2)
    ctx = acts.StepContext(
        batch_size=2,
        seq_len=32,
        residual_bytes=width,
        compute_bytes=width,
        autocast=False,
        trains_base=trains_base,
        lora_targets=frozenset(),
        adapter_bytes=4,
        lora_rank=8,
        qlora=False,
        attention="sdpa",
        dropout=0.0,
        cpu_kernels=True,
    )
    saved = layers.decoder_layer(spec).saved(spec, ctx, 1, True)
    estimated = saved.activations - sum(b for k, b in saved.items.items() if k.startswith("rope."))
    config = spec.to_hf_config()
    config._attn_implementation = "sdpa"
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    layer = model.model.layers[1]
    layer.requires_grad_(trains_base)
    x = torch.randn(2, 32, spec.hidden_size, dtype=dtype, requires_grad=True)
    positions = torch.arange(32)[None]
    rotary = model.model.rotary_emb
    args = (x, positions, "sliding_attention") if family == "gemma3" else (x, positions)
    cos, sin = rotary(*args)
    measured = _measured_saved(layer, x, position_embeddings=(cos, sin), attention_mask=None)
    rope = cos.untyped_storage().nbytes() + sin.untyped_storage().nbytes()
    assert estimated == measured - rope
