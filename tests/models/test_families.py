"""The families read through transformers' own config classes: the parameter count of each
equals that of the model transformers builds from the same config on the meta device."""

from __future__ import annotations

import pytest

from lessonkit.errors import LessonkitError
from lessonkit.models.hf_config import CONFIG_CLASS_FAMILIES
from lessonkit.models.spec import ModelSpec

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SMALL = dict(
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    vocab_size=4096,
    pad_token_id=None,
)


def _meta_parameters(config: object) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


@pytest.mark.parametrize("family", CONFIG_CLASS_FAMILIES)
@pytest.mark.parametrize("tied", [False, True])
def test_parameters_equal_the_meta_model(family: str, tied: bool) -> None:
    config = transformers.AutoConfig.for_model(family, **SMALL, tie_word_embeddings=tied)
    spec = ModelSpec.from_hf_config(config.to_dict() | {"model_type": family})
    assert spec.family == family and spec.tie_embeddings is tied
    meta = _meta_parameters(config)
    assert spec.n_params == sum(int(torch.Size(s).numel()) for s in meta.values())
    layer = {n.split("layers.0.", 1)[1]: s for n, s in meta.items() if ".layers.0." in n}
    assert {t.name: t.shape for t in spec.parameter_tensors().layer} == layer
    # and the config lessonkit writes back builds the same model
    assert _meta_parameters(spec.to_hf_config()) == meta


def test_a_gemma3_config_is_read_as_its_language_model() -> None:
    text = transformers.AutoConfig.for_model("gemma3_text", **SMALL).to_dict()
    spec = ModelSpec.from_hf_config({"model_type": "gemma3", "text_config": text})
    assert spec.family == "gemma3_text" and spec.vocab_size == 4096 and spec.norms_per_layer == 4
    assert spec.qk_norm == "head"


def test_a_config_transformers_refuses_says_so() -> None:
    with pytest.raises(LessonkitError, match="qwen3"):
        ModelSpec.from_hf_config({"model_type": "qwen3", "num_attention_heads": "many"})


def test_phi3_lora_defaults_to_its_fused_attention_input() -> None:
    config = transformers.AutoConfig.for_model("phi3", **SMALL)
    spec = ModelSpec.from_hf_config(config.to_dict() | {"model_type": "phi3"})
    assert spec.default_lora_targets == ("qkv_proj",)
    assert spec.lora_params(8, "all-linear") == 2 * 8 * sum(
        a + b for a, b in spec.linear_shapes().values()
    )


@pytest.mark.parametrize("model_type", ["qwen3_moe", "stablelm", "mamba"])
def test_a_causal_lm_lessonkit_has_no_blocks_for_is_counted_from_the_meta_model(
    model_type: str,
) -> None:
    # a Qwen3-MoE with a dense first layer (mlp_only_layers): traced, not read block by block
    moe = dict(SMALL, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[0])
    fields = moe if model_type == "qwen3_moe" else SMALL
    config = transformers.AutoConfig.for_model(model_type, **fields)
    spec = ModelSpec.from_hf_config(config.to_dict() | {"model_type": model_type})
    assert spec.family == "traced" and spec.extra["model_type"] == model_type
    meta = _meta_parameters(config)
    assert spec.n_params == sum(int(torch.Size(s).numel()) for s in meta.values())
    assert "traced" in spec.note


def test_lora_targets_of_a_traced_model_are_its_linear_layers() -> None:
    config = transformers.AutoConfig.for_model("stablelm", **SMALL)
    spec = ModelSpec.from_hf_config(config.to_dict() | {"model_type": "stablelm"})
    layers = 2
    assert spec.lora_params(4, ("q_proj", "v_proj")) == layers * 4 * (2 * 256 + 256 + 64)
    with pytest.raises(LessonkitError, match="LoRA target"):
        spec.lora_params(4, ("c_attn",))


# ----- the presets of 2025 ------------------------------------------------------------------
NEW_PRESETS = {
    "qwen3-0.6b": ("qwen3", 0.596e9),
    "qwen3-1.7b": ("qwen3", 1.721e9),
    "qwen3-4b": ("qwen3", 4.022e9),
    "qwen3-8b": ("qwen3", 8.191e9),
    "qwen3-14b": ("qwen3", 14.768e9),
    "qwen3-32b": ("qwen3", 32.762e9),
    "gemma-3-1b": ("gemma3_text", 1.000e9),
    "llama-3.3-70b": ("llama", 70.554e9),
    "phi-4": ("phi3", 14.660e9),
    "smollm3-3b": ("smollm3", 3.075e9),
    "granite-3.3-8b": ("granite", 8.171e9),
}


@pytest.mark.parametrize("name", NEW_PRESETS)
def test_presets_of_2025_have_their_family_size_and_release(name: str) -> None:
    from lessonkit.models.presets import _preset_data, get_preset

    family, size = NEW_PRESETS[name]
    spec = get_preset(name)
    assert spec.family == family
    assert abs(spec.n_params - size) < 0.001e9  # the size each model card states, rounded
    entry = _preset_data()[name]
    assert entry["as_of"] >= "2024-12-01" and entry["hf_id"] in entry["source"]


