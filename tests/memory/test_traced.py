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
}
ROWS = [
    ("stablelm", dict()),
    ("stablelm", dict(gradient_checkpointing=True)),
    ("stablelm", dict(method="lora", precision="bf16")),
    ("stablelm", dict(method="qlora", precision="bf16", gradient_checkpointing=True)),
    ("qwen3_moe", dict(precision="bf16")),
    ("qwen3_moe", dict(method="lora", precision="bf16")),
    ("qwen3_moe", dict(method="lora", precision="bf16", gradient_checkpointing=True)),
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


def test_a_configuration_is_traced_once(monkeypatch) -> None:
    spec = _spec("stablelm", hidden_size=128, intermediate_size=256)
    calls = []
    original = tracing._saved_bytes
    monkeypatch.setattr(tracing, "_saved_bytes", lambda *args: calls.append(1) or original(*args))
    for batch in (1, 2, 4):  # the batch and the length scale the trace; they do not redo it
        lessonkit.estimate(spec, method="lora", batch_size=batch, seq_len=100, device="cpu")
    assert len(calls) == 4  # 1 and 2 layers, at two lengths


def test_a_model_that_cannot_be_traced_says_so(monkeypatch) -> None:
    spec = _spec("stablelm", hidden_size=64, intermediate_size=128)

    def refuse(*args: object) -> int:
        raise RuntimeError("no kernel for this")

    monkeypatch.setattr(tracing, "_saved_bytes", refuse)
    with pytest.raises(lessonkit.LessonkitError, match="could not be traced.*no kernel"):
        lessonkit.estimate(spec, batch_size=1, seq_len=16)
