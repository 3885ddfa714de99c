"""Causal LMs lessonkit has no blocks for: weights, gradients and optimizer states from the
meta model (exact), activations from a short traced step, against a measured step."""

from __future__ import annotations

import pytest

import lessonkit
from lessonkit.memory import tracing
from lessonkit.models.spec import ModelSpec

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

SMALL = dict(
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


def _spec(model_type: str, **fields: object) -> ModelSpec:
    config = transformers.AutoConfig.for_model(model_type, **(SMALL | fields)).to_dict()
    return ModelSpec.from_hf_config(config | {"model_type": model_type}, name=f"tiny-{model_type}")


SPECS = {
    # LayerNorm, partial rotary
    "stablelm": _spec("stablelm"),
    # mixture of experts with a dense first layer (transformers 5's grouped-GEMM experts:
    # traced and measured in bf16)
    "qwen3_moe": _spec(
        "qwen3_moe",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        mlp_only_layers=[0],
    ),
    # multi-head latent attention; two dense layers, then MoE layers with a shared expert: the
    # trace must meet both kinds of layer (eager attention: a seq x seq term is fitted too)
    "deepseek_v3": _spec(
        "deepseek_v3",
        num_hidden_layers=4,
        first_k_dense_replace=2,
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        n_shared_experts=1,
        q_lora_rank=64,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=32,
        v_head_dim=32,
        n_group=1,
        topk_group=1,
        num_key_value_heads=8,
        head_dim=16,
    ),
    # MoE every other layer, and RoPE left out of every fourth layer
    "llama4_text": _spec(
        "llama4_text",
        num_hidden_layers=4,
        num_local_experts=4,
        num_experts_per_tok=1,
        intermediate_size_mlp=704,
        interleave_moe_layer_step=2,
        head_dim=32,
    ),
}
ROWS = [
    ("stablelm", dict()),
    ("stablelm", dict(gradient_checkpointing=True)),
    ("stablelm", dict(method="lora", precision="bf16")),
    ("stablelm", dict(method="qlora", precision="bf16", gradient_checkpointing=True)),
    ("qwen3_moe", dict(precision="bf16")),
    ("qwen3_moe", dict(method="lora", precision="bf16")),
    ("qwen3_moe", dict(method="lora", precision="bf16", gradient_checkpointing=True)),
    ("deepseek_v3", dict(precision="bf16")),
    ("deepseek_v3", dict(method="lora", precision="bf16", lora_targets=["q_b_proj", "o_proj"])),
    ("deepseek_v3", dict(precision="bf16", gradient_checkpointing=True)),
    ("llama4_text", dict(precision="bf16")),
    ("llama4_text", dict(method="lora", precision="bf16", lora_targets=["q_proj", "o_proj"])),
    ("llama4_text", dict(precision="bf16", gradient_checkpointing=True)),
]


@pytest.mark.parametrize("case", ROWS, ids=lambda c: c[0] + "-" + "-".join(map(str, c[1].values())))
def test_traced_estimate_against_measure(case) -> None:
    name, kw = case
    spec = SPECS[name]
    kw = dict(batch_size=4, seq_len=256, device="cpu") | kw
    measured, estimated = lessonkit.measure(spec, **kw), lessonkit.estimate(spec, **kw)
    m, e = measured.settings["measured"], estimated.settings["estimated"]
    assert e["weight_bytes"] == m["parameter_bytes"] + m["buffer_bytes"]
    assert e["gradient_bytes"] == m["gradient_bytes"]
    assert e["optimizer_bytes"] == m["optimizer_bytes"]
    assert abs(estimated.tensor_bytes / measured.tensor_bytes - 1) <= 0.05
    assert any(note.startswith("Traced figures") for note in estimated.assumptions)


def test_each_kind_of_layer_is_traced() -> None:
    from lessonkit.models.traced import layer_kinds

    spec = SPECS["deepseek_v3"]
    assert layer_kinds(spec.extra["config"], "deepseek_v3", 4) == (0, 0, 1, 1)
    trace = tracing.traced_activations(spec, estimated_settings(spec))
    assert trace.layers_traced == 3  # layer 1 (dense) and layer 2 (the first MoE layer)
    assert sorted(kind.count for kind in trace.kinds) == [1, 2]
    moe, dense = trace.kinds  # the MoE layers save the routing buffers on top
    assert moe.per_token > dense.per_token
    assert moe.per_token_pair > 0  # eager attention's probabilities, seq x seq


def estimated_settings(spec: ModelSpec):
    from lessonkit.memory.settings import validate_run

    return validate_run(spec, **(lessonkit.estimate.__kwdefaults__ or {}) | dict(precision="bf16"))


def test_traced_experts_give_total_and_active_parameters() -> None:
    spec = SPECS["llama4_text"]
    # 2 MoE layers of 4 experts, one per token: 3 of 4 experts' weights unused per token
    from lessonkit.models.traced import traced_experts

    experts, per_token, unused = traced_experts(spec.extra["config"], "llama4_text", 4)
    assert (experts, per_token) == (4, 1)
    assert unused == 2 * 3 * 3 * 256 * 704  # two MoE layers, three experts: gate, up, down
    report = lessonkit.estimate(spec, precision="bf16", batch_size=1, seq_len=16)
    assert f"{(spec.n_params - unused) / 1e9:.2f}B active" in str(report)
    assert any("4 routed experts" in note for note in report.assumptions)


def test_lora_targets_a_model_cannot_train_with_are_named() -> None:
    # peft's all-linear wraps Llama 4's router, whose forward returns a tuple: training fails
    with pytest.raises(lessonkit.LessonkitError, match="fails with LoRA on all-linear only"):
        lessonkit.estimate(
            SPECS["llama4_text"],
            method="lora",
            lora_targets="all-linear",
            batch_size=1,
            seq_len=16,
        )


def test_a_configuration_is_traced_once(monkeypatch) -> None:
    spec = _spec("stablelm", hidden_size=128, intermediate_size=256)
    calls = []
    original = tracing._saved_bytes
    monkeypatch.setattr(tracing, "_saved_bytes", lambda *args: calls.append(1) or original(*args))
    for batch in (1, 2, 4):  # the batch and the length scale the trace; they do not redo it
        lessonkit.estimate(spec, method="lora", batch_size=batch, seq_len=100, device="cpu")
    assert len(calls) == len(tracing.TRACED_LENGTHS)  # one short model, at each length


def test_a_model_that_cannot_be_traced_says_so(monkeypatch) -> None:
    spec = _spec("stablelm", hidden_size=64, intermediate_size=128)

    def refuse(*args: object) -> int:
        raise RuntimeError("no kernel for this")

    monkeypatch.setattr(tracing, "_saved_bytes", refuse)
    with pytest.raises(lessonkit.LessonkitError, match="could not be traced.*no kernel"):
        lessonkit.estimate(spec, batch_size=1, seq_len=16)