def test_preset_names_are_grouped_by_family() -> None:
    from lessonkit.models.presets import get_preset, preset_groups, preset_names

    groups = preset_groups()
    assert [n for names in groups.values() for n in names] == preset_names()
    assert groups["Qwen3"] == [n for n in NEW_PRESETS if n.startswith("qwen3")]
    for label, names in groups.items():
        assert len({get_preset(n).family for n in names}) == 1, label


def test_a_near_miss_suggests_the_preset() -> None:
    from lessonkit.models.presets import get_preset

    with pytest.raises(LessonkitError, match="Did you mean 'qwen3-1.7b' or 'qwen3-8b'"):
        get_preset("qwen3-7b")
    assert get_preset("Qwen3 8B").name == "qwen3-8b"


@pytest.mark.parametrize(
    "name", ["gemma-3-1b", "gemma-3-27b", "qwen3-0.6b", "phi-4", "granite-3.3-8b", "olmo-2-7b"]
)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_preset_weights_are_the_meta_models_bytes(name: str, precision: str) -> None:
    """Parameters and buffers (Gemma 3: two rotary tables and the embedding scale)."""
    import lessonkit
    from lessonkit.models.presets import get_preset

    spec = get_preset(name)
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(spec.to_hf_config(), dtype=dtype)
    tensors = [*model.parameters(), *model.buffers()]
    real = sum(t.numel() * t.element_size() for t in tensors)
    assert (
        lessonkit.estimate(spec, precision=precision).settings["estimated"]["weight_bytes"] == real
    )


# ----- Gemma 3 4B-27B, Mistral Small 3.1, OLMo 2 ----------------------------------------------
# The family of each and the parameters of its text decoder as published beside the checkpoint,
# not by lessonkit: Gemma 3 4B's Gemma3TextModel (3,880,263,168 in a module summary of
# google/gemma-3-4b-it); Gemma 3 12B and 27B, the Hub totals (12,187,325,040 and 27,432,406,640)
# less the vision tower and projector (4B's total 4,300,079,472 less its text decoder gives the
# tower, 416,866,032, plus 1,152 x hidden_size + 1,152 for the projector); Mistral Small 3.x's
# text decoder 23,572,403,200 (3.2, the same shape); OLMo 2's model cards say 7B and 13B.
PRESETS_2025_II = {
    "gemma-3-4b": ("gemma3_text", "Gemma 3", 3_880_263_168),
    "gemma-3-12b": ("gemma3_text", "Gemma 3", 12_187_325_040 - 416_866_032 - 1_152 * 3_841),
    "gemma-3-27b": ("gemma3_text", "Gemma 3", 27_432_406_640 - 416_866_032 - 1_152 * 5_377),
    "mistral-small-3.1-24b": ("mistral", "Mistral", 23_572_403_200),
    "olmo-2-7b": ("olmo2", "OLMo 2", None),
    "olmo-2-13b": ("olmo2", "OLMo 2", None),
}


def _meta_model_params(name: str) -> int:
    from lessonkit.models.presets import get_preset

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(get_preset(name).to_hf_config())
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", PRESETS_2025_II)
def test_gemma3_mistral_small_and_olmo2_presets_count_what_transformers_builds(name: str) -> None:
    from lessonkit.models.presets import _preset_data, get_preset

    family, _, published = PRESETS_2025_II[name]
    spec = get_preset(name)
    assert spec.family == family
    assert spec.n_params == _meta_model_params(name)
    if published is not None:
        assert spec.n_params == published
    else:  # "7B", "13B": the size in the name, in whole billions (7.30B, 13.72B)
        assert spec.n_params // 10**9 == int(name.split("-")[-1].removesuffix("b"))
    entry = _preset_data()[name]
    assert entry["hf_id"] in entry["source"] and "/" in entry["source"].split(" in ", 1)[-1]
    assert "2024-11-01" <= entry["as_of"] <= "2025-12-31" and entry["as_of_basis"]


def test_gemma3_mistral_small_and_olmo2_presets_are_grouped_by_family() -> None:
    from lessonkit.models.presets import preset_groups

    groups = preset_groups()
    assert groups["Gemma 3"] == ["gemma-3-1b", "gemma-3-4b", "gemma-3-12b", "gemma-3-27b"]
    assert groups["Mistral"] == ["mistral-7b", "mistral-small-3.1-24b"]
    assert groups["OLMo 2"] == ["olmo-2-7b", "olmo-2-13b"]


@pytest.mark.parametrize("name", PRESETS_2025_II)
def test_gemma3_mistral_small_and_olmo2_presets_estimate(name: str) -> None:
    """Full fine-tuning in bf16-mixed with AdamW: 16 bytes a parameter before activations."""
    import lessonkit

    report = lessonkit.estimate(name, precision="bf16-mixed", optimizer="adamw")
    assert report.model.name == name
    parts = report.breakdown
    assert parts["gradients"] + parts["optimizer"] >= 12 * report.model.n_params
    assert report.total_bytes > 16 * report.model.n_params
    lora = lessonkit.estimate(name, method="lora")
    assert 0 < lora.total_bytes < report.total_bytes


def test_the_new_presets_answer_to_near_misses() -> None:
    from lessonkit.models.presets import get_preset

    assert get_preset("Gemma 3 27B").name == "gemma-3-27b"
    assert get_preset("olmo2-13b").name == "olmo-2-13b"
    with pytest.raises(LessonkitError, match="olmo-2-7b"):
        get_preset("olmo-2-8b")
