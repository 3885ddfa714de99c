"""The explorers' controls: one widget per setting, its allowed values and its CSS class.

``build_controls`` makes the widgets (checking the starting values first, so a bad one is a
clear LessonkitError), ``split_defaults`` sorts an explorer's keyword arguments into starting
values and fixed estimate settings, and the helpers below keep controls consistent with each
other (a method brings its usual precision; LoRA rank and ZeRO stage are greyed out where they
do not apply; a memory saver is greyed out, with the reason, where ``estimate`` refuses it).
ipywidgets is imported only when a widget is built.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ..errors import LessonkitError
from ..options import DEFAULT_LOSS_CHUNKS, LOSSES, METHODS, OPTIMIZERS, PRECISIONS, ZERO_STAGES
from ..planning.fitting import usual_precision

MODEL_SIZES = ("0.5B", "1B", "3B", "7B", "8B", "13B", "34B", "70B")
SEQ_LENS = tuple(2**k for k in range(7, 16))  # 128 .. 32768
LORA_RANKS = tuple(2**k for k in range(9))  # 1 .. 256
GPU_COUNTS = (1, 2, 4, 8)
LORA_DROPOUTS = (0.0, 0.05, 0.1)  # peft's default, and what LitGPT, TRL and axolotl recipes use
TOKEN_COUNTS = (1e6, 1e7, 1e8, 1e9)
LOSS_CHUNK_COUNTS = tuple(2**k for k in range(8))  # 1 .. 128, the shortest sequence
LOSS_LABELS = {"standard": "standard cross-entropy", "chunked": "chunked cross-entropy"}
# What each memory saver does, shown as its control's tooltip.
SAVER_TIPS = {
    "activation_offload": "The tensors saved for the backward pass (with checkpointing: each "
    "layer's input) wait in CPU memory (torchtune's OffloadActivations, "
    "TRL's activation_offloading).",
    "optimizer_in_backward": "Each parameter takes its optimizer step as soon as its gradient "
    "is ready, so gradients are freed layer by layer (torchtune's "
    "optimizer_in_bwd).",
    "loss": "Standard: the whole logits upcast to fp32 at once (transformers). Chunked: the "
    "output layer and the fp32 upcast one chunk of the sequence at a time (torchtune's "
    "CEWithChunkedOutputLoss).",
    "loss_chunks": "How many pieces of the sequence the chunked loss works through one after "
    "the other: more chunks, a smaller fp32 copy of the logits at a time "
    "(torchtune uses 8).",
}
# Estimate keyword -> (CSS name, label) of its control.
CONTROL_NAMES = {
    "model": ("model", "Model"),
    "method": ("method", "Method"),
    "precision": ("precision", "Precision"),
    "optimizer": ("optimizer", "Optimizer"),
    "batch_size": ("batch", "Batch size per GPU"),
    "seq_len": ("seq", "Sequence length"),
    "lora_rank": ("rank", "LoRA rank"),
    "lora_dropout": ("dropout", "LoRA dropout"),
    "gradient_checkpointing": ("checkpointing", "Gradient checkpointing"),
    "activation_offload": ("activation-offload", "Activation offload"),
    "optimizer_in_backward": ("optimizer-in-backward", "Optimizer step in backward"),
    "loss": ("loss", "Loss"),
    "loss_chunks": ("chunks", "Chunks"),
    "n_gpus": ("gpus", "GPUs"),
    "zero_stage": ("zero", "ZeRO stage"),
    "gpu_set": ("gpu-set", "GPUs shown"),
    "tokens": ("tokens", "Training tokens"),
    "size": ("size", "Model size"),
    "budget": ("budget", "Budget"),
}


def _release_date(preset: str) -> str:
    """The preset's release date (YYYY-MM-DD) as its note states it; "" where it states none."""
    from ..models.presets import get_preset

    found = re.search(r"as of (\d{4}-\d{2}-\d{2})", get_preset(preset).note)
    return found.group(1) if found else ""


def model_menu() -> list[tuple[str, str]]:
    """The model menu as (label, value) pairs: the sizes, then the presets grouped by family.

    ipywidgets' Dropdown has no option groups, so each preset's label names its family
    ("Qwen3 — qwen3-8b"); the families come newest generation first (by the latest release
    among their presets), each family's presets in preset_groups' order. The value stays the
    preset's name.
    """
    from ..models.presets import preset_groups

    groups = list(preset_groups().items())
    newest = {family: max(_release_date(p) for p in names) for family, names in groups}
    groups.sort(key=lambda group: newest[group[0]], reverse=True)  # stable: ties keep their order
    options = [(size, size) for size in MODEL_SIZES]
    options += [(f"{family} — {preset}", preset) for family, names in groups for preset in names]
    return options


