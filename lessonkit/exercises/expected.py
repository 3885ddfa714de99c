"""The expected answer of each exercise, computed from lessonkit when it is checked.

Each function registered with ``@_expects(question_id)`` asks the calculator or the catalogs, so
an answer cannot drift from what the course teaches (uncached: a change to the calculator shows
at the next check). The question texts, units, tolerances and hints are in
``data/exercises.json``; the bandwidth ladder is in ``data/bandwidth.json``.
"""

from __future__ import annotations

import json
import re
import types
from collections.abc import Callable
from functools import lru_cache
from importlib import resources
from typing import Any

from ..errors import LessonkitError, normalise_name, unknown_name_message
from ..health.fake_torch import fake_torch
from ..memory import estimating
from ..units import GB, GiB


@lru_cache(maxsize=1)
def bank() -> dict[str, dict[str, Any]]:
    """The question bank: question id -> kind, unit, tolerance, hint, options, key points."""
    text = resources.files("lessonkit").joinpath("data/exercises.json").read_text(encoding="utf-8")
    questions: dict[str, dict[str, Any]] = json.loads(text)["questions"]
    return questions


# Catalog-backed choices: resolve any spelling of a name to its canonical record name.
CATALOGS: dict[str, Callable[[str], str]] = {}

# question id -> a function computing the expected answer from lessonkit, filled below.
EXPECTED: dict[str, Callable[[], Any]] = {}


def _expects(*qids: str) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
    def register(fn: Callable[[], Any]) -> Callable[[], Any]:
        for qid in qids:
            EXPECTED[qid] = fn
        return fn

    return register


# ----- the bandwidth ladder -----------------------------------------------------------------
@lru_cache(maxsize=1)
def bandwidth_data() -> list[dict[str, Any]]:
    """The rows of data/bandwidth.json as stored (GPU rows without their figure)."""
    text = resources.files("lessonkit").joinpath("data/bandwidth.json").read_text(encoding="utf-8")
    links: list[dict[str, Any]] = json.loads(text)["links"]
    return links


def bandwidth_ladder() -> list[dict[str, Any]]:
    """The links data crosses on its way to the GPU's cores, slowest first.

    Each is a dict with name, what, bandwidth_gbs (decimal GB/s), source and as_of; GPU memory
    rows take their figure from the GPU catalog.
    """
    from ..hardware.gpus import get_gpu

    rows = []
    for link in bandwidth_data():
        row = {k: v for k, v in link.items() if k != "aliases"}
        if "gpu" in link:
            gpu = get_gpu(link["gpu"])
            row.update(bandwidth_gbs=float(gpu.bandwidth_gbs), source=gpu.source, as_of=gpu.as_of)
        rows.append(row)
    return sorted(rows, key=lambda r: r["bandwidth_gbs"])


# ----- expected answers, computed from lessonkit ---------------------------------------------
def _gpu(name: str) -> Any:
    from ..hardware.gpus import get_gpu

    return get_gpu(name)


def _resolve_category(raw: str) -> str:
    from ..memory.report import CATEGORIES, LABELS

    table = {normalise_name(k): k for k in CATEGORIES}
    table |= {normalise_name(label): key for key, label in LABELS.items()}
    table |= {normalise_name(label.split()[0]): key for key, label in LABELS.items()}
    key = normalise_name(raw)
    if key not in table:
        raise LessonkitError(unknown_name_message(raw, CATEGORIES, "category"))
    return table[key]


def _resolve_method(raw: str) -> str:
    from ..errors import choose
    from ..options import METHODS

    return choose(raw, METHODS, "method")


def _resolve_environment(raw: str) -> str:
    from ..hardware.environments import get_environment

    return get_environment(raw).name


def _resolve_model(raw: str) -> str:
    """A preset name; a bare size that the explorers offer ('13B') stands for the preset whose
    shape it is shown as."""
    from ..models.presets import get_preset, preset_names, spec_for_size
    from ..units import parse_count

    try:
        return get_preset(raw).name
    except LessonkitError as unknown:
        try:
            shown_as = spec_for_size(parse_count(raw)).name
        except LessonkitError:
            raise unknown from None
        match = re.search(r"\((.+) shape\)$", shown_as)
        if match and match.group(1) in preset_names():
            return match.group(1)
        raise LessonkitError(
            f"{raw} is a size, not a preset: name one of lessonkit.preset_names() "
            f"({', '.join(preset_names())})."
        ) from None


