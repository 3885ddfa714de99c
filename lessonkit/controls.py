"""The explorers' controls: one widget per setting, its allowed values and its CSS class.

``build_controls`` makes the widgets (checking the starting values first, so a bad one is a
clear LessonkitError), ``split_defaults`` sorts an explorer's keyword arguments into starting
values and fixed estimate settings, and the helpers below keep controls consistent with each
other (a method brings its usual precision; LoRA rank and ZeRO stage are greyed out where they
do not apply). ipywidgets is imported only when a widget is built.
"""

from __future__ import annotations

from typing import Any, Callable

from .errors import LessonkitError
from .fitting import usual_precision
from .options import METHODS, OPTIMIZERS, PRECISIONS, ZERO_STAGES

MODEL_SIZES = ("0.5B", "1B", "3B", "7B", "8B", "13B", "34B", "70B")
SEQ_LENS = tuple(2**k for k in range(7, 16))          # 128 .. 32768
LORA_RANKS = tuple(2**k for k in range(0, 9))         # 1 .. 256
GPU_COUNTS = (1, 2, 4, 8)
LORA_DROPOUTS = (0.0, 0.05, 0.1)  # peft's default, and what LitGPT, TRL and axolotl recipes use
TOKEN_COUNTS = (1e6, 1e7, 1e8, 1e9)
# Estimate keyword -> (CSS name, label) of its control.
CONTROL_NAMES = {
    "model": ("model", "Model"), "method": ("method", "Method"),
    "precision": ("precision", "Precision"), "optimizer": ("optimizer", "Optimizer"),
    "batch_size": ("batch", "Batch size"), "seq_len": ("seq", "Sequence length"),
    "lora_rank": ("rank", "LoRA rank"), "lora_dropout": ("dropout", "LoRA dropout"),
    "gradient_checkpointing": ("checkpointing",
                                                                  "Gradient checkpointing"),
    "n_gpus": ("gpus", "GPUs"), "zero_stage": ("zero", "ZeRO stage"),
    "gpu_set": ("gpu-set", "GPUs shown"), "tokens": ("tokens", "Training tokens"),
    "size": ("size", "Model size"), "budget": ("budget", "Budget"),
}


def build_control(name: str, value: Any, continuous: bool) -> Any:
    """The widget for setting ``name`` at ``value``, with its label and CSS class."""
    import ipywidgets as W

    css, label = CONTROL_NAMES[name]
    style = {"description_width": "initial"}
    layout = W.Layout(width="auto")
    if name == "model":
        options = [(m, m) for m in MODEL_SIZES]
        from .models import preset_names
        options += [(p, p) for p in preset_names()]
        if value not in [v for _, v in options]:
            from .models import resolve_model
            options.insert(0, (resolve_model(value).name, value))
        widget, kind = W.Dropdown(options=options, value=value, description=label,
                                  style=style), "dropdown"
    elif name == "method":
        widget, kind = W.ToggleButtons(options=list(METHODS), value=value, description=label,
                                       style={**style, "button_width": "5.5em"}), "toggle"
    elif name in ("precision", "optimizer", "zero_stage", "lora_dropout"):
        options = {"precision": PRECISIONS, "optimizer": OPTIMIZERS, "zero_stage": ZERO_STAGES,
                   "lora_dropout": LORA_DROPOUTS}
        widget, kind = W.Dropdown(options=list(options[name]), value=value, description=label,
                                  style=style, layout=layout), "dropdown"
    elif name == "batch_size":
        widget, kind = W.IntSlider(value=value, min=1, max=64, description=label, style=style,
                                   continuous_update=continuous), "slider"
    elif name in ("seq_len", "lora_rank", "n_gpus", "tokens"):
        options = {"seq_len": SEQ_LENS, "lora_rank": LORA_RANKS, "n_gpus": GPU_COUNTS,
                   "tokens": TOKEN_COUNTS}[name]
        pairs = [(f"{v / 1e6:g}M" if name == "tokens" else str(v), v) for v in options]
        widget, kind = W.SelectionSlider(options=pairs, value=value, description=label,
                                         style=style, continuous_update=continuous), "slider"
    elif name == "gradient_checkpointing":
        widget, kind = W.Checkbox(value=bool(value), description=label, indent=False,
                                  layout=layout), "checkbox"
    elif name == "gpu_set":
        widget, kind = W.ToggleButtons(options=["Guide's four", "All"], value=value,
                                       description=label, style=style), "toggle"
    elif name == "size":
        widget, kind = W.Dropdown(options=list(MODEL_SIZES), value=value, description=label,
                                  style=style, layout=layout), "dropdown"
    else:  # budget
        widget, kind = W.ToggleButtons(options=["Low", "High"], value=value, description=label,
                                       style=style), "toggle"
    widget.add_class(f"lessonkit-{kind}-{css}")
    return widget