def build_control(name: str, value: Any, continuous: bool) -> Any:
    """The widget for setting ``name`` at ``value``, with its label and CSS class."""
    import ipywidgets as W

    css, label = CONTROL_NAMES[name]
    style = {"description_width": "initial"}
    layout = W.Layout(width="auto")
    if name == "model":
        options = model_menu()
        if value not in [v for _, v in options]:
            from ..models.presets import resolve_model

            options.insert(0, (resolve_model(value).name, value))
        widget, kind = (
            W.Dropdown(options=options, value=value, description=label, style=style),
            "dropdown",
        )
    elif name == "method":
        widget, kind = (
            W.ToggleButtons(
                options=list(METHODS),
                value=value,
                description=label,
                style={**style, "button_width": "5.5em"},
            ),
            "toggle",
        )
    elif name in ("precision", "optimizer", "zero_stage", "lora_dropout"):
        menus: dict[str, tuple[Any, ...]] = {
            "precision": PRECISIONS,
            "optimizer": OPTIMIZERS,
            "zero_stage": ZERO_STAGES,
            "lora_dropout": LORA_DROPOUTS,
        }
        widget, kind = (
            W.Dropdown(
                options=list(menus[name]),
                value=value,
                description=label,
                style=style,
                layout=layout,
            ),
            "dropdown",
        )
    elif name == "batch_size":
        widget, kind = (
            W.IntSlider(
                value=value,
                min=1,
                max=64,
                description=label,
                style=style,
                continuous_update=continuous,
            ),
            "slider",
        )
    elif name in ("seq_len", "lora_rank", "n_gpus", "tokens"):
        steps: tuple[Any, ...] = {
            "seq_len": SEQ_LENS,
            "lora_rank": LORA_RANKS,
            "n_gpus": GPU_COUNTS,
            "tokens": TOKEN_COUNTS,
        }[name]
        pairs = [(f"{v / 1e6:g}M" if name == "tokens" else str(v), v) for v in steps]
        widget, kind = (
            W.SelectionSlider(
                options=pairs,
                value=value,
                description=label,
                style=style,
                continuous_update=continuous,
            ),
            "slider",
        )
    elif name in ("gradient_checkpointing", "activation_offload", "optimizer_in_backward"):
        widget, kind = (
            W.Checkbox(value=bool(value), description=label, indent=False, layout=layout),
            "checkbox",
        )
    elif name == "loss":
        widget, kind = (
            W.Dropdown(
                options=[(LOSS_LABELS[v], v) for v in LOSSES],
                value=value,
                description=label,
                style=style,  # apart from a checkbox
                layout=W.Layout(width="auto", margin="2px 2px 2px 1.5em"),
            ),
            "dropdown",
        )
    elif name == "loss_chunks":
        widget, kind = (
            W.Dropdown(
                options=list(LOSS_CHUNK_COUNTS),
                value=value,
                description=label,
                style=style,
                layout=layout,
            ),
            "dropdown",
        )
    elif name == "gpu_set":
        widget, kind = (
            W.ToggleButtons(
                options=["Guide's four", "All"], value=value, description=label, style=style
            ),
            "toggle",
        )
    elif name == "size":
        widget, kind = (
            W.Dropdown(
                options=list(MODEL_SIZES),
                value=value,
                description=label,
                style=style,
                layout=layout,
            ),
            "dropdown",
        )
    else:  # budget
        widget, kind = (
            W.ToggleButtons(options=["Low", "High"], value=value, description=label, style=style),
            "toggle",
        )
    if name in SAVER_TIPS:
        set_tooltip(widget, SAVER_TIPS[name])
    widget.add_class(f"lessonkit-{kind}-{css}")
    return widget


def set_tooltip(widget: Any, text: str) -> None:
    """Set the hover text: ``tooltip`` in ipywidgets 8, ``description_tooltip`` in 7 (Colab)."""
    name = "tooltip" if widget.has_trait("tooltip") else "description_tooltip"
    if getattr(widget, name) != text:
        setattr(widget, name, text)


