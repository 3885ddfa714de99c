"""ModelSpec: presets, parameter counts checked against transformers, HF configs, bare sizes."""

from __future__ import annotations

import json
import math

import pytest

from lessonkit import LessonkitError, ModelSpec, get_preset, preset_names, resolve_model

REQUIRED_PRESETS = [
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.2-1b",
    "llama-3.2-3b",
    "mistral-7b",
    "qwen2.5-0.5b",
    "qwen2.5-7b",
    "qwen2.5-14b",
    "qwen2.5-72b",
    "gemma-2-2b",
    "gemma-2-9b",
    "gpt2",
]


def transformers_parameters(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Build the model on the meta device: the name and shape of every parameter it creates."""
    import torch
    import transformers

    config = spec.to_hf_config()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def transformers_param_count(spec: ModelSpec) -> int:
    return sum(math.prod(shape) for shape in transformers_parameters(spec).values())


def test_required_presets_exist():
    assert set(REQUIRED_PRESETS) <= set(preset_names())


@pytest.mark.parametrize("name", sorted(preset_names()))
def test_preset_parameter_tensors_match_transformers(name):
    """Each parameter tensor, by name and shape, in every layer and outside them."""
    spec = get_preset(name)
    created = transformers_parameters(spec)
    tensors = spec.parameter_tensors()
    prefix = "transformer.h.{}." if spec.family == "gpt2" else "model.layers.{}."
    expected = {t.name: t.shape for t in tensors.outer}
    for i in range(spec.n_layers):
        expected |= {prefix.format(i) + t.name: t.shape for t in tensors.layer}
    assert created == expected
    assert spec.n_params == sum(math.prod(shape) for shape in created.values())
    assert spec.linear_params == spec.n_layers * sum(
        math.prod(t.shape) for t in tensors.layer if t.kind == "linear"
    )


def test_parameter_tensors_of_biased_and_tied_shapes_match_transformers():
    for spec in [
        ModelSpec(
            name="biased-llama",
            family="llama",
            n_layers=2,
            hidden_size=64,
            n_heads=4,
            n_kv_heads=2,
            intermediate_size=96,
            vocab_size=100,
            attention_bias="all",
            mlp_bias=True,
        ),
        ModelSpec(
            name="tied-qwen",
            family="qwen2",
            n_layers=1,
            hidden_size=64,
            n_heads=4,
            n_kv_heads=4,
            intermediate_size=96,
            vocab_size=100,
            attention_bias="qkv",
            tie_embeddings=True,
        ),
    ]:
        created = transformers_parameters(spec)
        tensors = spec.parameter_tensors()
        expected = {t.name: t.shape for t in tensors.outer} | {
            f"model.layers.{i}.{t.name}": t.shape
            for i in range(spec.n_layers)
            for t in tensors.layer
        }
        assert created == expected, spec.name
        assert spec.n_params == sum(math.prod(shape) for shape in created.values())


@pytest.mark.parametrize("name", sorted(preset_names()))
def test_presets_carry_a_source(name):
    assert "as of" in get_preset(name).note and "config.json" in get_preset(name).note


def test_linear_and_lora_counts_match_peft():
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    spec = ModelSpec(
        name="tiny-qwen",
        family="qwen2",
        n_layers=2,
        hidden_size=64,
        n_heads=4,
        n_kv_heads=2,
        intermediate_size=128,
        vocab_size=300,
        tie_embeddings=True,
        attention_bias="qkv",
    )
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(spec.to_hf_config())
    assert spec.n_params == sum(p.numel() for p in model.parameters())
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    linear = sum(
        m.weight.numel() for name, m in model.named_modules() if name.split(".")[-1] in targets
    )
    assert spec.linear_params == linear
    peft_model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert spec.lora_params(8, ("q_proj", "v_proj")) == trainable


def test_gpt2_lora_on_c_proj_counts_both_layers():
    spec = get_preset("gpt2")
    h, i = spec.hidden_size, spec.intermediate_size
    assert spec.lora_params(4, ("c_proj",)) == spec.n_layers * 4 * ((h + h) + (i + h))


@pytest.mark.parametrize(
    "name", ["llama-3.2-1b", "qwen2.5-0.5b", "gemma-2-2b", "gpt2", "mistral-7b"]
)
def test_hf_config_round_trip(name, tmp_path):
    spec = get_preset(name)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(spec.to_hf_config().to_dict()))
    again = ModelSpec.from_hf_config(path)
    assert again.n_params == spec.n_params
    assert (again.family, again.n_layers, again.n_kv_heads, again.head_dim) == (
        spec.family,
        spec.n_layers,
        spec.n_kv_heads,
        spec.head_dim,
    )


def test_from_hf_config_reads_a_plain_llama_dict():
    config = {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    }
    assert ModelSpec.from_hf_config(config).n_params == get_preset("llama-3.1-8b").n_params


def test_what_is_not_a_causal_lm_is_a_clear_error():
    pytest.importorskip("transformers")
    with pytest.raises(LessonkitError, match="Unsupported model_type 'vit'.*causal.*llama"):
        ModelSpec.from_hf_config({"model_type": "vit", "hidden_size": 8})


def test_missing_config_field_is_a_clear_error():
    with pytest.raises(LessonkitError, match="lacks the field 'num_hidden_layers'"):
        ModelSpec.from_hf_config(
            {"model_type": "llama", "hidden_size": 8, "num_attention_heads": 2}
        )


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(LessonkitError, match="No config.json"):
        ModelSpec.from_hf_config(tmp_path / "nowhere" / "config.json")


def test_preset_lookup_forgives_spelling_and_suggests():
    assert get_preset("Llama 2 7B").name == "llama-2-7b"
    assert get_preset("QWEN2.5_0.5B").name == "qwen2.5-0.5b"
    with pytest.raises(LessonkitError, match="Did you mean 'llama-2-13b'"):
        get_preset("lama-2-13b")


def test_bare_size_maps_to_a_named_representative_shape():
    spec = resolve_model("7B")
    assert spec.n_params == get_preset("llama-2-7b").n_params
    assert "llama-2-7b" in spec.note and "7B" in spec.note
    assert resolve_model(7e9).n_params == spec.n_params


@pytest.mark.parametrize("size", [30e9, 150e6, 400e9])
def test_sizes_without_a_preset_get_a_synthetic_shape_close_to_the_size(size):
    spec = resolve_model(size)
    assert abs(spec.n_params - size) / size < 0.1
    assert "Llama-style" in spec.note


@pytest.mark.parametrize("bad", [-7, 0, "seven", None, [7], 5e12, True])
def test_bad_models_are_clear_errors(bad):
    with pytest.raises(LessonkitError):
        resolve_model(bad)


def test_spec_validates_its_fields():
    with pytest.raises(LessonkitError, match="n_layers"):
        ModelSpec(
            name="x",
            family="llama",
            n_layers=0,
            hidden_size=64,
            n_heads=4,
            n_kv_heads=4,
            intermediate_size=128,
            vocab_size=100,
        )
    with pytest.raises(LessonkitError, match="multiple of n_kv_heads"):
        ModelSpec(
            name="x",
            family="llama",
            n_layers=1,
            hidden_size=64,
            n_heads=4,
            n_kv_heads=3,
            intermediate_size=128,
            vocab_size=100,
        )


def test_an_object_that_cannot_print_itself_is_still_a_clear_error():
    class Hostile:
        def __repr__(self):
            raise RuntimeError("no")

    with pytest.raises(LessonkitError, match="got Hostile \\(unprintable\\)"):
        resolve_model(Hostile())


def test_a_config_file_is_named_after_its_folder_or_itself(tmp_path):
    config = json.dumps(get_preset("llama-3.2-1b").to_hf_config().to_dict())
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(config)
    (folder / "llama-variant.json").write_text(config)
    assert ModelSpec.from_hf_config(folder / "config.json").name == "my-llama"
    assert ModelSpec.from_hf_config(folder / "llama-variant.json").name == "llama-variant"
