"""Why a GPU, an environment or a model named as an answer is not the answer.

A wrong choice gets a reason computed from the same runs and catalogs as the expected answer:
"the run does not fit it", "it costs $0.79/h, over the $0.50 budget", "your own workstation is
bought, not rented". A reason never names the answer, nor a run's peak (other questions ask for
figures that follow from it); it may quote the catalog's figures for what the student named.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import normalise_name
from ..units import GiB
from . import expected

Reason = Callable[[str, str, object], str]
# question id -> a function (question id, the option named as read, the answer as written).
REASONS: dict[str, Reason] = {}


def _reasons(*qids: str) -> Callable[[Reason], Reason]:
    def register(fn: Reason) -> Reason:
        for qid in qids:
            REASONS[qid] = fn
        return fn

    return register


def reason(qid: str, name: str, raw: object) -> str:
    """Why ``name`` is not the answer of ``qid``; '' where the question gives no reasons."""
    found = REASONS.get(qid)
    return found(qid, name, raw) if found else ""


def _usable(gpu: Any) -> str:
    return f"{gpu.usable_bytes / GiB:,.1f} GiB"


def _does_not_fit(gpu: Any) -> str:
    if not gpu.current_wheels:
        return f"current PyTorch wheels have no kernels for the {gpu.name}, so nothing runs on it"
    return (
        f"the run does not fit it: it needs more than the {_usable(gpu)} the {gpu.name} "
        "offers PyTorch"
    )


@_reasons("02.4")
def _not_the_smallest_matrix_gpu(qid: str, name: str, raw: object) -> str:
    from ..hardware.gpus import get_gpu, list_gpus

    gpu = get_gpu(name)
    if gpu.name not in {g.name for g in list_gpus(in_guide=True)}:
        return f"the {gpu.name} is not one of the guide's matrix GPUs (list_gpus(in_guide=True))"
    if not gpu.fits(expected.lora_7b_batch4()):
        return _does_not_fit(gpu)
    return f"the run fits the {gpu.name}, but a matrix GPU with less memory fits it too"


@_reasons("03.1", "03.2")
def _not_the_cheapest_place(qid: str, name: str, raw: object) -> str:
    from ..hardware.environments import get_environment

    env = get_environment(name)
    if env.tier == 0:
        return "it is bought, not rented: the question compares the places that rent a GPU"
    run = expected.qlora_7b_run() if qid == "03.1" else expected.lora_7b_batch4()
    prices = expected.cheapest_single_gpu_prices(run)
    if env.name not in prices:
        return "none of its single-GPU offers fits the run"
    return (
        f"its cheapest single GPU that fits the run costs ${prices[env.name]:,.2f}/h "
        "typically, and another place costs less"
    )


@_reasons("04.4")
def _not_under_budget(qid: str, name: str, raw: object) -> str:
    from ..hardware.gpus import get_gpu

    gpu = get_gpu(name)
    why = []
    if gpu.price_per_hour is None:
        why.append(f"nobody in the catalog rents the {gpu.name} out, so it has no price per hour")
    elif gpu.price_per_hour.typical > expected.BUDGET_PER_HOUR:
        why.append(
            f"it costs ${gpu.price_per_hour.typical:,.2f}/h typically, over the "
            f"${expected.BUDGET_PER_HOUR:.2f} budget"
        )
    if not gpu.fits(expected.qlora_8b_run()):
        why.append(_does_not_fit(gpu))
    return "; and ".join(why)


@_reasons("05.3")
def _has_native_bf16(qid: str, name: str, raw: object) -> str:
    from ..hardware.gpus import get_gpu

    gpu = get_gpu(name)
    return (
        f"the {gpu.name} has native bf16 (compute capability {gpu.compute_capability})"
        if gpu.native_bf16
        else ""
    )


@_reasons("05.6", "06.6")
def _not_the_largest_preset(qid: str, name: str, raw: object) -> str:
    from ..hardware.gpus import get_gpu

    gpu_name, precision = expected.LARGEST_PRESET_ON[qid]
    gpu = get_gpu(gpu_name)
    written = raw.strip() if isinstance(raw, str) else ""
    size = bool(written) and normalise_name(written) != normalise_name(name)
    shown = f"{written} stands for the {name} shape: " if size else ""
    if not gpu.fits(expected.qlora_preset_run(name, precision)):
        return f"{shown}QLoRA of {name} does not fit the {gpu.name} ({_usable(gpu)} usable)"
    return f"{shown}QLoRA of {name} fits the {gpu.name}, but a preset with more parameters fits too"
