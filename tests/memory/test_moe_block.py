"""The mixture-of-experts MLP block against transformers' own sparse MoE blocks (grouped-GEMM
experts), measured under FakeTensorMode in bf16: the bytes its forward saves for backward."""

from __future__ import annotations

import math
from typing import Any

import pytest

from lessonkit.memory import activations as acts
from lessonkit.memory.experts import MoEMLP
from lessonkit.models.spec import ModelSpec

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SMALL = dict(
    hidden_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=128,
    intermediate_size=96,
)
CASES = {
    "qwen3_moe": (
        "qwen3_moe",
        dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=40),
    ),
    "qwen3_moe_normed": (
        "qwen3_moe",
        dict(num_experts=6, num_experts_per_tok=3, moe_intermediate_size=24, norm_topk_prob=True),
    ),
    "mixtral": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2)),
}


def _block_and_spec(case: str) -> tuple[Any, ModelSpec, MoEMLP]:
    model_type, fields = CASES[case]
    config = transformers.AutoConfig.for_model(model_type, **SMALL, **fields)
    config._experts_implementation = "grouped_mm"
    spec = ModelSpec.from_hf_config(config.to_dict() | {"model_type": model_type})
    if model_type == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

        module_class: Any = MixtralSparseMoeBlock
        block = MoEMLP(normalize_top_k=True, float_weights=True)
    else:
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

        module_class = Qwen3MoeSparseMoeBlock
        block = MoEMLP(normalize_top_k=config.norm_topk_prob)
    with torch.device("meta"):
        module = module_class(config).to(torch.bfloat16)
    return module, spec, block


def _measured_saved(module: Any, tokens: int, trains: bool) -> int:
    """Bytes the module's forward saves for backward under FakeTensorMode, each storage once,
    its own parameters left out."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.multiprocessing import reductions

    with FakeTensorMode(allow_non_fake_inputs=True):
        module.to_empty(device="cpu")
        module.requires_grad_(trains)
        weights = {reductions.StorageWeakRef(p.untyped_storage()) for p in module.parameters()}
        storages: dict[Any, int] = {}

        def pack(tensor: Any) -> Any:
            storage = reductions.StorageWeakRef(tensor.untyped_storage())
            if storage not in weights:
                storages[storage] = tensor.untyped_storage().nbytes()
            return tensor

        hidden = module.gate.weight.shape[1]
        x = torch.randn(2, tokens // 2, hidden, dtype=torch.bfloat16, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            module(x)
    return sum(storages.values())


def _context(tokens: int, trains: bool) -> acts.StepContext:
    return acts.StepContext(
        batch_size=2,
        seq_len=tokens // 2,
        residual_bytes=2,
        compute_bytes=2,
        autocast=False,
        trains_base=trains,
        lora_targets=frozenset({"q_proj", "v_proj"}),
        adapter_bytes=2,
        lora_rank=8,
        qlora=False,
        attention="sdpa",
        dropout=0.0,
        cpu_kernels=True,
    )


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("trains", [True, False], ids=["full", "frozen-experts"])
@pytest.mark.parametrize("tokens", [16, 94])
def test_moe_block_saves_what_transformers_block_saves(
    case: str, trains: bool, tokens: int
) -> None:
    module, spec, block = _block_and_spec(case)
    saved = acts.Saved()
    out = block.forward(saved, _context(tokens, trains), spec, 0, acts.Flow("x", 2, True))
    assert out.needs_grad
    assert saved.activations == _measured_saved(module, tokens, trains)


@pytest.mark.parametrize("case", list(CASES))
def test_moe_block_owns_the_router_and_every_expert(case: str) -> None:
    module, spec, block = _block_and_spec(case)
    stated = {t.name.removeprefix("mlp."): t.shape for t in block.parameters(spec)}
    named = {name: tuple(p.shape) for name, p in module.named_parameters()}
    assert stated == named
    total = sum(math.prod(shape) for shape in stated.values())
    assert total == sum(p.numel() for p in module.parameters())


def test_nothing_saved_when_nothing_needs_a_gradient() -> None:
    _, spec, block = _block_and_spec("qwen3_moe")
    saved = acts.Saved()
    out = block.forward(saved, _context(16, False), spec, 0, acts.Flow("x", 2, False))
    assert saved.activations == 0 and not out.needs_grad


def _real_step_peak(monkeypatch: pytest.MonkeyPatch, spec: ModelSpec, skewed: bool) -> int:
    """The tensor peak of one real LoRA step on CPU with gradient checkpointing; ``skewed``
    overrides every router's choice so that every token goes to experts 0 to k-1."""
    import lessonkit
    from lessonkit.memory import measuring

    finish, run_step = measuring.finish_model, measuring.run_step

    def force_routing(model: Any, spec_: ModelSpec, settings: Any) -> None:
        finish(model, spec_, settings)
        for layer in model.get_base_model().model.layers:

            def same_experts(module: Any, args: Any, out: Any) -> Any:
                logits, weights, index = out
                return logits, weights, torch.arange(index.shape[-1]).expand_as(index)

            if skewed:
                layer.mlp.gate.register_forward_hook(same_experts)

    monkeypatch.setattr(measuring, "finish_model", force_routing)
    monkeypatch.setattr(
        measuring, "run_step", lambda spec_, settings, **_: run_step(spec_, settings, fake=False)
    )
    shape = dict(method="lora", precision="bf16", batch_size=2, seq_len=64)
    return lessonkit.measure(spec, **shape, gradient_checkpointing=True).tensor_bytes


def test_uneven_routing_leaves_the_grouped_experts_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    """The estimate assumes balanced routing; with the grouped GEMM every buffer has tokens x
    top-k rows, so a router that sends every token to the same experts peaks where it does."""
    import lessonkit

    config = transformers.AutoConfig.for_model(
        "qwen3_moe",
        **(SMALL | dict(num_hidden_layers=2)),
        num_experts=16,
        num_experts_per_tok=4,
        moe_intermediate_size=32,
        norm_topk_prob=True,
    )
    spec = ModelSpec.from_hf_config(config.to_dict() | {"model_type": "qwen3_moe"})
    balanced = _real_step_peak(monkeypatch, spec, skewed=False)
    skewed = _real_step_peak(monkeypatch, spec, skewed=True)
    assert abs(skewed - balanced) <= 0.005 * balanced
    estimated = lessonkit.estimate(
        spec, method="lora", precision="bf16", batch_size=2, seq_len=64,
        gradient_checkpointing=True, device="cpu",
    ).tensor_bytes  # fmt: skip
    assert abs(estimated - skewed) <= 0.05 * skewed