CATALOGS.update(
    gpus=lambda raw: _gpu(raw).name,
    environments=_resolve_environment,
    categories=_resolve_category,
    methods=_resolve_method,
    models=_resolve_model,
)

# The precision each method is taught with: mixed precision for full fine-tuning, a 16-bit
# base (bf16 compute) for LoRA and QLoRA.
_METHOD_PRECISION = {"full": "bf16-mixed", "lora": "bf16", "qlora": "bf16"}


def _method_run(model: object, method: str, **settings: Any) -> Any:
    return estimating.estimate(
        model, method=method, precision=_METHOD_PRECISION[method], **settings
    )


@_expects("01.1")
def _weights_16bit() -> float:
    return estimating.estimate("7B", precision="bf16").breakdown["weights"]


@_expects("01.2")
def _bytes_per_param_full() -> float:
    report = estimating.estimate("7B", precision="bf16-mixed", optimizer="adamw")
    b = report.breakdown
    return (b["weights"] + b["gradients"] + b["optimizer"]) / report.model.n_params


@_expects("01.3")
def _optimizer_over_weights() -> float:
    states = estimating.estimate("7B", precision="bf16-mixed", optimizer="adamw").breakdown[
        "optimizer"
    ]
    return states / estimating.estimate("7B", precision="bf16").breakdown["weights"]


@_expects("01.4")
def _lora_params() -> float:
    from ..models.presets import resolve_model

    return resolve_model("7B").lora_params(16, ("q_proj", "v_proj"))


def _largest_batch(fits: Callable[[Any], bool], **settings: Any) -> int:
    """The largest batch size from 1 to 64 whose estimate ``fits`` (0 when none does)."""
    best = 0
    for batch in range(1, 65):
        if not fits(estimating.estimate("7B", batch_size=batch, **settings)):
            break
        best = batch
    return best


@_expects("01.7")
def _largest_batch_on_4090() -> int:
    return _largest_batch(
        _gpu("RTX 4090").fits,
        method="lora",
        precision="bf16",
        seq_len=1024,
        gradient_checkpointing=True,
    )


@_expects("01.5")
def _largest_category() -> str:
    breakdown = estimating.estimate("7B", precision="bf16-mixed", optimizer="adamw").breakdown
    return max(breakdown, key=lambda part: breakdown[part])


def _full_7b(**change: Any) -> Any:
    base = dict(bank()["02.3"]["base"])
    return estimating.estimate(base.pop("model"), **(base | change))


@_expects("02.1")
def _full_7b_peak() -> float:
    return float(_full_7b().total_bytes / GiB)


@_expects("02.2")
def _full_7b_short_of_a100() -> float:
    return float((_full_7b().total_bytes - _gpu("A100 80GB").usable_bytes) / GiB)


@_expects("02.3")
def _changes_that_fit() -> set[str]:
    a100 = _gpu("A100 80GB")
    return {o["name"] for o in bank()["02.3"]["options"] if a100.fits(_full_7b(**o["settings"]))}


def lora_7b_batch4() -> Any:
    """The LoRA run of 02.4, 02.7, 03.2 and 05.5: the 7B in bf16 at batch 4 x 1024 tokens."""
    return _lora_7b_batch4()


def _lora_7b_batch4() -> Any:
    return estimating.estimate("7B", method="lora", precision="bf16", batch_size=4, seq_len=1024)


@_expects("02.4")
def _smallest_matrix_gpu() -> set[str]:
    from ..hardware.gpus import list_gpus

    run = _lora_7b_batch4()
    fitting = [g for g in list_gpus(in_guide=True) if g.fits(run)]
    least = min(g.usable_bytes for g in fitting)
    return {g.name for g in fitting if g.usable_bytes == least}


@_expects("02.7")
def _checkpointing_saves() -> float:
    run = _lora_7b_batch4()
    with_checkpointing = estimating.estimate(
        "7B",
        method="lora",
        precision="bf16",
        batch_size=4,
        seq_len=1024,
        gradient_checkpointing=True,
    )
    return float((run.total_bytes - with_checkpointing.total_bytes) / GiB)


