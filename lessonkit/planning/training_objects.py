"""estimate() settings read from the objects a learner already has, without loading weights.

``describe_run`` takes any of: a transformers ``Trainer`` (its ``args`` and ``model``), a
``TrainingArguments`` (or TRL's ``SFTConfig``), a peft ``LoraConfig`` (or a ``PeftModel``), a
``BitsAndBytesConfig``, a model config (``AutoConfig``, a config dict), a model (only its
``config``, ``dtype`` and adapter settings are read), a dict of estimate() keywords, or a model
name or size. Everything is duck-typed: nothing here imports transformers, peft or torch, and an
object that is none of these is noted and skipped, never an error.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import real_number
from ..memory.settings import usual_precision
from ..models.experts import EXPERT_TARGETS
from ..safe_repr import describe_error, short_repr

# TrainingArguments.optim (transformers OptimizerNames) -> estimate()'s optimizer; what is not
# listed is reported as not modelled and the default is kept.
OPTIM_NAMES = {
    "adamw_torch": "adamw",
    "adamw_hf": "adamw",
    "adamw_torch_xla": "adamw",
    "adamw_apex_fused": "adamw-fused",
    "adamw_torch_fused": "adamw-fused",
    "adamw_torch_4bit": None,
    "adamw_torch_8bit": None,
    "adamw_bnb_8bit": "adamw-8bit",
    "adamw_8bit": "adamw-8bit",
    "paged_adamw_8bit": "paged-adamw-8bit",
    "paged_adamw": "paged-adamw-32bit",
    "paged_adamw_32bit": "paged-adamw-32bit",
    "adafactor": "adafactor",
    "sgd": "sgd",
    "lion_32bit": "lion",
    "paged_lion_32bit": "lion",
}
# Settings this module may produce; those estimate() does not take are reported, not passed.
_DERIVED = (
    "method",
    "precision",
    "optimizer",
    "batch_size",
    "seq_len",
    "gradient_checkpointing",
    "lora_rank",
    "lora_targets",
    "zero_stage",
    "offload_optimizer",
    "double_quant",
    "gradient_accumulation",
    "lora_dropout",
)


@dataclass
class RunDescription:
    """A run read from objects: the model (what ``resolve_model`` takes, or None), estimate()
    keywords, and notes saying where each came from and what was assumed."""

    model: Any = None
    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def estimate_keywords() -> set[str]:
    """The keyword arguments estimate() takes."""
    from ..memory.estimating import estimate

    return {
        name
        for name, p in inspect.signature(estimate).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def _get(obj: Any, name: str) -> Any:
    """An attribute or key of ``obj``, or None (also when reading it raises)."""
    try:
        if isinstance(obj, Mapping):
            return obj.get(name)
        return getattr(obj, name, None)
    except Exception:
        return None


def _text(value: Any) -> str:
    inner = _get(value, "value")  # an enum such as transformers' OptimizerNames
    if isinstance(inner, str):
        return inner
    try:
        return str(value)
    except Exception:
        return "?"


def _kind(obj: Any) -> str:
    if obj is None:
        return "none"
    if isinstance(obj, (str, int, float, Path)) and not isinstance(obj, bool):
        return "model"
    if type(obj).__name__ == "ModelSpec":
        return "model"
    if isinstance(obj, Mapping):
        return "config" if "model_type" in obj else "settings"
    if _get(obj, "per_device_train_batch_size") is not None:
        return "training_args"
    if (
        _get(obj, "args") is not None
        and _get(obj, "model") is not None
        and callable(_get(obj, "train"))
    ):
        return "trainer"
    if isinstance(_get(obj, "r"), int) and hasattr(obj, "target_modules"):
        return "lora"
    if any(
        _get(obj, k) is not None for k in ("load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type")
    ):
        return "bnb"
    if _get(obj, "model_type") is not None and callable(_get(obj, "to_dict")):
        return "config"
    config = _get(obj, "config")
    if config is not None and _get(config, "model_type") is not None:
        return "hf_model"
    return "unknown"


class _Reader:
    def __init__(self) -> None:
        self.facts: dict[str, Any] = {}
        self.out = RunDescription()

    def note(self, text: str) -> None:
        if text not in self.out.notes:
            self.out.notes.append(text)

    def read(self, obj: Any, depth: int = 0) -> None:
        kind = _kind(obj)
        if depth > 4 or kind == "none":
            return
        if kind == "model":
            self.out.model = obj
        elif kind == "settings":
            self.facts.setdefault("explicit", {}).update({str(k): v for k, v in obj.items()})
        elif kind == "config":
            self._config(obj)
        elif kind == "trainer":
            self.read(_get(obj, "args"), depth + 1)
            self.read(_get(obj, "model"), depth + 1)
        elif kind == "training_args":
            self._training_args(obj)
        elif kind == "lora":
            self._lora(obj)
        elif kind == "bnb":
            self._bnb(obj)
        elif kind == "hf_model":
            self._model(obj, depth)
        else:
            self.note(
                f"Skipped an object of type {type(obj).__name__}: not a Trainer, "
                "TrainingArguments, LoraConfig, BitsAndBytesConfig, model config or model."
            )

    def _config(self, config: Any) -> None:
        data = config if isinstance(config, Mapping) else None
        if data is None:
            try:
                data = config.to_dict()
            except Exception as err:
                self.note(f"Could not read the model config ({type(err).__name__}).")
                return
        self.out.model = dict(data)
        quant = data.get("quantization_config")
        if quant is not None:
            self._bnb(quant)

    def _model(self, model: Any, depth: int) -> None:
        self.read(_get(model, "config"), depth + 1)
        dtype = _text(_get(model, "dtype")).replace("torch.", "")
        if dtype in ("bfloat16", "float16", "float32"):
            self.facts["base_dtype"] = dtype
        peft = _get(model, "peft_config")
        if isinstance(peft, Mapping) and peft:
            self._lora(next(iter(peft.values())))
        if _get(model, "is_loaded_in_4bit") is True:
            self.facts["four_bit"] = True

    def _training_args(self, args: Any) -> None:
        f = self.facts
        f["batch_size"] = _get(args, "per_device_train_batch_size")
        f["gradient_accumulation"] = _get(args, "gradient_accumulation_steps")
        # transformers 5 renames gradient_checkpointing to activation_checkpointing
        flags = [_get(args, n) for n in ("activation_checkpointing", "gradient_checkpointing")]
        if any(flag is not None for flag in flags):
            f["gradient_checkpointing"] = any(bool(flag) for flag in flags)
        f["bf16"], f["fp16"] = bool(_get(args, "bf16")), bool(_get(args, "fp16"))
        f["args"] = True
        for name in ("max_length", "max_seq_length"):  # TRL's SFTConfig (new, old name)
            if isinstance(_get(args, name), int) and _get(args, name) > 0:
                f["seq_len"] = _get(args, name)
                self.note(f"Sequence length {f['seq_len']} from {type(args).__name__}.{name}.")
                break
        optim = _get(args, "optim")
        if optim is not None:
            name = _text(optim)
            mapped = OPTIM_NAMES.get(name)
            if mapped:
                f["optimizer"] = mapped
            else:
                self.note(
                    f"optim={name!r} is not modelled; the estimate keeps its default optimizer."
                )
        if _get(args, "auto_find_batch_size"):
            self.note(
                "auto_find_batch_size=True: Trainer halves the batch after each "
                "out-of-memory error."
            )
        fsdp = _get(args, "fsdp")
        if fsdp and fsdp not in ("", [], False):
            f["zero_stage"] = 3
            self.note("FSDP in TrainingArguments: ZeRO-3. Pass n_gpus= for the number of GPUs.")
            # Accelerate's sync_each_batch (default False): the Trainer then reduces only on
            # the last micro-batch, and FSDP keeps full gradients until then
            kwargs = _get(_get(args, "accelerator_config"), "gradient_accumulation_kwargs")
            f["fsdp_no_sync"] = not (
                isinstance(kwargs, Mapping) and kwargs.get("sync_each_batch") is True
            )
        self._deepspeed(_get(args, "deepspeed"))
        self.note(
            f"Batch, accumulation, checkpointing, precision flags and optimizer from "
            f"{type(args).__name__}."
        )

    def _deepspeed(self, config: Any) -> None:
        if not config:
            return
        if isinstance(config, (str, Path)):
            try:
                config = json.loads(Path(config).read_text())
            except (OSError, ValueError):
                self.note(f"Could not read the DeepSpeed config {str(config)!r}.")
                return
        zero = _get(config, "zero_optimization") or {}
        stage = _get(zero, "stage")
        if stage in (0, 1, 2, 3):
            self.facts["zero_stage"] = stage
        offload = _get(zero, "offload_optimizer") or {}
        if _get(offload, "device") in ("cpu", "nvme"):
            self.facts["offload_optimizer"] = True
        self.note(f"DeepSpeed ZeRO-{stage}. Pass n_gpus= for the number of GPUs.")

    def _lora(self, config: Any) -> None:
        f = self.facts
        f["lora"] = True
        rank = _get(config, "r")
        if isinstance(rank, int) and rank > 0:
            f["lora_rank"] = rank
        targets = _get(config, "target_modules")
        if targets == "all-linear":
            f["lora_targets"] = "all-linear"
        elif isinstance(targets, (list, tuple, set, frozenset)) and targets:
            f["lora_targets"] = tuple(sorted(str(t) for t in targets))
        elif isinstance(targets, str):
            self.note(
                f"target_modules={targets!r} (a pattern) is not read; the model family's "
                "default targets are assumed."
            )
        parameters = _get(config, "target_parameters")
        if isinstance(parameters, (list, tuple, set, frozenset)) and parameters:
            self._expert_parameters([str(p) for p in parameters])
        dropout = _get(config, "lora_dropout")
        if isinstance(dropout, (int, float)) and dropout > 0:
            f["lora_dropout"] = float(dropout)
        self.note("LoRA rank and target modules from the LoRA config.")

    def _expert_parameters(self, names: list[str]) -> None:
        """peft's target_parameters: the experts' 3D weights, by the end of their names."""
        f = self.facts
        read: list[str] = []
        unread: list[str] = []
        for name in names:
            weight = next((t for t in EXPERT_TARGETS if name.endswith(t)), None)
            (read if weight else unread).append(weight or name)
        targets = f.get("lora_targets", ())
        if read and isinstance(targets, str):  # all-linear: not spelled out here
            self.note(
                f"target_parameters {names} beside target_modules={targets!r} are not read: "
                "name the linear layers to count LoRA on the experts too."
            )
        elif read:
            f["lora_targets"] = tuple(dict.fromkeys((*targets, *sorted(read))))
        if unread:
            self.note(
                f"target_parameters {unread} are not read (lessonkit models "
                f"{', '.join('mlp.' + t for t in EXPERT_TARGETS)})."
            )

    def _bnb(self, config: Any) -> None:
        if _get(config, "load_in_4bit"):
            self.facts["four_bit"] = True
            if _get(config, "bnb_4bit_use_double_quant") is not None:
                self.facts["double_quant"] = bool(_get(config, "bnb_4bit_use_double_quant"))
            self.note("4-bit base weights (QLoRA) from the quantization config.")
        elif _get(config, "load_in_8bit"):
            self.facts["eight_bit"] = True
            self.note(
                "8-bit base weights (LLM.int8) are not modelled: estimated as LoRA on a "
                "bf16 base, which is larger."
            )

    def settings(self) -> dict[str, Any]:
        f, s = self.facts, {}
        method = (
            "qlora"
            if f.get("four_bit")
            else "lora"
            if (f.get("lora") or f.get("eight_bit"))
            else "full"
        )
        if f.get("lora") or f.get("four_bit") or f.get("eight_bit") or f.get("args"):
            s["method"] = method
        precision = self._precision(method)
        if precision:
            s["precision"] = precision
        for name in _DERIVED:
            if name in f and f[name] is not None and name not in ("method", "precision"):
                s[name] = f[name]
        return s

    def _precision(self, method: str) -> str | None:
        f = self.facts
        base = f.get("base_dtype")
        if method == "qlora":
            return "bf16" if (f.get("args") or f.get("four_bit")) else None
        if base in ("bfloat16", "float16"):
            if base == "float16":
                self.note("An fp16 model is estimated as bf16 (the same bytes).")
            return "bf16"
        if f.get("bf16") or f.get("fp16"):
            mixed = "bf16-mixed" if f.get("bf16") else "fp16-mixed"
            if method != "full" and base is None:
                self.note(
                    "LoRA: the base model's dtype is not in the objects; the usual bf16 "
                    "base is assumed (pass the model, or precision=)."
                )
                return usual_precision(method)
            return mixed
        if f.get("args"):
            if method != "full" and base is None:
                return usual_precision(method)
            return "fp32"
        return None


def describe_run(*objects: Any, model: Any = None, **settings: Any) -> RunDescription:
    """Read a run from objects (see the module doc); ``model`` and keyword ``settings`` win over
    what the objects say. Never raises: what cannot be read is noted."""
    try:
        return _describe(objects, model, settings)
    except Exception as err:  # objects whose attributes misbehave in ways not foreseen
        return RunDescription(
            model=model,
            settings=dict(settings),
            notes=[
                f"Could not read the objects given ({describe_error(err)}); only model= "
                "and the keyword settings are used."
            ],
        )


def _more_than_one(value: Any) -> bool:
    number = real_number(value)
    return number is not None and number > 1


def _describe(objects: tuple[Any, ...], model: Any, settings: dict[str, Any]) -> RunDescription:
    reader = _Reader()
    for obj in (*objects, model):
        try:
            reader.read(obj)
        except Exception as err:  # an object whose attributes misbehave
            reader.note(
                f"Could not read an object of type {type(obj).__name__} ({type(err).__name__})."
            )
    derived = reader.settings()
    derived.update(reader.facts.get("explicit", {}))
    derived.update(settings)
    if (
        reader.facts.get("fsdp_no_sync")
        and derived.get("zero_stage") == 3
        and _more_than_one(derived.get("gradient_accumulation"))
        and "no_sync" not in settings
    ):
        if _more_than_one(derived.get("n_gpus")):
            derived["no_sync"] = True
            reader.note(
                "FSDP with gradient accumulation: the Trainer reduces gradients on the "
                "last micro-batch only (Accelerate's sync_each_batch=False), so each "
                "GPU keeps full, unsharded gradients (no_sync=True)."
            )
        else:
            reader.note(
                "With several GPUs (n_gpus=) this FSDP run keeps full gradients "
                "between micro-batches (the Trainer's no_sync)."
            )
    if "seq_len" not in derived and reader.facts.get("args"):
        reader.note(
            "No sequence length in the objects (TrainingArguments has none): pass "
            "seq_len= (the longest batch your data makes); estimate()'s default is "
            "assumed."
        )
    known = estimate_keywords()
    out = reader.out
    for name in list(derived):
        if name not in known:
            value = derived.pop(name)
            if name in _DERIVED:
                out.notes.append(
                    f"{name}={short_repr(value)} is not modelled by this version of the "
                    "estimate; left out."
                )
            else:
                out.notes.append(
                    f"Unknown setting {short_repr(name)} left out (estimate() takes "
                    f"{', '.join(sorted(known))})."
                )
    out.settings = derived
    return out
