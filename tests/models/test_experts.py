"""Mixture-of-experts fields of ModelSpec: read from qwen3_moe and mixtral configs, counted
against the model transformers builds on the meta device."""

from __future__ import annotations

import math
from typing import Any

import pytest

from lessonkit.errors import LessonkitError
from lessonkit.models.spec import ModelSpec

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SMALL = dict(
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=128,
    intermediate_size=96,
)
CONFIGS = {
    "qwen3_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32),
    "qwen3_moe_dense_first": dict(
        num_experts=6, num_experts_per_tok=3, moe_intermediate_size=40, mlp_only_layers=[0]
    ),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    # biased router and experts, attention sinks, sliding and full attention in turn
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2),
}


def _config(case: str) -> Any:
    model_type = case.removesuffix("_dense_first")
    return transformers.AutoConfig.for_model(model_type, **SMALL, **CONFIGS[case])


def _meta_counts(config: Any) -> tuple[int, int]:
    """All parameters of the meta model, and those a token uses: every tensor outside the
    experts, and experts_per_token / n_experts of each experts' tensor."""
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    total = active = 0
    for name, tensor in model.named_parameters():
        total += tensor.numel()
        if ".experts." in name:
            experts = tensor.shape[0]
            active += tensor.numel() // experts * config.num_experts_per_tok
        else:
            active += tensor.numel()
    return total, active


@pytest.mark.parametrize("case", list(CONFIGS))
def test_experts_counted_as_the_meta_model(case: str) -> None:
    config = _config(case)
    spec = ModelSpec.from_hf_config(config.to_dict() | {"model_type": config.model_type})
    total, active = _meta_counts(config)
    assert spec.n_params == total
    assert spec.active_params == active
    assert spec.active_params < spec.n_params
    assert spec.experts_per_token == config.num_experts_per_tok
    assert spec.moe_layers == (2 if case.endswith("dense_first") else 3)
    # experts in every layer: read block by block; dense layers among them: traced
    assert spec.family == ("traced" if case.endswith("dense_first") else config.model_type)


def test_fields_read_from_each_family() -> None:
    qwen = ModelSpec.from_hf_config(_config("qwen3_moe").to_dict() | {"model_type": "qwen3_moe"})
    assert (qwen.n_experts, qwen.expert_intermediate_size, qwen.n_shared_experts) == (8, 32, 0)
    mixtral = ModelSpec.from_hf_config(_config("mixtral").to_dict() | {"model_type": "mixtral"})
    # Mixtral's experts are as wide as its intermediate_size
    assert (mixtral.n_experts, mixtral.expert_intermediate_size) == (4, 96)


def test_gpt_oss_read_from_transformers_default_config() -> None:
    """GptOssConfig's defaults (gpt-oss-120b's shape: 36 layers, 128 experts, top 4)."""
    config = transformers.GptOssConfig()
    spec = ModelSpec.from_hf_config(config.to_dict())
    assert spec.family == "gpt_oss"
    assert (spec.n_experts, spec.experts_per_token, spec.expert_intermediate_size) == (128, 4, 2880)
    assert spec.attention_bias == "all" and not spec.tie_embeddings
    assert (spec.n_params, spec.active_params) == _meta_counts(config)
    assert spec.layer_types == tuple(config.layer_types)
    assert spec.layer_types[:2] == ("sliding_attention", "full_attention")


@pytest.mark.parametrize(
    "fields",
    [
        dict(num_hidden_layers=3, num_local_experts=4, num_experts_per_tok=1),
        dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, head_dim=8),
        dict(num_hidden_layers=4, attention_bias=False, tie_word_embeddings=True),
        dict(num_hidden_layers=2, layer_types=["full_attention", "full_attention"]),
    ],
)
def test_small_gpt_oss_configs_counted_as_the_meta_model(fields: dict[str, Any]) -> None:
    base = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    base |= dict(vocab_size=128, intermediate_size=24, num_local_experts=6)
    config = transformers.GptOssConfig(**(base | fields))
    spec = ModelSpec.from_hf_config(config.to_dict())
    assert (spec.n_params, spec.active_params) == _meta_counts(config)
    assert spec.layer_types == tuple(config.layer_types)
    rebuilt = spec.to_hf_config()  # what measure() builds: the same model
    assert _meta_counts(rebuilt) == _meta_counts(config)
    assert rebuilt.layer_types == config.layer_types


def test_layer_types_that_do_not_fit_are_named() -> None:
    from dataclasses import replace

    spec = ModelSpec.from_hf_config(transformers.GptOssConfig(num_hidden_layers=2).to_dict())
    for wrong in (["full_attention"], ["global", "local"], "full_attention"):
        with pytest.raises(LessonkitError, match="layer_types must list one of"):
            replace(spec, extra={"layer_types": wrong})


