"""LoRA on the experts' 3D weights (peft's ``target_parameters``, its ParamWrapper): the
adapters' parameters against peft's own, what the MoE blocks save against peft-wrapped
transformers blocks under FakeTensorMode, and the names and settings estimate() accepts.
Whole steps against measure() are grid rows in test_accuracy.py (EXPERT_LORA_ROWS)."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import pytest

import lessonkit
from lessonkit.errors import LessonkitError
from lessonkit.memory import activations as acts
from lessonkit.memory.experts import BiasedMoEMLP, MoEMLP
from lessonkit.models.presets import get_preset
from lessonkit.models.spec import ModelSpec
from tests.memory import test_gpt_oss_blocks as gpt_oss_blocks
from tests.memory import test_moe_block as moe_blocks

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

RANK = 4
TARGETS = {
    "gate_up": ("experts.gate_up_proj",),
    "down": ("experts.down_proj",),
    "both": ("experts.gate_up_proj", "experts.down_proj"),
}


def _wrapped(module: Any, targets: tuple[str, ...]) -> Any:
    config = peft.LoraConfig(r=RANK, target_modules=[], target_parameters=list(targets))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return peft.inject_adapter_in_model(config, module)


def _saved_by(module: Any, hidden: int, tokens: int, input_grad: bool, adapter: Any) -> int:
    """Bytes the peft-wrapped block's forward saves for backward, each storage once, its
    parameters (the frozen experts and the adapters) left out."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.multiprocessing import reductions

    with FakeTensorMode(allow_non_fake_inputs=True):
        module.to_empty(device="cpu")
        for name, parameter in module.named_parameters():
            parameter.requires_grad_("lora_" in name)
            if "lora_" in name:
                parameter.data = parameter.data.to(adapter)
        weights = {reductions.StorageWeakRef(p.untyped_storage()) for p in module.parameters()}
        storages: dict[Any, int] = {}

        def pack(tensor: Any) -> Any:
            storage = reductions.StorageWeakRef(tensor.untyped_storage())
            if storage not in weights:
                storages[storage] = tensor.untyped_storage().nbytes()
            return tensor

        x = torch.randn(2, tokens // 2, hidden, dtype=torch.bfloat16, requires_grad=input_grad)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            module(x)
    return sum(storages.values())


def _context(tokens: int, targets: tuple[str, ...], adapter_bytes: int) -> acts.StepContext:
    return dataclasses.replace(
        moe_blocks._context(tokens, False),
        lora_targets=frozenset(targets),
        adapter_bytes=adapter_bytes,
        lora_rank=RANK,
    )


ADAPTERS = {"fp32": (4, "float32"), "bf16": (2, "bfloat16")}


@pytest.mark.parametrize("case", ["qwen3_moe", "qwen3_moe_normed", "mixtral"])
@pytest.mark.parametrize("targets", list(TARGETS))
@pytest.mark.parametrize("input_grad", [True, False], ids=["input-grad", "no-input-grad"])
@pytest.mark.parametrize("adapter", list(ADAPTERS))
def test_moe_block_saves_what_peft_wrapped_block_saves(
    case: str, targets: str, input_grad: bool, adapter: str
) -> None:
    """The folded expert stack is saved only when the grouped GEMM's input needs a gradient,
    the factors' casts only when the adapters are not in the weights' dtype."""
    module, spec, block = moe_blocks._block_and_spec(case)
    adapter_bytes, dtype = ADAPTERS[adapter]
    tokens = 94
    measured = _saved_by(
        _wrapped(module, TARGETS[targets]),
        spec.hidden_size,
        tokens,
        input_grad,
        getattr(torch, dtype),
    )
    saved = acts.Saved()
    out = block.forward(
        saved,
        _context(tokens, TARGETS[targets], adapter_bytes),
        spec,
        0,
        acts.Flow("x", 2, input_grad),
    )
    assert out.needs_grad
    assert saved.activations == measured


@pytest.mark.parametrize("targets", list(TARGETS))
@pytest.mark.parametrize("input_grad", [True, False], ids=["input-grad", "no-input-grad"])
def test_gpt_oss_block_saves_what_peft_wrapped_block_saves(targets: str, input_grad: bool) -> None:
    config = gpt_oss_blocks._config("gqa")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    spec = ModelSpec.from_hf_config(config.to_dict() | {"model_type": "gpt_oss"})
    tokens = 94
    measured = _saved_by(
        _wrapped(model.model.layers[1].mlp, TARGETS[targets]),
        config.hidden_size,
        tokens,
        input_grad,
        torch.float32,
    )
    saved = acts.Saved()
    BiasedMoEMLP().forward(
        saved, _context(tokens, TARGETS[targets], 4), spec, 1, acts.Flow("x", 2, input_grad)
    )
    assert saved.activations == measured


def test_the_folded_stack_dominates_what_the_block_saves() -> None:
    """The lesson of LoRA on experts: each forward makes a copy of the whole expert stack, which
    is saved when the input needs a gradient; at 128 experts and 2,048 tokens it is four times
    all the rest the block saves."""
    spec = get_preset("qwen3-30b-a3b")
    ctx = _context(2048, TARGETS["both"], 4)
    saved = acts.Saved()
    MoEMLP(normalize_top_k=True).forward(saved, ctx, spec, 1, acts.Flow("x", 2, True))
    stacks = 2 * spec.n_experts * 3 * spec.expert_intermediate_size * spec.hidden_size
    folded = sum(v for k, v in saved.items.items() if k.endswith(".folded"))
    assert folded == stacks
    assert folded > 4 * (saved.activations - folded)


def _peft_trainable(model_type: str, fields: dict[str, Any], targets: list[str]) -> int:
    config = transformers.AutoConfig.for_model(model_type, **fields)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    layer_names = [t for t in targets if not t.startswith("experts")]
    lora = peft.LoraConfig(
        r=RANK,
        target_modules=layer_names,
        target_parameters=[f"mlp.{t}" for t in targets if t.startswith("experts")],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped = peft.get_peft_model(model, lora)
    return sum(p.numel() for p in wrapped.parameters() if p.requires_grad)


SMALL = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=128,
)
FAMILIES = {
    "qwen3_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=40),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2),
}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize(
    "targets",
    [["q_proj", "experts.gate_up_proj"], ["experts.down_proj"], ["q_proj", "v_proj", "experts"]],
)
def test_adapters_are_as_many_as_peft_makes(family: str, targets: list[str]) -> None:
    config = transformers.AutoConfig.for_model(family, **SMALL, **FAMILIES[family])
    spec = ModelSpec.from_hf_config(config.to_dict() | {"model_type": family})
    report = lessonkit.estimate(
        spec, method="lora", precision="bf16", lora_rank=RANK, lora_targets=targets
    )
    spelled = [name for t in targets for name in (TARGETS["both"] if t == "experts" else (t,))]
    expected = _peft_trainable(family, SMALL | FAMILIES[family], spelled)
    assert report.settings["estimated"]["trainable_parameters"] == expected
    # fp32 adapters, AdamW: a gradient and two states of 4 bytes for each
    assert report.settings["estimated"]["gradient_bytes"] == 4 * expected
    assert report.settings["estimated"]["optimizer_bytes"] == 8 * expected


@pytest.mark.parametrize(
    ("given", "spelled"),
    [
        (("q_proj", "experts"), ["q_proj", "experts.gate_up_proj", "experts.down_proj"]),
        (("mlp.experts",), ["experts.gate_up_proj", "experts.down_proj"]),
        (("mlp.experts.down_proj", "experts.down_proj"), ["experts.down_proj"]),
        (("experts.gate_up_proj", "experts"), ["experts.gate_up_proj", "experts.down_proj"]),
    ],
)
def test_expert_targets_are_spelled_as_peft_names_them(given: tuple, spelled: list) -> None:
    report = lessonkit.estimate("qwen3-30b-a3b", method="lora", lora_targets=given)
    assert list(report.settings["lora_targets"]) == spelled


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("gate_up_proj", "'experts.gate_up_proj'"),
        ("mlp.gate", "router"),
        ("router", "router"),
        ("expert", "Did you mean 'experts'"),
    ],
)
def test_names_that_are_not_expert_targets_are_refused(target: str, says: str) -> None:
    with pytest.raises(LessonkitError) as raised:
        lessonkit.estimate("qwen3-30b-a3b", method="lora", lora_targets=("q_proj", target))
    message = str(raised.value)
    assert says in message and "Allowed: q_proj" in message and "experts" in message
    with pytest.raises(LessonkitError, match="Allowed"):
        lessonkit.measure("mixtral-8x7b", method="lora", lora_targets=(target,))


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (dict(lora_dropout=0.05), "lora_dropout > 0"),
        (dict(precision="bf16-mixed"), "precision 'bf16-mixed'"),
        (dict(n_gpus=2, zero_stage=3), "zero_stage=3"),
        (dict(activation_offload=True, gradient_checkpointing=True), "activation_offload"),
    ],
)
def test_settings_not_modelled_with_expert_lora_are_named(settings: dict, named: str) -> None:
    with pytest.raises(LessonkitError) as raised:
        lessonkit.estimate("gpt-oss-20b", method="lora", lora_targets=["experts"], **settings)
    assert named in str(raised.value) and "leave 'experts' out" in str(raised.value)
    # without the experts among the targets the same settings are modelled
    lessonkit.estimate("gpt-oss-20b", method="lora", lora_targets=["q_proj"], **settings)


def test_a_dense_model_has_no_experts_to_target() -> None:
    with pytest.raises(LessonkitError, match="Unknown LoRA target for llama 'experts'"):
        lessonkit.estimate("llama-3.1-8b", method="lora", lora_targets=["experts"])


def test_the_report_says_what_the_experts_adapters_cost() -> None:
    kw = dict(method="lora", gradient_checkpointing=True)
    plain = lessonkit.estimate("qwen3-30b-a3b", lora_targets=["q_proj"], **kw)
    experts = lessonkit.estimate("qwen3-30b-a3b", lora_targets=["q_proj", "experts"], **kw)
    added = (
        experts.settings["estimated"]["trainable_parameters"]
        - plain.settings["estimated"]["trainable_parameters"]
    )
    notes = " ".join(experts.assumptions)
    assert f"{added / 1e6:.1f}M trainable parameters" in notes
    assert "full copy of the expert stack" in notes
    assert "full copy of the expert stack" not in " ".join(plain.assumptions)
