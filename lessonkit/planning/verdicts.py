"""Sentences computed with the calculator: what fits on a GPU setup, and where the guide's
matrix and decision flow agree or disagree with the numbers."""

from __future__ import annotations

from typing import Any

from ..hardware.gpu_records import used_text
from ..hardware.gpus import GPU, find_gpu, get_gpu
from ..models.spec import ModelSpec
from ..units import GiB
from .fitting import Fit, find_fit, method_label, needs_text

ORDER = ("qlora", "lora", "full")


def _fit(spec: ModelSpec, method: str, usable_bytes: int, count: int, native_bf16: bool) -> Fit:
    fit = find_fit(spec, method, usable_bytes, count, native_bf16=native_bf16)
    if fit is None:  # no method refuses several GPUs today; judge on one if one ever does
        fit = find_fit(spec, method, usable_bytes, 1, native_bf16=native_bf16)
    assert fit is not None  # one GPU always gives a configuration
    return fit


def fit_sentence(
    spec: ModelSpec,
    label: str,
    usable_bytes: int,
    count: int = 1,
    native_bf16: bool = True,
    gpu: GPU | None = None,
) -> str:
    """E.g. 'T4 (14.75 GiB usable): QLoRA (4-bit) of llama-2-7b fits at ...; full fine-tuning
    needs ...'. A fit with less than 5% left says 'tight' (the kit's one rule); on a
    unified-memory GPU (``gpu``, or the catalog GPU the label names) the sentence says what
    its usable memory is."""
    fits, misses = [], []
    for method in ORDER:
        fit = _fit(spec, method, usable_bytes, count, native_bf16)
        name = method_label(method, native_bf16)
        if fit.fits:
            fits.append(
                f"{name} fits at {fit.settings_text()} (peak "
                f"{fit.peak_bytes / GiB:.1f} GiB, {used_text(fit.peak_bytes, fit.usable_bytes)})"
            )
        elif method == "full":
            misses.append(needs_text(spec, "full"))
        else:
            misses.append(
                f"{name} does not (needs {fit.peak_bytes / GiB:.1f} GiB at {fit.settings_text()})"
            )
    head = f"{count} x {label}" if count > 1 else label
    what = "; ".join(fits) if fits else f"nothing fits for {spec.name}"
    if fits:
        what = what.replace(" fits", f" of {spec.name} fits", 1)
    sentence = f"{head}: {what}" + (f"; {'; '.join(misses)}" if misses else "")
    unified = gpu if gpu is not None else _catalog_gpu(label)
    if unified is not None and unified.unified_memory:
        sentence += f". {unified.unified_memory_note}"
    return sentence


def _catalog_gpu(label: str) -> GPU | None:
    """The catalog GPU a label such as '121.7 GiB DGX Spark' or 'T4 (14.75 GiB usable)'
    names, or None."""
    name = label.split(" (", 1)[0]
    return find_gpu(name.split(" GiB ", 1)[-1])


# ----- the guide, checked --------------------------------------------------------------------
def _fit_words(spec: ModelSpec, method: str, gpu: GPU, count: int = 1) -> tuple[bool, str]:
    fit = _fit(spec, method, gpu.usable_bytes, count, gpu.native_bf16)
    where = f"{count} x {gpu.name}" if count > 1 else f"one {gpu.name}"
    verb = "fits" if fit.fits else "does not fit"
    return fit.fits, (
        f"{method_label(method, gpu.native_bf16)} {verb} on {where} "
        f"({fit.peak_bytes / GiB:.1f} of {gpu.memory_text} per GPU, "
        + (f"{used_text(fit.peak_bytes, fit.usable_bytes)}, " if fit.fits else "")
        + f"{fit.settings_text()})"
    )


def full_on_one_a100_figures(spec: ModelSpec) -> tuple[float, list[tuple[str, float]]]:
    """Full fine-tuning on one A100 80GB at batch 1 x 512: the peak of plain bf16-mixed AdamW,
    and each way that fits instead with its peak, in bytes."""
    from ..memory.estimating import estimate

    usable = get_gpu("A100 80GB").usable_bytes

    def peak(**kw: Any) -> float:
        return estimate(spec, method="full", seq_len=512, device="cuda", **kw).total_bytes

    plain = peak(precision="bf16-mixed", optimizer="adamw")
    ways = [
        (
            "pure bf16 (bf16 weights and AdamW states, updates rounded to bf16)",
            peak(precision="bf16", optimizer="adamw"),
        ),
        ("8-bit AdamW", peak(precision="bf16-mixed", optimizer="adamw-8bit")),
        ("bf16 weights with 8-bit AdamW", peak(precision="bf16", optimizer="adamw-8bit")),
        (
            "optimizer states offloaded to the CPU (ZeRO-Offload)",
            peak(precision="bf16-mixed", zero_stage=1, offload_optimizer=True),
        ),
        ("ZeRO-3 over 2 GPUs", peak(precision="bf16-mixed", n_gpus=2, zero_stage=3)),
    ]
    return plain, [(name, value) for name, value in ways if value <= usable]