ALLOWED = {  # allowed values of each control, for clear errors on bad defaults
    "method": METHODS, "precision": PRECISIONS, "optimizer": OPTIMIZERS,
    "zero_stage": ZERO_STAGES, "seq_len": SEQ_LENS, "lora_rank": LORA_RANKS,
    "lora_dropout": LORA_DROPOUTS,
    "n_gpus": GPU_COUNTS, "tokens": TOKEN_COUNTS, "size": MODEL_SIZES,
    "budget": ("Low", "High"), "gpu_set": ("Guide's four", "All"),
}
SETUP_DEFAULTS = {  # estimate()'s own defaults, so an explorer starts where estimate() does
    "method": "full", "precision": "bf16-mixed", "optimizer": "adamw", "batch_size": 1,
    "seq_len": 512, "lora_rank": 16, "gradient_checkpointing": False, "n_gpus": 1,
    "zero_stage": 0, "lora_dropout": 0.0,
}


def build_controls(names: list[str], values: dict[str, Any], continuous: bool) -> dict[str, Any]:
    """Name -> widget for ``names``; a value not on its control is a LessonkitError."""
    controls = {}
    for name in names:
        value = values[name]
        allowed = ALLOWED.get(name)
        if allowed is not None and value not in allowed:
            raise LessonkitError(f"{CONTROL_NAMES[name][1]} {value!r} is not on the control; "
                                 f"allowed: {', '.join(map(str, allowed))}.")
        if name == "batch_size" and not (isinstance(value, int) and 1 <= value <= 64):
            raise LessonkitError(f"Batch size must be a whole number from 1 to 64, got {value!r}.")
        controls[name] = build_control(name, value, continuous)
    return controls


def split_defaults(names: list[str], model: Any, defaults: dict[str, Any]
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Values for the controls, and the fixed estimate settings passed through unchanged."""
    import inspect

    from .vram import estimate

    known = set(inspect.signature(estimate).parameters) - {"model"}
    values = {**SETUP_DEFAULTS, "model": model}
    fixed = {}
    for key, value in defaults.items():
        if key in names:
            values[key] = value
        elif key in known:
            fixed[key] = value
        else:
            raise LessonkitError(f"Unknown setting {key!r}; the explorer takes "
                                 f"{', '.join(sorted(set(names) | known))}.")
    if "precision" in names and "precision" not in defaults and values["method"] in METHODS:
        values["precision"] = usual_precision(values["method"])
    return values, fixed


def precision_follows_method(controls: dict[str, Any]) -> Callable[[Any], None]:
    """A link: choosing a method moves precision to that method's usual one (the student can
    change it afterwards)."""
    def link(change: Any) -> None:
        if change["owner"] is controls["method"] and "precision" in controls:
            controls["precision"].value = usual_precision(change["new"])
    return link


def estimate_settings(controls: dict[str, Any], fixed: dict[str, Any]) -> dict[str, Any]:
    """The ``estimate`` keywords the controls and the fixed settings stand for."""
    settings = {k: w.value for k, w in controls.items() if k in SETUP_DEFAULTS}
    if "lora_targets" not in fixed and "model" in controls:
        from .models import resolve_model

        # GPT-2 names its attention projection c_attn (peft's default target for it).
        if resolve_model(controls["model"].value).family == "gpt2":
            settings["lora_targets"] = ("c_attn",)
    return {**settings, **fixed}


def sync_enabled(controls: dict[str, Any]) -> None:
    """Grey out LoRA rank and dropout for full fine-tuning and the ZeRO stage on one GPU."""
    for name in ("lora_rank", "lora_dropout"):
        if name in controls:
            controls[name].disabled = controls["method"].value == "full"
    if "zero_stage" in controls and "n_gpus" in controls:
        controls["zero_stage"].disabled = controls["n_gpus"].value == 1
