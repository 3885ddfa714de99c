"""The readout's advice: where the peak is, and the kit's own changes that make a run fit.

``phase_html`` says in which phase of the step the peak falls (forward, backward or optimizer
step), what is largest there, and when a change moved it from another phase. ``fix_advice``
is the search ``lessonkit vram --gpu`` and the OOM doctor use (``fitting.fit_changes``, with
its longer list of changes) for the largest GPU shown, each change with its new peak in GiB.
Two refinements keep it pointed at the right lever: a switch of method that fits only thanks
to the smaller batch it brings (QLoRA at batch 1 where batch 8 alone fits) is left out, and
where the largest part of the peak has a lever of its own (the chunked loss for the logits,
checkpointing for the activations, an 8-bit optimizer for its states) that is not enough
alone, that lever is offered together with the smallest cut of batch or sequence that then
fits. Every estimate goes through ``fitting.estimate_cached``, so a control moved back and
forth costs no new arithmetic.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import LessonkitError
from ..memory.report import LABELS, phase_words
from ..planning.fitting import MIN_SEQ, estimate_cached, fit_changes, usual_precision
from ..units import GiB

MAX_FIXES = 3  # lines of advice at most
SHOWN_PARTS = 3  # parts of the peak named beside its phase


@dataclass(frozen=True)
class Advice:
    """One change that makes the run fit: its estimate() keywords, words and new estimate."""

    change: dict[str, Any]
    words: str
    report: Any


def phase_html(report: Any, previous: Any = None) -> str:
    """HTML: the largest parts at the peak; with ``previous`` (the report shown
    before this change) in another phase, that the peak moved, and from where."""
    parts = sorted(
        ((v, k) for k, v in report.breakdown.items() if v > 0 and k in LABELS),
        reverse=True,
    )[:SHOWN_PARTS]
    largest = ", ".join(f"{_lower(LABELS[k])} {v / GiB:,.1f} GiB" for v, k in parts)
    text = f"Largest there: {html.escape(largest)}."
    if previous is not None and previous.peak_phase != report.peak_phase:
        text += (
            f" <b>The peak moved to the {html.escape(phase_words(report.peak_phase))}</b> "
            f"(from the {html.escape(phase_words(previous.peak_phase))}) with this change."
        )
    return text


def _lower(label: str) -> str:
    """'optimizer states' for 'Optimizer states'; 'CUDA context' stays as it is."""
    return label if label[:2].isupper() else label[0].lower() + label[1:]


def search_settings(report: Any) -> dict[str, Any]:
    """The report's estimate() keywords, hashable (lists as tuples) for the cached estimates."""
    return {
        key: tuple(value) if isinstance(value, list) else value
        for key, value in report.settings.items()
        if key != "estimated"
    }


def change_words(change: dict[str, Any], settings: dict[str, Any]) -> str:
    """A change in words: 'batch 8 per GPU with 8 accumulation steps (the same effective
    batch)', 'the chunked loss', 'sequence 8,192 tokens'."""
    words = []
    for key, value in change.items():
        if key == "gradient_accumulation":
            continue
        if key == "batch_size":
            steps = change.get("gradient_accumulation", settings.get("gradient_accumulation", 1))
            words.append(
                f"batch {value} per GPU with {steps} accumulation steps (the same effective batch)"
            )
        elif key == "seq_len":
            words.append(f"sequence {value:,} tokens (shorter examples: a change to the data)")
        elif key == "loss":
            words.append(
                "the chunked cross-entropy loss" if value == "chunked" else "the standard loss"
            )
        elif key == "gradient_checkpointing":
            words.append("gradient checkpointing" if value else "no gradient checkpointing")
        elif key == "activation_offload" and value:
            words.append("activation offload to CPU")
        elif key == "optimizer_in_backward" and value:
            words.append("the optimizer step in backward")
        elif key == "optimizer":
            words.append(f"optimizer {value}")
        elif key == "method":
            words.append({"lora": "LoRA", "qlora": "QLoRA (4-bit base weights)"}.get(value, value))
        elif key == "precision" and "method" not in change:
            words.append(f"precision {value}")
        elif key == "n_gpus":
            words.append(f"{value} GPUs")
        elif key == "zero_stage":
            words.append(f"ZeRO-{value}")
        elif key == "offload_optimizer" and value:
            words.append("optimizer offload to CPU")
        elif key == "no_sync" and not value:
            words.append("without no_sync")
    return " + ".join(words)