@_expects("02.5")
def _methods_for_70b_on_a100() -> set[str]:
    from ..options import METHODS

    a100 = _gpu("A100 80GB")
    return {m for m in METHODS if a100.fits(_method_run("llama-2-70b", m))}


def cheapest_single_gpu_prices(run: Any) -> dict[str, float]:
    """Environment name -> the typical price per hour of its cheapest single GPU that fits
    ``run``, for the environments that rent one (your own workstation is bought, not rented)."""
    from ..hardware.environments import list_environments

    prices = {}
    for env in list_environments():
        if env.tier == 0:  # your own hardware is bought, not rented
            continue
        fitting = [
            float(o.price_per_hour.typical)
            for o in env.offers
            if 1 in o.counts and not o.broken and o.gpu.fits(run)
        ]
        if fitting:
            prices[env.name] = min(fitting)
    return prices


def _cheapest_environments(run: Any) -> set[str]:
    """Names of the rentable environments whose cheapest single GPU that fits ``run`` costs least."""
    prices = cheapest_single_gpu_prices(run)
    cheapest = min(prices.values())
    return {name for name, price in prices.items() if price == cheapest}


@_expects("03.1")
def _cheapest_for_qlora() -> set[str]:
    return _cheapest_environments(qlora_7b_run())


def qlora_7b_run() -> Any:
    """03.1's run: QLoRA of the 7B with bf16 compute at batch 1 x 512 tokens."""
    return estimating.estimate("7B", method="qlora", precision="bf16")


@_expects("03.2")
def _cheapest_for_lora_batch4() -> set[str]:
    return _cheapest_environments(_lora_7b_batch4())


def _price(environment: str, gpu: str) -> float:
    from ..hardware.environments import get_environment

    return get_environment(environment).offer(gpu).price_per_hour.typical


@_expects("03.3")
def _ten_hours_on_lambda() -> float:
    return _price("lambda", "A100 80GB") * 10


@_expects("03.4")
def _sagemaker_over_lambda() -> float:
    return _price("sagemaker", "A100 80GB") / _price("lambda", "A100 80GB")


@_expects("03.5")
def _largest_qlora_batch_on_t4() -> int:
    return _largest_batch(_gpu("T4").fits, method="qlora", precision="fp16-mixed", seq_len=512)


def _fewest_a100s(method: str, precision: str) -> int:
    a100 = _gpu("A100 80GB")
    for n in range(1, 257):
        if a100.fits(
            estimating.estimate(
                "llama-2-70b", method=method, precision=precision, n_gpus=n, zero_stage=3
            )
        ):
            return n
    raise LessonkitError(f"{method} of 70B does not fit on 256 A100s")


@_expects("04.1")
def _a100s_for_full_70b() -> int:
    return _fewest_a100s("full", "bf16-master")


@_expects("04.2")
def _a100s_for_lora_70b() -> int:
    return _fewest_a100s("lora", "bf16")


@_expects("04.3")
def _methods_on_8_a100s() -> set[str]:
    a100 = _gpu("A100 80GB")
    settings = bank()["04.3"]["method_settings"]
    return {
        m
        for m, kw in settings.items()
        if a100.fits(estimating.estimate("llama-2-70b", method=m, n_gpus=8, **kw))
    }


BUDGET_PER_HOUR = 0.5  # 04.4's budget, in dollars per GPU-hour


def qlora_8b_run() -> Any:
    """04.4's run: QLoRA of Llama-3.1-8B with gradient checkpointing at batch 4 x 1024."""
    return estimating.estimate(
        "llama-3.1-8b",
        method="qlora",
        precision="bf16",
        batch_size=4,
        seq_len=1024,
        gradient_checkpointing=True,
    )


@_expects("04.4")
def _gpus_under_half_a_dollar() -> set[str]:
    from ..hardware.gpus import list_gpus

    run = qlora_8b_run()
    return {
        g.name
        for g in list_gpus()
        if g.price_per_hour is not None
        and g.price_per_hour.typical <= BUDGET_PER_HOUR
        and g.fits(run)
    }