ALLOWED = {  # allowed values of each control, for clear errors on bad defaults
    "method": METHODS,
    "precision": PRECISIONS,
    "optimizer": OPTIMIZERS,
    "zero_stage": ZERO_STAGES,
    "seq_len": SEQ_LENS,
    "lora_rank": LORA_RANKS,
    "lora_dropout": LORA_DROPOUTS,
    "loss": LOSSES,
    "loss_chunks": LOSS_CHUNK_COUNTS,
    "n_gpus": GPU_COUNTS,
    "tokens": TOKEN_COUNTS,
    "size": MODEL_SIZES,
    "budget": ("Low", "High"),
    "gpu_set": ("Guide's four", "All"),
}
SETUP_DEFAULTS = {  # estimate()'s own defaults, so an explorer starts where estimate() does
    "method": "full",
    "precision": "bf16-mixed",
    "optimizer": "adamw",
    "batch_size": 1,
    "seq_len": 512,
    "lora_rank": 16,
    "gradient_checkpointing": False,
    "n_gpus": 1,
    "zero_stage": 0,
    "lora_dropout": 0.0,
    "activation_offload": False,
    "optimizer_in_backward": False,
    "loss": "standard",
    "loss_chunks": DEFAULT_LOSS_CHUNKS,
}
FLAGS = ("gradient_checkpointing", "activation_offload", "optimizer_in_backward")


def build_controls(names: list[str], values: dict[str, Any], continuous: bool) -> dict[str, Any]:
    """Name -> widget for ``names``; a value not on its control is a LessonkitError."""
    controls = {}
    for name in names:
        value = values[name]
        allowed = ALLOWED.get(name)
        if allowed is not None and (
            value not in allowed or (isinstance(value, bool) and name not in FLAGS)
        ):
            raise LessonkitError(
                f"{CONTROL_NAMES[name][1]} {value!r} is not on the control; "
                f"allowed: {', '.join(map(str, allowed))}."
            )
        if name in FLAGS and not isinstance(value, bool):
            raise LessonkitError(f"{CONTROL_NAMES[name][1]} must be True or False, got {value!r}.")
        if name == "batch_size" and not (isinstance(value, int) and 1 <= value <= 64):
            raise LessonkitError(f"Batch size must be a whole number from 1 to 64, got {value!r}.")
        controls[name] = build_control(name, value, continuous)
    return controls


# The memory-saver checkboxes and what rules each out (the loss menu is never ruled out): (test
# on the estimate keywords, short reason shown on the control, full reason in its tooltip). The
# same rules as settings.validate_run; tests/widgets/test_widgets.py checks them against estimate().
SAVERS = ("activation_offload", "optimizer_in_backward")
SAVER_RULES: dict[str, list[tuple[Callable[[dict[str, Any]], bool], str, str]]] = {
    "activation_offload": [
        (
            lambda s: not s.get("gradient_checkpointing"),
            "needs checkpointing",
            "Activation offload moves the checkpoints (each layer's input) to CPU memory: turn on "
            "Gradient checkpointing (gradient_checkpointing=True) first.",
        ),
        (
            lambda s: s.get("zero_stage") == 3,
            "not with ZeRO-3",
            "Activation offload is modelled without ZeRO-3 only: choose ZeRO stage 0, 1 or 2.",
        ),
        (
            lambda s: s.get("method") == "qlora" and s.get("bitsandbytes", "current") != "current",
            "not with old bitsandbytes",
            "Activation offload is modelled with current bitsandbytes only (older releases keep "
            "each 4-bit layer's input where offloading does not reach it).",
        ),
    ],
    "optimizer_in_backward": [
        (
            lambda s: s.get("n_gpus", 1) > 1,
            "one GPU only",
            "The optimizer step in backward is modelled on one GPU: set GPUs to 1 (n_gpus=1).",
        ),
        (
            lambda s: s.get("gradient_accumulation", 1) > 1,
            "not with accumulation",
            "The optimizer step in backward steps each parameter as soon as its gradient is "
            "ready, so there is nothing to accumulate: it needs gradient_accumulation=1.",
        ),
        (
            lambda s: bool(s.get("offload_optimizer")),
            "not with optimizer offload",
            "The optimizer step in backward is modelled without optimizer offload "
            "(offload_optimizer=False).",
        ),
    ],
}


def saver_blocked(name: str, settings: dict[str, Any]) -> tuple[str, str] | None:
    """(short reason, full reason) why memory saver ``name`` cannot be on with these
    ``estimate`` keywords; None where it can."""
    for test, short, full in SAVER_RULES[name]:
        if test(settings):
            return short, full
    return None