def test_dense_model_has_no_experts() -> None:
    spec = ModelSpec("d", "llama", 2, 64, 4, 4, 128, 100)
    assert spec.n_experts == 0
    assert spec.active_params == spec.n_params


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(n_experts=8, experts_per_token=9, expert_intermediate_size=8, moe_layers=2), "1 to"),
        (
            dict(n_experts=8, experts_per_token=2, expert_intermediate_size=0, moe_layers=2),
            "expert_intermediate_size",
        ),
        (
            dict(n_experts=8, experts_per_token=2, expert_intermediate_size=8, moe_layers=3),
            "from 1",
        ),
        (dict(experts_per_token=2), "n_experts=0"),
        (dict(n_experts=-1), ">= 0"),
        (dict(n_experts="8"), ">= 0"),
    ],
)
def test_bad_expert_fields_named(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(LessonkitError, match=message):
        ModelSpec("d", "llama", 2, 64, 4, 4, 128, 100, **fields)


def test_report_gives_total_and_active_params() -> None:
    import lessonkit

    config = _config("qwen3_moe")
    spec = ModelSpec.from_hf_config(config.to_dict() | {"model_type": "qwen3_moe"}, name="tiny")
    report = lessonkit.estimate(spec, batch_size=1, seq_len=16, precision="bf16")
    assert report.to_dict()["active_params"] == spec.active_params
    assert f"{spec.active_params / 1e9:.2f}B active" in str(report)
    assert "active" not in str(lessonkit.estimate(ModelSpec("d", "llama", 2, 64, 4, 4, 128, 100)))


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-20b", "gpt-oss-120b"])
def test_moe_presets_weigh_what_the_meta_model_weighs(name: str) -> None:
    from lessonkit.models.presets import get_preset

    spec = get_preset(name)
    total, active = _meta_counts(spec.to_hf_config())
    assert spec.n_params == total
    assert spec.active_params == active
    assert spec.active_params < spec.n_params / 3  # computes like a far smaller model


def test_the_estimate_says_which_routing_it_assumes() -> None:
    import lessonkit

    report = lessonkit.estimate("qwen3-30b-a3b", method="lora", batch_size=1, seq_len=512)
    notes = " ".join(report.assumptions)
    assert "balanced top-k routing" in notes and "3.35B active" in notes
    assert "all 128 experts" in notes


def test_checkpointing_of_experts_is_no_longer_marked_approximate() -> None:
    import lessonkit

    report = lessonkit.estimate(
        "qwen3-30b-a3b", method="lora", batch_size=1, seq_len=512, gradient_checkpointing=True
    )
    notes = " ".join(report.assumptions)
    assert "recomputed layer" in notes and "Approximate" not in notes


def test_bitsandbytes_leaves_the_experts_in_bf16() -> None:
    """transformers' 4-bit loading swaps nn.Linear (and Conv1D) for bitsandbytes' Linear4bit;
    transformers 5 keeps the experts as 3D nn.Parameters and the router as a module of its own,
    so both stay bf16: what estimate() quantizes (the spec's "linear" tensors) and no more."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    bnb = pytest.importorskip("bitsandbytes")
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear

    import lessonkit

    config = transformers.AutoConfig.for_model(
        "qwen3_moe", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    quantization = transformers.BitsAndBytesConfig(load_in_4bit=True)
    replace_with_bnb_linear(model, ["lm_head"], quantization)
    quantized = {
        name.split(".")[-1] for name, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)
    }
    assert quantized == {"q_proj", "k_proj", "v_proj", "o_proj"}
    experts = model.model.layers[0].mlp.experts
    assert experts.gate_up_proj.dtype == experts.down_proj.dtype == torch.bfloat16
    spec = ModelSpec.from_hf_config(config.to_dict() | {"model_type": "qwen3_moe"})
    layer = {t.name for t in spec.parameter_tensors().layer if t.kind == "linear"}
    assert {name.split(".")[-2] for name in layer} == quantized
    notes = " ".join(lessonkit.estimate(spec, method="qlora", seq_len=64).assumptions)
    assert "experts' 3D weights" in notes and "stay bf16" in notes


# gpt-oss's config.json on the Hub: (layers, experts), and OpenAI's published total and active
# parameters in billions (its active figure leaves out the input embeddings)
GPT_OSS = {"gpt-oss-20b": ((24, 32), 20.9, 3.6), "gpt-oss-120b": ((36, 128), 116.8, 5.1)}


@pytest.mark.parametrize("name", list(GPT_OSS))
def test_gpt_oss_presets_are_the_hub_configs(name: str) -> None:
    from lessonkit.models.presets import get_preset

    (layers, experts), total, active = GPT_OSS[name]
    config = transformers.GptOssConfig(
        num_hidden_layers=layers, num_local_experts=experts, num_experts_per_tok=4
    )
    read = ModelSpec.from_hf_config(config.to_dict())
    spec = get_preset(name)
    assert (spec.n_params, spec.active_params) == (read.n_params, read.active_params)
    assert spec.layer_types == tuple(config.layer_types)  # sliding and full in turn
    assert round(spec.n_params / 1e9, 1) == total
    input_embeddings = spec.vocab_size * spec.hidden_size
    assert round((spec.active_params - input_embeddings) / 1e9, 1) == active
    assert "MXFP4" in spec.note and "dequantize=True" in spec.note


@pytest.mark.parametrize("model", ["gpt-oss-20b", "config"])
def test_a_gpt_oss_estimate_says_it_counts_dequantized_bf16_experts(model: str) -> None:
    import lessonkit

    config = transformers.GptOssConfig(num_hidden_layers=2, num_local_experts=4).to_dict()
    report = lessonkit.estimate(
        model if model != "config" else config, method="lora", batch_size=1, seq_len=256
    )
    notes = " ".join(report.assumptions)
    assert sum("MXFP4" in note for note in report.assumptions) == 1  # said once
    assert "bf16" in notes and "dequantize=True" in notes
    assert "Eager attention whatever attention='sdpa' asks" in notes
    assert "no seq x seq matrix is kept" not in notes
    assert "B active" in str(report)


def test_a_gpt_oss_qlora_estimate_keeps_the_experts_in_bf16() -> None:
    import lessonkit
    from lessonkit.models.presets import get_preset

    spec = get_preset("gpt-oss-20b")
    report = lessonkit.estimate(spec, method="qlora", batch_size=1, seq_len=256)
    experts = sum(
        math.prod(t.shape) for t in spec.parameter_tensors().layer if ".experts." in t.name
    )
    assert report.settings["estimated"]["weight_bytes"] > 2 * spec.n_layers * experts
    assert any("experts' 3D weights" in note for note in report.assumptions)
