"""What this machine can fine-tune: the health check's verdict, computed with the calculator.

With usable GPUs it says what fits on them; without one, where else to go (the free T4s and the
cheapest rented setups from the recommender).
"""

from __future__ import annotations

from typing import Any

from ..errors import LessonkitError, safe_text
from ..hardware.environments import get_environment
from ..hardware.gpus import get_gpu
from ..models.presets import resolve_model
from ..models.spec import ModelSpec
from ..planning.fitting import METHOD_WORDS
from ..planning.recommender import recommend
from ..planning.verdicts import ORDER, fit_sentence
from ..units import GiB


def health_verdict(report: Any, model: Any) -> list[str]:
    """What ``model`` can be fine-tuned on the report's GPUs, or, without one, where instead."""
    try:
        spec = resolve_model(model)
    except LessonkitError as err:
        return [f"No verdict for model {safe_text(model, quoted=True)}: {err}"]
    usable = report.usable_devices
    if usable:
        return device_lines(spec, usable)
    return no_gpu_lines(spec)


def device_lines(spec: ModelSpec, devices: list[Any]) -> list[str]:
    """The verdict for the usable devices of a health report (the largest group of one kind)."""
    groups: dict[tuple[str, int], list[Any]] = {}
    for d in devices:
        groups.setdefault((d.name, int(d.total_memory_bytes or 0)), []).append(d)
    (_name, total), group = max(groups.items(), key=lambda kv: (len(kv[1]), kv[0][1]))
    first = group[0]
    if not total:
        return [
            f"{first.name}: memory size unknown, so no verdict; the calculator's figures "
            f"for {spec.name} are in lessonkit.estimate()."
        ]
    native = True if first.native_bf16 is None else bool(first.native_bf16)
    free = min(
        (d.free_memory_bytes for d in group if d.free_memory_bytes is not None), default=None
    )
    shared = _unified(first)
    if shared is not None:
        return _unified_lines(spec, first, shared, total, free, len(group), native)
    label = f"{total / GiB:.1f} GiB {first.catalog_name or first.name}"
    lines = [fit_sentence(spec, label, total, len(group), native)]
    if len(group) > 1:
        lines.append("One of them alone: " + fit_sentence(spec, label, total, 1, native))
    if free is not None and free < 0.9 * total:
        lines.append(
            f"Only {free / GiB:.1f} GiB is free right now: with that, "
            + fit_sentence(spec, label, free, 1, native).split(": ", 1)[1]
        )
    if first.backend == "mps":
        lines.append(
            "On Apple MPS these CUDA figures are a guide only: unified memory is shared "
            "with the system, and QLoRA (bitsandbytes) is not available."
        )
    return lines


def _unified(device: Any) -> Any:
    """The catalog record of a CUDA device whose memory is the computer's RAM (DGX Spark)."""
    if device.backend != "cuda" or not device.catalog_name:
        return None
    try:
        gpu = get_gpu(device.catalog_name)
    except LessonkitError:
        return None
    return gpu if gpu.unified_memory else None


def _unified_lines(
    spec: ModelSpec, device: Any, gpu: Any, total: int, free: int | None, count: int, native: bool
) -> list[str]:
    """On unified memory, total_memory is the whole pool the OS and the CPU side share: a run
    is judged against what is free for it (torch.cuda.mem_get_info), or without that reading
    against the catalog's usable figure, never against total_memory."""
    usable = free if free is not None else gpu.usable_bytes
    where = "free now" if free is not None else "usable on an idle machine"
    label = f"{usable / GiB:.1f} GiB {gpu.name} ({where} of {total / GiB:.1f} GiB total_memory)"
    return [fit_sentence(spec, label, usable, count, native, gpu=gpu)]  # with the note


def no_gpu_lines(spec: ModelSpec) -> list[str]:
    """Without a usable GPU: the free T4s, and the cheapest rented setup per method."""
    t4 = get_gpu("T4")
    lines = [
        f"Here: no usable GPU, so no fine-tuning of {spec.name} (CPU training of an LLM "
        "is far too slow)."
    ]
    lines.append("Free Google Colab: " + fit_sentence(spec, t4.label, t4.usable_bytes, 1, False))
    if 2 in get_environment("kaggle").offer("T4").counts:
        lines.append(
            "Free Kaggle (GPU T4 x2): " + fit_sentence(spec, t4.label, t4.usable_bytes, 2, False)
        )
    paid = [o for o in recommend(spec).options if o.price_per_hour > 0 and not o.purchase_usd]
    for method in ORDER:
        options = [o for o in paid if o.method == method]
        if not options:
            continue
        per_token = options[0]  # ranked by dollars per million tokens
        per_hour = min(options, key=lambda o: o.price_per_hour)
        text = (
            f"To rent for {METHOD_WORDS[method]}: {per_hour.setup} on {per_hour.name} at "
            f"${per_hour.price_per_hour:.2f}/h is the cheapest hour"
        )
        if per_token is not per_hour:
            text += (
                f"; {per_token.setup} on {per_token.name} (${per_token.price_per_hour:.2f}/h) "
                f"the cheapest work at ${per_token.usd_per_million_tokens:.2f} per million tokens"
            )
        caveats = dict.fromkeys(get_gpu(o.gpu).caveat for o in (per_hour, per_token))
        lines.append(text + "." + "".join(f" Note: {c}" for c in caveats if c))
    return lines