def split_defaults(
    names: list[str], model: Any, defaults: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Values for the controls, and the fixed estimate settings passed through unchanged.
    A memory saver started where it cannot be on is a LessonkitError saying why."""
    import inspect

    from ..memory.estimating import estimate

    known = set(inspect.signature(estimate).parameters) - {"model"}
    values = {**SETUP_DEFAULTS, "model": model}
    fixed = {}
    for key, value in defaults.items():
        if key in names:
            values[key] = value
        elif key in known:
            fixed[key] = value
        else:
            raise LessonkitError(
                f"Unknown setting {key!r}; the explorer takes "
                f"{', '.join(sorted(set(names) | known))}."
            )
    if "precision" in names and "precision" not in defaults and values["method"] in METHODS:
        values["precision"] = usual_precision(values["method"])
    for name in SAVERS:
        why = saver_blocked(name, {**values, **fixed}) if name in names else None
        if values[name] is True and why is not None:
            raise LessonkitError(
                f"{name}=True cannot be a starting value here ({why[0]}). {why[1]}"
            )
    return values, fixed


def precision_follows_method(controls: dict[str, Any]) -> Callable[[Any], None]:
    """A link: choosing a method moves precision to that method's usual one (the student can
    change it afterwards)."""

    def link(change: Any) -> None:
        if change["owner"] is controls["method"] and "precision" in controls:
            controls["precision"].value = usual_precision(change["new"])

    return link


def savers_follow(controls: dict[str, Any], fixed: dict[str, Any]) -> Callable[[Any], None]:
    """A link: a memory saver that a change rules out (e.g. activation offload when
    checkpointing is turned off) switches itself off, so the readout never shows an error
    for it; ``sync_enabled`` greys it out and says why."""

    def link(change: Any) -> None:
        settings = {**{k: w.value for k, w in controls.items()}, **fixed}
        for name in SAVERS:
            if name in controls and controls[name].value and saver_blocked(name, settings):
                controls[name].value = settings[name] = False

    return link


def estimate_settings(controls: dict[str, Any], fixed: dict[str, Any]) -> dict[str, Any]:
    """The ``estimate`` keywords the controls and the fixed settings stand for; a memory saver
    ruled out by the others counts as off."""
    settings = {k: w.value for k, w in controls.items() if k in SETUP_DEFAULTS}
    if "lora_targets" not in fixed and "model" in controls:
        from ..models.presets import resolve_model

        # GPT-2 names its attention projection c_attn (peft's default target for it).
        if resolve_model(controls["model"].value).family == "gpt2":
            settings["lora_targets"] = ("c_attn",)
    settings = {**settings, **fixed}
    if settings.get("loss") == "standard" and "loss" in controls:
        settings.pop("loss_chunks", None)  # a fixed chunk count applies once chunked is chosen
    for name in SAVERS:
        if name in controls and settings[name] and saver_blocked(name, settings):
            settings[name] = False
    if settings.get("no_sync") and (
        settings.get("n_gpus", 1) == 1 or settings.get("zero_stage") == 2
    ):
        settings["no_sync"] = False  # a fixed no_sync applies where estimate takes it
    return settings


def sync_enabled(controls: dict[str, Any], settings: dict[str, Any] | None = None) -> None:
    """Grey out LoRA rank and dropout for full fine-tuning, the ZeRO stage on one GPU, and a
    memory saver that ``settings`` (the estimate keywords) rule out, saying why on it."""
    for name in ("lora_rank", "lora_dropout"):
        if name in controls:
            controls[name].disabled = controls["method"].value == "full"
    if "zero_stage" in controls and "n_gpus" in controls:
        controls["zero_stage"].disabled = controls["n_gpus"].value == 1
    if "loss_chunks" in controls and "loss" in controls:
        controls["loss_chunks"].disabled = controls["loss"].value != "chunked"
    for name in SAVERS:
        if name not in controls:
            continue
        widget, label = controls[name], CONTROL_NAMES[name][1]
        why = saver_blocked(
            name, settings if settings is not None else {k: w.value for k, w in controls.items()}
        )
        widget.disabled = why is not None
        widget.description = label if why is None else f"{label} ({why[0]})"
        set_tooltip(widget, SAVER_TIPS[name] if why is None else why[1])


def tooltips_shown() -> bool:
    """True where the front end shows a control's hover text: ipywidgets 8 (``tooltip``).
    ipywidgets 7 (Colab's) drops a checkbox's ``description_tooltip``."""
    import ipywidgets as W

    return bool(W.Checkbox().has_trait("tooltip"))


def blocked_reasons(controls: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """'Label: full reason' for each memory saver that ``settings`` rule out."""
    reasons = []
    for name in SAVERS:
        why = saver_blocked(name, settings) if name in controls else None
        if why is not None:
            reasons.append(f"{CONTROL_NAMES[name][1]}: {why[1]}")
    return reasons


def show_reasons(notes: Any, controls: dict[str, Any], settings: dict[str, Any]) -> None:
    """Where tooltips do not show (ipywidgets 7), write why each greyed-out memory saver is
    greyed out in ``notes`` (an HTML widget), as text under the controls."""
    import html

    reasons = [] if tooltips_shown() else blocked_reasons(controls, settings)
    value = "<br>".join(html.escape(r) for r in reasons)
    value = f"<small>{value}</small>" if value else ""
    if notes.value != value:
        notes.value = value
        notes.layout.display = None if value else "none"
