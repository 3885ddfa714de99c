"""'The usual recipe' against the real libraries: each default in lessonkit/data/recipes.json
is what the installed transformers and peft do, and it reaches estimate()."""

from __future__ import annotations

import inspect

import pytest

from lessonkit import LessonkitError, estimate
from lessonkit.models.recipes import not_modelled, recipe_defaults, recipe_names, usual_recipe

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def _value(recipe: str, setting: str):
    return next(d["value"] for d in recipe_defaults(recipe) if d["setting"] == setting)


def test_trainer_defaults_are_what_training_arguments_does(tmp_path) -> None:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), bf16=True, use_cpu=True, report_to=[]
    )
    assert str(getattr(args.optim, "value", args.optim)) == _value(
        "trainer", "TrainingArguments.optim"
    )
    assert args.per_device_train_batch_size == _value(
        "trainer", "TrainingArguments.per_device_train_batch_size"
    )
    assert args.gradient_checkpointing == _value(
        "trainer", "TrainingArguments.gradient_checkpointing"
    )
    assert args.gradient_accumulation_steps == _value(
        "trainer", "TrainingArguments.gradient_accumulation_steps"
    )


def test_trainer_skips_the_reduction_before_the_last_micro_batch() -> None:
    """Under FSDP with accumulation the Trainer keeps full gradients (estimate no_sync=True):
    Accelerate's sync_each_batch is False unless set, and the Trainer then runs every
    micro-batch but the last under accelerator.no_sync, which for FSDP2 turns the gradient
    sync off."""
    accelerate = pytest.importorskip("accelerate")
    from accelerate.utils import GradientAccumulationPlugin

    default = _value(
        "trainer", "GradientAccumulationPlugin.sync_each_batch (Accelerate, used by the Trainer)"
    )
    assert GradientAccumulationPlugin(num_steps=2).sync_each_batch is default is False
    loop = inspect.getsource(transformers.Trainer)
    assert 'plugin_kwargs.get("sync_each_batch", False)' in loop
    assert "self.accelerator.no_sync" in loop
    no_sync = inspect.getsource(accelerate.Accelerator.no_sync)
    assert "set_requires_gradient_sync(False)" in no_sync
    when = next(d["when"] for d in recipe_defaults("trainer") if "sync_each_batch" in d["setting"])
    kept = estimate("llama-2-7b", n_gpus=8, gradient_accumulation=4, **when)
    synced = estimate("llama-2-7b", n_gpus=8, gradient_accumulation=4, zero_stage=3)
    assert (
        kept.settings["estimated"]["gradient_bytes"]
        == 8 * synced.settings["estimated"]["gradient_bytes"]
    )


def test_from_pretrained_loads_the_checkpoint_dtype_by_default() -> None:
    doc = inspect.getdoc(transformers.PreTrainedModel.from_pretrained)
    assert 'defaults to `"auto"`' in doc
    assert _value("trainer", "from_pretrained(dtype=...)") == "auto"


def test_peft_lora_dropout_default() -> None:
    peft = pytest.importorskip("peft")
    assert peft.LoraConfig().lora_dropout == _value("peft", "LoraConfig.lora_dropout")


def test_every_default_has_a_source_and_a_date() -> None:
    for name in recipe_names():
        for d in recipe_defaults(name):
            assert len(d["source"]) > 20 and d["as_of"][:2] == "20"


def test_the_recipes_reach_the_estimate() -> None:
    trainer = usual_recipe("trainer")
    assert trainer["optimizer"] == "adamw-fused" and trainer["precision"] == "bf16"
    report = estimate("qwen2.5-0.5b", seq_len=1024, **trainer)
    assert report.settings["optimizer"] == "adamw-fused"
    sft = usual_recipe("sft")
    assert sft["gradient_checkpointing"] and sft["seq_len"] == 1024
    # the same run with SFTTrainer's checkpointing needs less
    assert estimate("qwen2.5-0.5b", **sft).total_bytes < report.total_bytes
    assert any("chunked_nll" in line for line in not_modelled("sft"))
    with pytest.raises(LessonkitError, match="recipe"):
        usual_recipe("axolotl-magic")


def test_the_doc_lists_every_default() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "usual-recipe.md").read_text()
    for name in recipe_names():
        for d in recipe_defaults(name):
            assert f"| `{d['setting']}` | `{d['value']!r}` |" in doc, d["setting"]
