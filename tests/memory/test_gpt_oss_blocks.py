"""gpt-oss's blocks against transformers' own GptOss modules, measured under FakeTensorMode:
the bytes each forward saves for backward (its attention with sinks, eager as gpt-oss trains;
its norm; its biased experts, grouped-GEMM; and the whole decoder layer)."""

from __future__ import annotations

from typing import Any

import pytest

from lessonkit.memory import activations as acts
from lessonkit.memory import layers
from lessonkit.memory.attention_sinks import SinkAttention
from lessonkit.memory.experts import BiasedMoEMLP
from lessonkit.models.spec import ModelSpec

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SHAPES = {
    # grouped-query attention (k and v repeated to every head), top-2 of 8 experts
    "gqa": dict(num_attention_heads=4, num_key_value_heads=2, num_local_experts=8),
    # one key/value head per query head (nothing repeated), top-3 of 4
    "mha": dict(
        num_attention_heads=4, num_key_value_heads=4, num_local_experts=4, num_experts_per_tok=3
    ),
}


def _config(shape: str) -> Any:
    fields = dict(
        hidden_size=64,
        num_hidden_layers=2,
        head_dim=16,
        vocab_size=128,
        intermediate_size=40,
        num_experts_per_tok=2,
        use_cache=False,
    )
    config = transformers.GptOssConfig(**(fields | SHAPES[shape]))
    config._attn_implementation = "eager"
    config._experts_implementation = "grouped_mm"
    return config


def _context(trains: bool, width: int, tokens: int) -> acts.StepContext:
    return acts.StepContext(
        batch_size=2,
        seq_len=tokens // 2,
        residual_bytes=width,
        compute_bytes=width,
        autocast=False,
        trains_base=trains,
        lora_targets=frozenset(),
        adapter_bytes=width,
        lora_rank=8,
        qlora=False,
        attention="eager",
        dropout=0.0,
        cpu_kernels=True,
    )


def _measured(config: Any, part: str, trains: bool, width: int, tokens: int) -> tuple[int, int]:
    """(bytes the part of decoder layer 1 saves for backward, each storage once and its own
    parameters left out; the rotary tables' bytes, made once per forward for every layer)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.multiprocessing import reductions

    dtype = torch.float32 if width == 4 else torch.bfloat16
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    layer = model.model.layers[1]
    module = {
        "layer": layer,
        "attention": layer.self_attn,
        "mlp": layer.mlp,
        "norm": layer.post_attention_layernorm,
    }[part]
    with FakeTensorMode(allow_non_fake_inputs=True):
        model.to_empty(device="cpu")
        module.requires_grad_(trains)
        weights = {reductions.StorageWeakRef(p.untyped_storage()) for p in module.parameters()}
        storages: dict[Any, int] = {}

        def pack(tensor: Any) -> Any:
            storage = reductions.StorageWeakRef(tensor.untyped_storage())
            if storage not in weights:
                storages[storage] = tensor.untyped_storage().nbytes()
            return tensor

        x = torch.randn(2, tokens // 2, config.hidden_size, dtype=dtype, requires_grad=True)
        cos, sin = model.model.rotary_emb(x, torch.arange(tokens // 2)[None])
        kwargs = (
            dict(position_embeddings=(cos, sin), attention_mask=None)
            if part in ("layer", "attention")
            else {}
        )
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            module(x, **kwargs)
        rope = cos.untyped_storage().nbytes() + sin.untyped_storage().nbytes()
    return sum(storages.values()), rope if part in ("layer", "attention") else 0


def _block(part: str) -> Any:
    layer = layers.GPT_OSS_LAYER
    return {
        "attention": layer.branches[0].sublayer,
        "mlp": layer.branches[1].sublayer,
        "norm": layer.branches[1].pre_norm,
    }[part]


# (trains, bytes per element): full fine-tuning and frozen weights in bf16; fp32 for the
# attention and the norm only, as the grouped GEMM runs in bf16 only under FakeTensorMode
CASES = [
    (part, trains, width)
    for part in ("attention", "mlp", "norm", "layer")
    for trains, width in ((True, 2), (False, 2), (True, 4))
    if width == 2 or part in ("attention", "norm")
]


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize(("part", "trains", "width"), CASES)
def test_gpt_oss_blocks_save_what_transformers_modules_save(
    shape: str, part: str, trains: bool, width: int
) -> None:
    config = _config(shape)
    spec = ModelSpec.from_hf_config(config.to_dict())
    tokens = 46
    ctx = _context(trains, width, tokens)
    if part == "layer":
        saved = layers.decoder_layer(spec).saved(spec, ctx, 1, True)
    else:
        saved = acts.Saved()
        out = _block(part).forward(saved, ctx, spec, 1, acts.Flow("x", width, True))
        assert out.needs_grad
    measured, rope = _measured(config, part, trains, width, tokens)
    assert saved.activations == measured
    # the rotary tables are half a head wide (gpt-oss's rotary splits each head in two)
    assert sum(b for k, b in saved.items.items() if k.startswith("rope.")) == rope


def test_the_blocks_own_every_parameter_of_the_gpt_oss_layer() -> None:
    config = _config("gqa")
    spec = ModelSpec.from_hf_config(config.to_dict())
    with torch.device("meta"):
        layer = transformers.AutoModelForCausalLM.from_config(config).model.layers[0]
    stated = {t.name: t.shape for t in layers.decoder_layer(spec).parameters(spec)}
    assert stated == {name: tuple(p.shape) for name, p in layer.named_parameters()}
    assert {t.name for t in SinkAttention().parameters(spec)} >= {"self_attn.sinks"}
    assert {t.name for t in BiasedMoEMLP().parameters(spec)} >= {
        "mlp.router.bias",
        "mlp.experts.gate_up_proj_bias",
        "mlp.experts.down_proj_bias",
    }


def test_nothing_saved_where_nothing_needs_a_gradient() -> None:
    spec = ModelSpec.from_hf_config(_config("gqa").to_dict())
    ctx = _context(False, 2, 16)
    for part in ("attention", "mlp"):
        saved = acts.Saved()
        out = _block(part).forward(saved, ctx, spec, 0, acts.Flow("x", 2, False))
        assert saved.activations == 0 and not out.needs_grad


def test_the_model_trains_with_eager_attention_and_grouped_experts() -> None:
    """What the blocks assume: transformers gives gpt-oss eager attention (it has no SDPA
    path; measure() falls back to it) and the grouped-GEMM experts by default."""
    config = _config("gqa")
    config._attn_implementation = None
    config._experts_implementation = None
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert model.config._attn_implementation == "eager"
    assert model.config._experts_implementation == "grouped_mm"
    with pytest.raises(ValueError, match="attention implementation"), torch.device("meta"):
        transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