def full_on_one_a100(spec: ModelSpec) -> str:
    """The guide's matrix says one A100 80GB does full SFT of a 7B model: the numbers."""
    gpu = get_gpu("A100 80GB")
    plain, ways = full_on_one_a100_figures(spec)
    verdict = "agrees" if plain <= gpu.usable_bytes else "disagrees"
    fixes = [f"{name} ({value / GiB:.1f} GiB)" for name, value in ways]
    return (
        f"Matrix 'A100 80GB: full SFT of 7B models' {verdict} for {spec.name}: plain "
        f"bf16-mixed AdamW (about 16 bytes per parameter) peaks at {plain / GiB:.1f} GiB at batch "
        f"1 x 512 against {gpu.usable_text} usable"
        + (f"; it fits with {', or '.join(fixes)}." if plain > gpu.usable_bytes and fixes else ".")
    )


# The guide's claim at each end of its decision flow (node ids as in charts.FLOW_NODES).
FLOW_CLAIMS = {
    "colab_lambda": "Flow '7B/8B, low budget -> Google Colab (A100) or Lambda Labs': ",
    "rtx4090": (
        "Flow '7B/8B, high budget -> local RTX 4090 workstation' and matrix "
        "'RTX 4090: SFT of 7B/8B using LoRA': "
    ),
    "cluster": "Flow '70B -> multi-GPU cluster (8x A100s)' ",
}


def flow_notes(spec: ModelSpec) -> dict[str, str]:
    """The guide's decision flow checked for this model: end node -> verdict ('agrees for LoRA:
    ...'), to follow FLOW_CLAIMS[end]; empty for sizes the flow has no branch for."""
    n = spec.n_params
    notes: dict[str, str] = {}
    if 5e9 <= n <= 9.5e9:
        colab_a100 = get_gpu("A100 40GB")
        lora_ok, lora = _fit_words(spec, "lora", colab_a100)
        _, full = _fit_words(spec, "full", colab_a100)
        t4_ok, t4 = _fit_words(spec, "qlora", get_gpu("T4"))
        notes["colab_lambda"] = (
            f"{'agrees for LoRA' if lora_ok else 'disagrees'}: {lora}; {full}. "
            + (f"Cheaper still: {t4} (free on Colab and Kaggle)." if t4_ok else "")
        )
        ok, words = _fit_words(spec, "lora", get_gpu("RTX 4090"))
        _, full4090 = _fit_words(spec, "full", get_gpu("RTX 4090"))
        notes["rtx4090"] = f"{'agrees' if ok else 'disagrees'}: {words}; {full4090}."
    elif 60e9 <= n <= 80e9:
        a100 = get_gpu("A100 80GB")
        lora_ok, lora = _fit_words(spec, "lora", a100, 8)
        full_ok, full = _fit_words(spec, "full", a100, 8)
        agree = {
            (True, True): "agrees",
            (True, False): "agrees for LoRA, not for full fine-tuning",
            (False, True): "agrees for full fine-tuning only",
            (False, False): "disagrees",
        }
        notes["cluster"] = (
            f"{agree[(lora_ok, full_ok)]}: {lora}; {full}"
            + ("" if full_ok else f"; {needs_text(spec, 'full')}")
            + "."
        )
    return notes


def guide_notes(spec: ModelSpec, rec: Any) -> list[str]:
    """The guide's matrix and decision flow next to the numbers, for 7B/8B, 13B and 70B models."""
    n = spec.n_params
    flow = {end: FLOW_CLAIMS[end] + verdict for end, verdict in flow_notes(spec).items()}
    notes: list[str] = []
    if 5e9 <= n <= 9.5e9:
        notes += [flow["colab_lambda"], flow["rtx4090"], full_on_one_a100(spec)]
    elif 11e9 <= n <= 15e9:
        a6000 = get_gpu("RTX A6000")
        ok, words = _fit_words(spec, "lora", a6000)
        _, full = _fit_words(spec, "full", a6000)
        notes.append(
            "Matrix 'RTX A6000 48GB: SFT of 13B models': "
            f"{'agrees for LoRA' if ok else 'disagrees'}: {words}; {full}."
        )
    elif 60e9 <= n <= 80e9:
        q_ok, qlora = _fit_words(spec, "qlora", get_gpu("A100 80GB"))
        notes.append(flow["cluster"])
        notes.append(
            f"Matrix 'A100 80GB: fine-tuning 70B models': "
            f"{'true for QLoRA only' if q_ok else 'disagrees'}: {qlora}."
        )
    return notes