@_expects("04.5")
def _qlora_70b_headroom_on_a100() -> float:
    run = estimating.estimate("llama-2-70b", method="qlora", precision="bf16")
    return float((_gpu("A100 80GB").usable_bytes - run.total_bytes) / GiB)


def _vram_printed(total_memory: int, device_name: str) -> Callable[[str], str | None]:
    """A verifier: the printout must state this total, in GB or GiB, with the right label.
    Sizes inside the device's name ("NVIDIA A100 80GB") are the name, not a printed total."""
    gb, gib = total_memory / GB, total_memory / GiB

    def verify(printed: str) -> str | None:
        printed = printed.replace(device_name, " ")
        # a number only from its first digit: no quadratic search inside long runs of digits
        found = re.findall(r"(?<![\d.])(\d+(?:\.\d+)?)\s*(GiB|GB)\b", printed)
        for number, label in found:
            if abs(float(number) - (gib if label == "GiB" else gb)) < 0.011:
                return None
        for number, label in found:
            if label == "GB" and abs(float(number) - gib) < 0.011:
                return (
                    f"it prints {number} GB, but {number} is the size in GiB "
                    "(divided by 1024**3): label it GiB, or divide by 10**9 for GB"
                )
        if found:
            return f"the total it prints ({' '.join(found[0])}) is not this GPU's memory"
        return "it does not print the total memory with a unit (GB or GiB)"

    return verify


@_expects("05.1")
def _health_check_cases() -> list[tuple[str, types.ModuleType, Callable[[str], str | None]]]:
    cases = []
    for name in ("T4", "A100 80GB"):
        gpu = _gpu(name)
        total = gpu.usable_bytes
        major, minor = (int(x) for x in gpu.compute_capability.split(".")[:2])
        capability = (major, minor)
        device_name = f"NVIDIA {name}"
        cases.append(
            (
                f"with one {name} ({total:,} bytes)",
                fake_torch(total, device_name, capability),
                _vram_printed(total, device_name),
            )
        )
    cases.append(
        (
            "on a machine without a GPU",
            fake_torch(None),
            lambda printed: None if printed.strip() else "it prints nothing",
        )
    )
    return cases


@_expects("05.2")
def _t4_memory_not_offered() -> float:
    t4 = _gpu("T4")
    return float((t4.memory_bytes - t4.usable_bytes) / GiB)


@_expects("05.3")
def _gpus_without_native_bf16() -> set[str]:
    from ..hardware.gpus import list_gpus

    return {gpu.name for gpu in list_gpus() if not gpu.native_bf16}


@_expects("05.4")
def _p100_capability() -> float:
    return float(_gpu("P100").compute_capability)


@_expects("05.5")
def _lora_batch4_over_16_gib() -> float:
    return float((_lora_7b_batch4().total_bytes - 16 * GiB) / GiB)


def qlora_preset_run(name: str, precision: str) -> Any:
    """05.6's and 06.6's run of a preset: QLoRA with adapters on all linear layers."""
    return estimating.estimate(name, method="qlora", precision=precision, lora_targets="all-linear")


# The GPU and precision of each "largest model" question.
LARGEST_PRESET_ON = {"05.6": ("T4", "fp16-mixed"), "06.6": ("RTX 4090", "bf16")}


def _largest_preset(gpu_name: str, precision: str) -> set[str]:
    """The presets with the most parameters whose QLoRA run (all-linear adapters) fits the GPU."""
    from ..models.presets import get_preset, preset_names

    gpu = _gpu(gpu_name)
    fitting = [get_preset(n) for n in preset_names() if gpu.fits(qlora_preset_run(n, precision))]
    most = max(spec.n_params for spec in fitting)
    return {spec.name for spec in fitting if spec.n_params == most}


@_expects("05.6")
def _largest_qlora_preset_on_t4() -> set[str]:
    return _largest_preset(*LARGEST_PRESET_ON["05.6"])


@_expects("06.1")
def _pass_times() -> dict[str, float]:
    weights = float(bank()["06.1"]["weights_gb"]) * GB
    return {link["name"]: weights / (link["bandwidth_gbs"] * GB) for link in bandwidth_ladder()}