def _fits(model: Any, settings: dict[str, Any], usable: float) -> Any:
    try:
        report = estimate_cached(model, **settings)
    except LessonkitError:
        return None
    return report if report.total_bytes <= usable else None


def _rides_on_the_batch(
    model: Any, settings: dict[str, Any], change: dict[str, Any], usable: float
) -> bool:
    """A switch of method that fits only because of the batch it brings along."""
    if "method" not in change:
        return False
    rest = {k: v for k, v in change.items() if k not in ("method", "precision")}
    return bool(rest) and _fits(model, settings | rest, usable) is not None


def _lora(settings: dict[str, Any]) -> dict[str, Any] | None:
    if settings.get("method") != "full":
        return None
    return {"method": "lora", "precision": usual_precision("lora")}


# The largest part of a peak -> the change aimed at it (None where it has none left).
PART_LEVERS: dict[str, Callable[[dict[str, Any]], dict[str, Any] | None]] = {
    "logits": lambda s: {"loss": "chunked"} if s.get("loss", "standard") == "standard" else None,
    "activations": lambda s: (
        None if s.get("gradient_checkpointing") else {"gradient_checkpointing": True}
    ),
    "optimizer": lambda s: (
        {"optimizer": "adamw-8bit"}
        if s.get("method") == "full" and "8bit" not in str(s.get("optimizer"))
        else None
    ),
    "weights": _lora,
    "gradients": _lora,
}


def _part_lever(report: Any, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The change aimed at the largest part of the peak, where there is one."""
    largest = max(PART_LEVERS, key=lambda part: report.breakdown.get(part, 0))
    return PART_LEVERS[largest](settings)


def _with_smaller_work(
    model: Any, settings: dict[str, Any], lever: dict[str, Any], usable: float
) -> list[tuple[dict[str, Any], Any]]:
    """``lever`` with the largest batch, then the longest sequence, that fits with it."""
    found = []
    batch, accumulation = settings["batch_size"], settings.get("gradient_accumulation", 1)
    b = batch // 2
    while b >= 1:
        change = lever | {"batch_size": b, "gradient_accumulation": accumulation * -(-batch // b)}
        report = _fits(model, settings | change, usable)
        if report is not None:
            found.append((change, report))
            break
        b //= 2
    seq = settings["seq_len"] // 2
    while seq >= MIN_SEQ:
        change = lever | {"seq_len": seq}
        report = _fits(model, settings | change, usable)
        if report is not None:
            found.append((change, report))
            break
        seq //= 2
    return found


def fixes(report: Any, usable_bytes: float, limit: int = MAX_FIXES) -> list[Advice]:
    """Up to ``limit`` changes that make ``report``'s run fit in ``usable_bytes``, cheapest
    first (the kit's search), then, where none of those is aimed at the largest part of the
    peak, that part's lever with a smaller batch or sequence."""
    model, settings = report.model, search_settings(report)
    if _fits(model, settings, usable_bytes) is not None:
        return []
    found = [
        (change, new)
        for change, new in fit_changes(
            model, settings, usable_bytes, limit=limit, more=True, cached=True, skip_hopeless=True
        )
        if not _rides_on_the_batch(model, settings, change, usable_bytes)
    ]
    lever = _part_lever(report, settings)
    aimed = lever is not None and any(lever.items() <= change.items() for change, _ in found)
    if lever is not None and not aimed and _fits(model, settings | lever, usable_bytes) is None:
        for change, new in _with_smaller_work(model, settings, lever, usable_bytes):
            if all(change != kept for kept, _ in found):
                found.append((change, new))
    return [Advice(change, change_words(change, settings), new) for change, new in found[:limit]]


def fix_advice(report: Any, usable_bytes: float, gpu_name: str) -> str:
    """HTML: the changes that make the run fit the largest GPU shown, each with its new peak
    and phase; a sentence saying so when none of those tried does."""
    found = fixes(report, usable_bytes)
    target = f"the {html.escape(gpu_name)} ({usable_bytes / GiB:,.1f} GiB usable)"
    if not found:
        return (
            f"<br>No change the kit tries makes it fit {target}: a smaller model, or "
            "<code>lessonkit.recommend</code> for setups of many GPUs."
        )
    items = "".join(
        f"<li>{html.escape(a.words)}: peak {a.report.total_bytes / GiB:,.1f} GiB per GPU, in "
        f"the {html.escape(phase_words(a.report.peak_phase))}</li>"
        for a in found
    )
    return (
        f"<br>Changes that make it fit {target}, from the kit's own search, cheapest first:"
        f"<ul style='margin:0'>{items}</ul>"
    )