@_expects("06.2")
def _pcie4_over_hbm3() -> float:
    speed = {link["name"]: link["bandwidth_gbs"] for link in bandwidth_ladder()}
    return float(speed["HBM3 (H100 SXM)"] / speed["PCIe 4.0 x16"])


@_expects("06.4")
def _fourteen_gb_model() -> dict[str, float]:
    report = estimating.estimate(
        "7B", method="full", precision="bf16", optimizer="adamw", batch_size=1, seq_len=512
    )
    b = report.breakdown
    # At this run's peak (the optimizer step) the activations are already freed: take what
    # the forward pass adds on top of the weights and optimizer states.
    forward = report.phase_peaks["forward"] - b["weights"] - b["optimizer"]
    rows = {
        "gradients": b["gradients"],
        "optimizer": b["optimizer"],
        "activations": forward,
        "cuda_context": b["cuda_context"],
    }
    return {row: rows[row] / GiB for row in bank()["06.4"]["rows"]}


@_expects("06.6")
def _largest_qlora_preset() -> set[str]:
    return _largest_preset(*LARGEST_PRESET_ON["06.6"])


@_expects("06.7")
def _peak_over_weights() -> float:
    report = estimating.estimate(
        "7B", method="full", precision="bf16", optimizer="adamw", batch_size=1, seq_len=512
    )
    return report.total_bytes / report.breakdown["weights"]


# ----- the reflections' misconceptions and the figures their feedback quotes ------------------
@lru_cache(maxsize=1)
def misconceptions() -> dict[str, dict[str, Any]]:
    """Misconception id -> the claim, why it is wrong, the key point it contradicts, patterns."""
    text = resources.files("lessonkit").joinpath("data/exercises.json").read_text(encoding="utf-8")
    found: dict[str, dict[str, Any]] = json.loads(text)["misconceptions"]
    return found


# figure name -> a function computing it as shown in a sentence, filled below.
FIGURES: dict[str, Callable[[], str]] = {}


def _figure(name: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    def register(fn: Callable[[], str]) -> Callable[[], str]:
        FIGURES[name] = fn
        return fn

    return register


def _link_gbs(name: str) -> float:
    return float(next(row["bandwidth_gbs"] for row in bandwidth_ladder() if row["name"] == name))


@_figure("ddr5_gbs")
def _ddr5_gbs() -> str:
    return f"{_link_gbs('DDR5 system RAM'):,.1f}"


@_figure("hbm3_gbs")
def _hbm3_gbs() -> str:
    return f"{_link_gbs('HBM3 (H100 SXM)'):,.0f}"


@_figure("pcie4_gbs")
def _pcie4_gbs() -> str:
    return f"{_link_gbs('PCIe 4.0 x16'):,.1f}"


@_figure("hbm3_over_ddr5")
def _hbm3_over_ddr5() -> str:
    return f"{_link_gbs('HBM3 (H100 SXM)') / _link_gbs('DDR5 system RAM'):,.0f}"


@_figure("h100_tflops")
def _h100_tflops() -> str:
    return f"{_gpu('H100 SXM').bf16_tflops:,.0f}"


@_figure("full_7b_static_gb")
def _full_7b_static_gb() -> str:
    """Weights, gradients and optimizer states of the mixed-precision 7B run, in GB."""
    breakdown = estimating.estimate("7B", precision="bf16-mixed", optimizer="adamw").breakdown
    return f"{(breakdown['weights'] + breakdown['gradients'] + breakdown['optimizer']) / GB:,.0f}"


@_figure("pure_bf16_peak_over_card")
def _pure_bf16_peak_over_card() -> str:
    """06.4's run against what a 16 GB T4 offers PyTorch."""
    report = estimating.estimate(
        "7B", method="full", precision="bf16", optimizer="adamw", batch_size=1, seq_len=512
    )
    return f"{report.total_bytes / _gpu('T4').usable_bytes:,.1f}"


@_figure("free_tier_gpus_without_bf16")
def _free_tier_gpus_without_bf16() -> str:
    """The GPUs of the free tiers (free offers) that lack native bf16, as a phrase."""
    from ..hardware.environments import list_environments

    names = sorted(
        {
            o.gpu.name
            for e in list_environments()
            for o in e.offers
            if o.free and not o.gpu.native_bf16
        }
    )
    return " and the ".join(names) if names else "none"
