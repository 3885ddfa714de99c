"""Does a run fit on a GPU setup, how long does it take, and what is the smallest setup that fits.

All memory figures come from ``estimate(..., device="cuda")`` (the peak per GPU including the
CUDA context and allocator margin), compared with the memory one device really offers
(``GPU.usable_bytes``). The settings tried are the usual ones for each method:

- full: fp32 weights with bf16 autocast (fp16 on GPUs without native bf16: same memory),
  torch AdamW (foreach, the CUDA default); several GPUs shard with ZeRO-3/FSDP;
- lora: bf16 base weights, fp32 adapters (peft's default), rank 16 on q_proj and v_proj;
- qlora: the same on 4-bit NF4 base weights with double quantization; several GPUs run data
  parallel (DDP, ZeRO stage 0): each GPU holds the whole 4-bit model and trains on its own
  batches, so more GPUs shorten the run but never lower the memory per GPU (the calculator
  cannot shard 4-bit weights with ZeRO-3).
The batch size asked for is tried without, then with gradient checkpointing, then halved (with
checkpointing) down to 1; gradient accumulation restores the effective batch.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..hardware.gpu_records import TIGHT_FRACTION as TIGHT_FRACTION
from ..hardware.gpu_records import fit_verdict, is_tight
from ..hardware.gpus import GPU, get_gpu, list_gpus
from ..memory.settings import usual_precision as usual_precision  # also planning's name
from ..models.experts import expert_targets
from ..models.spec import ModelSpec
from ..units import GiB

DEFAULT_MFU = 0.35
DEFAULT_BATCH, DEFAULT_SEQ = 4, 512
NODE_COUNTS = (1, 2, 4, 8)
CLUSTER_COUNTS = (16, 32, 64, 128, 256, 512, 1024)
METHOD_WORDS = {"full": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA"}
# Training FLOPs per parameter per token: forward 2, backward 4 (2 for the activations' gradients,
# 2 for the weights'); LoRA and QLoRA skip the frozen weights' gradients (adapters are tiny).
# Kaplan et al. 2020 "Scaling Laws for Neural Language Models", section 2.1: C ~ 6 N per token.
# N is the parameters a token computes with: a mixture of experts' active ones, not all it holds.
FLOPS_PER_PARAM = {"full": 6, "lora": 4, "qlora": 4}
CHECKPOINT_FLOPS = 2  # gradient checkpointing recomputes the forward
# QLoRA dequantizes every 4-bit weight in the forward and again in the backward: measured about
# 1.4x LoRA's time on the same GPU (S. Raschka, "Practical Tips for Finetuning LLMs Using LoRA",
# 2023: 39% longer for 33% less memory).
QLORA_SLOWDOWN = 1.4
# Attention's own FLOPs grow with the sequence: per token and layer, Q.K^T and scores.V take
# 4 x seq_len x (heads x head_dim) in the forward, twice that in the backward (Chowdhery et al.
# 2022, "PaLM", appendix B: 6N + 12 L H Q T per token); checkpointing repeats the forward.
ATTENTION_FLOPS = 12
ATTENTION_CHECKPOINT_FLOPS = 4
# Fixed time around the training steps (assumed, not measured): starting the machine and the
# environment, then loading the bf16 weights (2 bytes per parameter) from the Hub or a disk, once
# per session; saving a checkpoint of what is trained (full: fp32 weights and AdamW's two states,
# 12 bytes per parameter; LoRA/QLoRA: the adapters, negligible) once per hour of training.
STARTUP_HOURS = 5 / 60
LOAD_BYTES_PER_SECOND = 200e6
SAVE_BYTES_PER_SECOND = 500e6
CHECKPOINT_BYTES_PER_PARAM = {"full": 12, "lora": 0, "qlora": 0}


def assumptions() -> list[str]:
    """What the fits, times and costs assume (the memory example read from the GPU catalog)."""
    t4 = get_gpu("T4")
    return [
        f"Training compute = {FLOPS_PER_PARAM['full']} x parameters x tokens FLOPs for full "
        "fine-tuning (Kaplan et al. 2020; for a mixture of experts, the active parameters a token "
        f"computes with), {FLOPS_PER_PARAM['lora']} x for LoRA/QLoRA (no weight "
        f"gradients), +{CHECKPOINT_FLOPS} x with gradient checkpointing; QLoRA takes "
        f"{QLORA_SLOWDOWN:g}x LoRA's time for dequantization (Raschka 2023).",
        f"Attention adds {ATTENTION_FLOPS} x layers x heads x head_dim x seq_len FLOPs per token "
        f"(+{ATTENTION_CHECKPOINT_FLOPS} x with checkpointing; PaLM, Chowdhery et al. 2022), so "
        "longer sequences take longer per token.",
        "Time = FLOPs / (GPUs x dense bf16 TFLOPS x MFU) plus fixed overheads: "
        f"{STARTUP_HOURS * 60:.0f} min start-up and loading the bf16 weights at "
        f"{LOAD_BYTES_PER_SECOND / 1e6:.0f} MB/s per session, and saving a checkpoint "
        f"(full fine-tuning: {CHECKPOINT_BYTES_PER_PARAM['full']} bytes per parameter) at "
        f"{SAVE_BYTES_PER_SECOND / 1e6:.0f} MB/s once per hour; several GPUs are assumed to "
        "scale linearly, which is optimistic over PCIe.",
        "Memory: estimate(device='cuda') per GPU against the memory one device offers "
        f"(total_memory, e.g. about {t4.usable_text} on a {t4.memory_gb:g} GB T4).",
    ]


@dataclass(frozen=True)
class Fit:
    """A configuration tried on a setup: its settings, peak per GPU and whether it fits."""

    method: str
    count: int
    usable_bytes: int
    batch_size: int
    seq_len: int
    gradient_checkpointing: bool
    zero_stage: int
    peak_bytes: int
    shared_report: Any = field(repr=False, compare=False)  # the cached estimate: never change it

    @property
    def report(self) -> Any:
        """The estimate of this configuration: a fresh copy each time, free to change."""
        return _copy(self.shared_report)

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.usable_bytes

    @property
    def headroom_bytes(self) -> int:
        return self.usable_bytes - self.peak_bytes

    @property
    def tight(self) -> bool:
        """It fits with less than TIGHT_FRACTION (5%) of the GPU left (95% or more used):
        fragmentation or a longer batch can tip it into out-of-memory."""
        return is_tight(self.peak_bytes, self.usable_bytes)

    @property
    def verdict(self) -> str:
        """'fits', 'fits, tight' or 'does not fit'."""
        return fit_verdict(self.peak_bytes, self.usable_bytes)

    def settings_text(self) -> str:
        text = f"batch {self.batch_size} x {self.seq_len} tokens"
        if self.gradient_checkpointing:
            text += " with gradient checkpointing"
        if self.count > 1:
            text += (
                f", ZeRO-{self.zero_stage}"
                if self.zero_stage
                else ", data parallel (each GPU holds the whole model)"
            )
        return text


def method_settings(method: str, native_bf16: bool = True) -> dict[str, Any]:
    """The estimate() keywords used for a method (see the module docstring)."""
    return {
        "method": method,
        "precision": usual_precision(method, native_bf16),
        "optimizer": "adamw",
    }


def method_label(method: str, native_bf16: bool = True) -> str:
    half = "bf16" if native_bf16 else "fp16"
    return {"full": "full fine-tuning", "lora": f"LoRA in {half}", "qlora": "QLoRA (4-bit)"}[method]


def zero_for(method: str, count: int) -> int | None:
    """The ZeRO stage used on ``count`` GPUs: 0 on one GPU and for QLoRA on several (data
    parallel: each GPU holds the whole 4-bit model), 3 (ZeRO-3/FSDP) for full and LoRA."""
    if count == 1 or method == "qlora":
        return 0
    return 3


# ----- estimate() with a cache -------------------------------------------------------------
@lru_cache(maxsize=8192)
def _cached_estimate(model: Any, key: tuple[tuple[str, type, Any], ...]) -> Any:
    from ..memory.estimating import estimate

    return estimate(model, **{name: value for name, _, value in key})


def _copy(report: Any) -> Any:
    """A report a caller may change: its dicts and lists are new (settings one level deep)."""
    settings = {
        name: copy.copy(value) if isinstance(value, (dict, list, set)) else value
        for name, value in report.settings.items()
    }
    return dataclasses.replace(
        report,
        settings=settings,
        breakdown=dict(report.breakdown),
        phase_peaks=dict(report.phase_peaks),
        assumptions=list(report.assumptions),
    )


def estimate_cached(model: Any, **settings: Any) -> Any:
    """``estimate(model, **settings)``, cached for repeated arguments.

    Each call returns its own copy, so a caller may change the report without touching the
    cache; unhashable arguments (a config dict, a list of targets) are estimated afresh.
    """
    # The type is part of the key: True == 1 and 4 == 4.0 must not share an entry.
    key = tuple((name, type(value), value) for name, value in sorted(settings.items()))
    try:
        hash((model, key))
    except TypeError:
        from ..memory.estimating import estimate

        return estimate(model, **settings)
    return _copy(_cached_estimate(model, key))


def clear_estimate_cache() -> None:
    """Empty the estimate caches (for timing cold calls)."""
    _cached_estimate.cache_clear()
    _estimate.cache_clear()


@lru_cache(maxsize=8192)
def _estimate(
    spec: ModelSpec,
    method: str,
    native_bf16: bool,
    count: int,
    zero: int,
    batch: int,
    seq: int,
    ckpt: bool,
) -> Any:
    """One try of find_fit, cached and shared: read it, never change it (Fit.report hands out
    copies)."""
    from ..memory.estimating import estimate

    return estimate(
        spec,
        **method_settings(method, native_bf16),
        batch_size=batch,
        seq_len=seq,
        gradient_checkpointing=ckpt,
        n_gpus=count,
        zero_stage=zero,
        device="cuda",
    )


def _batches(batch: int) -> list[tuple[int, bool]]:
    tries = [(batch, False), (batch, True)]
    b = batch // 2
    while b >= 1:
        tries.append((b, True))
        b //= 2
    return tries


def find_fit(
    spec: ModelSpec,
    method: str,
    usable_bytes: int,
    count: int = 1,
    *,
    native_bf16: bool = True,
    batch_size: int = DEFAULT_BATCH,
    seq_len: int = DEFAULT_SEQ,
) -> Fit | None:
    """The first configuration that fits (largest batch, checkpointing only if needed).

    When nothing fits, the last (smallest) configuration tried, whose ``fits`` is False; None
    when ``count`` GPUs cannot run this method (no method today: QLoRA on several GPUs runs
    data parallel, see ``zero_for``).
    """
    zero = zero_for(method, count)
    if zero is None:
        return None
    fit = None
    for batch, ckpt in _batches(batch_size):
        report = _estimate(spec, method, native_bf16, count, zero, batch, seq_len, ckpt)
        fit = Fit(
            method,
            count,
            int(usable_bytes),
            batch,
            seq_len,
            ckpt,
            zero,
            int(report.total_bytes),
            report,
        )
        if fit.fits:
            return fit
    return fit


def flops_per_token(
    spec: ModelSpec, method: str, seq_len: int = DEFAULT_SEQ, gradient_checkpointing: bool = False
) -> float:
    """Training FLOPs per token: the matmuls of the weights a token uses (a mixture of experts'
    active parameters) plus attention over ``seq_len`` tokens."""
    weights = FLOPS_PER_PARAM[method] + (CHECKPOINT_FLOPS if gradient_checkpointing else 0)
    attention = ATTENTION_FLOPS + (ATTENTION_CHECKPOINT_FLOPS if gradient_checkpointing else 0)
    head_dim = spec.head_dim or spec.hidden_size // spec.n_heads  # set by ModelSpec itself
    return (
        weights * spec.active_params + attention * spec.n_layers * spec.n_heads * head_dim * seq_len
    )


def compute_hours(
    spec: ModelSpec,
    method: str,
    tokens: float,
    tflops: float,
    count: int = 1,
    mfu: float = DEFAULT_MFU,
    gradient_checkpointing: bool = False,
    seq_len: int = DEFAULT_SEQ,
) -> float:
    """Hours of training steps alone on ``tokens`` tokens (no start-up, no checkpoints)."""
    seconds = (
        flops_per_token(spec, method, seq_len, gradient_checkpointing)
        * tokens
        / (count * tflops * 1e12 * mfu)
    )
    if method == "qlora":
        seconds *= QLORA_SLOWDOWN
    return seconds / 3600


def overhead_hours(spec: ModelSpec, method: str, train_hours: float, sessions: int = 1) -> float:
    """Fixed time around ``train_hours`` of steps: start-up and loading per session, and one
    checkpoint save per hour of training (see the constants above)."""
    startup = STARTUP_HOURS + 2 * spec.n_params / LOAD_BYTES_PER_SECOND / 3600
    save = CHECKPOINT_BYTES_PER_PARAM[method] * spec.n_params / SAVE_BYTES_PER_SECOND / 3600
    return sessions * startup + int(train_hours) * save


def run_hours(
    spec: ModelSpec,
    method: str,
    tokens: float,
    tflops: float,
    count: int = 1,
    mfu: float = DEFAULT_MFU,
    gradient_checkpointing: bool = False,
    seq_len: int = DEFAULT_SEQ,
    sessions: int = 1,
) -> float:
    """Hours a run on ``tokens`` tokens takes with ``count`` GPUs of ``tflops`` dense TFLOPS
    each: the training steps (attention included) plus start-up and checkpoint saves."""
    steps = compute_hours(spec, method, tokens, tflops, count, mfu, gradient_checkpointing, seq_len)
    return steps + overhead_hours(spec, method, steps, sessions)


def rentable_gpus() -> list[GPU]:
    return [g for g in list_gpus() if g.price_per_hour is not None]


def smallest_setups(
    spec: ModelSpec, method: str, *, batch_size: int = DEFAULT_BATCH, seq_len: int = DEFAULT_SEQ
) -> dict[str, tuple[GPU, Fit] | None]:
    """Setups that fit: 'single' (smallest one GPU), 'a100' (fewest A100 80GB) and 'largest'
    (fewest of the largest-memory GPU, up to clusters of 1024). Values are None when none fits."""
    out: dict[str, tuple[GPU, Fit] | None] = {"single": None, "a100": None, "largest": None}
    for gpu in sorted(rentable_gpus(), key=lambda g: g.usable_bytes):
        fit = find_fit(
            spec,
            method,
            gpu.usable_bytes,
            1,
            native_bf16=gpu.native_bf16,
            batch_size=batch_size,
            seq_len=seq_len,
        )
        if fit is not None and fit.fits:
            out["single"] = (gpu, fit)
            break
    largest = max(rentable_gpus(), key=lambda g: g.usable_bytes)
    for key, gpu in (("a100", get_gpu("A100 80GB")), ("largest", largest)):
        for count in NODE_COUNTS + CLUSTER_COUNTS:
            fit = find_fit(
                spec,
                method,
                gpu.usable_bytes,
                count,
                native_bf16=gpu.native_bf16,
                batch_size=batch_size,
                seq_len=seq_len,
            )
            if fit is None:
                break
            if fit.fits:
                out[key] = (gpu, fit)
                break
    return out


def needs_text(spec: ModelSpec, method: str, seq_len: int = DEFAULT_SEQ) -> str:
    """E.g. 'full fine-tuning needs 132.3 GiB: 1 x H200, or 2 x A100 80GB with ZeRO-3'."""
    setups = smallest_setups(spec, method, seq_len=seq_len)
    one = _estimate(spec, method, True, 1, 0, 1, seq_len, True)
    parts = []
    if setups["single"]:
        gpu, fit = setups["single"]
        parts.append(f"1 x {gpu.name} ({fit.settings_text()})")
    for key in ("a100", "largest"):
        setup = setups[key]
        if setup is not None and setup[1].count > 1:
            gpu, fit = setup
            node = " across several nodes" if fit.count > 8 else ""
            parts.append(f"{fit.count} x {gpu.name} with ZeRO-3{node}")
            break
    label = METHOD_WORDS[method]
    if not parts:
        return (
            f"{label} of {spec.name} fits no GPU setup up to 1024 GPUs "
            f"(one GPU would need {one.total_bytes / GiB:,.1f} GiB at batch 1 x {seq_len} with "
            f"checkpointing)"
        )
    return (
        f"{label} needs {one.total_bytes / GiB:,.1f} GiB on one GPU (batch 1 x {seq_len} "
        f"with checkpointing): {' or '.join(parts)}"
    )


# ----- changes that make a run fit ------------------------------------------------------------
# Used by `lessonkit vram --gpu` (the first one or two) and by the OOM doctor (more, ranked).
MIN_SEQ = 256  # a "shorter sequence" change goes down to this, and to a quarter at most


def fix_candidates(
    settings: dict[str, Any],
    native_bf16: bool = True,
    more: bool = False,
    one_device: bool = False,
) -> list[list[dict[str, Any]]]:
    """Groups of changes to a run, least disruptive first; each group gives at most one fix.
    ``native_bf16`` is False for GPUs that only emulate bf16 (T4, V100): fp16 is usual there.
    ``more`` adds changes that alter what is trained or slow each step down: a shorter
    sequence (after a smaller micro-batch) and optimizer offload (before more GPUs).
    ``one_device``: no more GPUs and no DeepSpeed (a Mac's GPU, MPS)."""
    ckpt = {"gradient_checkpointing": True}
    batch, accum = settings["batch_size"], settings["gradient_accumulation"]
    smaller = []
    for with_ckpt in [False, True] if not settings["gradient_checkpointing"] else [False]:
        b = batch // 2
        while b >= 1:
            # gradient accumulation keeps the effective batch
            change = {"batch_size": b, "gradient_accumulation": accum * -(-batch // b)}
            smaller.append(change | (ckpt if with_ckpt else {}))
            b //= 2
    # activation offloading (with checkpointing, as modelled) costs host transfers, not results
    offload = ckpt | {"activation_offload": True}
    groups: list[list[dict[str, Any]]] = [[ckpt, offload], smaller]
    if settings.get("loss", "standard") == "standard":  # no full fp32 logits; same results
        chunked = {"loss": "chunked"}
        groups.insert(1, [chunked, chunked | ckpt])
    if settings.get("no_sync") and settings.get("zero_stage") == 3:
        # reduce every micro-batch: shards instead of full gradients; more traffic, same results
        synced = {"no_sync": False}
        groups.insert(0, [synced, synced | ckpt])
    if accum == 1 and settings["n_gpus"] == 1:  # the step in backward: one gradient at a time
        in_backward = {"optimizer_in_backward": True}
        groups.insert(1, [in_backward, in_backward | ckpt])
    usual = usual_precision(settings["method"], native_bf16)
    if settings["precision"] not in (usual, "fp16-mixed" if usual == "bf16-mixed" else usual):
        groups.insert(1, [{"precision": usual}, {"precision": usual} | ckpt])
    if settings["method"] == "full" and "8bit" not in settings["optimizer"]:
        groups.insert(1, [{"optimizer": "adamw-8bit"}, {"optimizer": "adamw-8bit"} | ckpt])
    if more:
        shorter, seq = [], settings["seq_len"] // 2
        while seq >= max(MIN_SEQ, settings["seq_len"] // 4):
            shorter += [{"seq_len": seq}, {"seq_len": seq} | ckpt]
            seq //= 2
        groups.append(shorter)
    targets = settings.get("lora_targets")
    if more and settings["method"] != "full" and isinstance(targets, (list, tuple)):
        # LoRA on the experts' weights folds a copy of each expert stack in every layer
        kept = tuple(t for t in targets if expert_targets(t) is None)
        if kept and len(kept) < len(targets):
            groups.append([{"lora_targets": kept}, {"lora_targets": kept} | ckpt])
    for method in ("lora", "qlora")[("full", "lora", "qlora").index(settings["method"]) :]:
        switch = {"method": method, "precision": usual_precision(method, native_bf16)}
        groups.append(
            [
                switch,
                switch | ckpt,
                switch | ckpt | {"batch_size": 1, "gradient_accumulation": accum * batch},
            ]
        )
    if more and not settings.get("offload_optimizer") and not one_device:
        offload = {"zero_stage": max(2, settings.get("zero_stage", 0)), "offload_optimizer": True}
        if settings.get("no_sync") and offload["zero_stage"] == 2:
            offload["no_sync"] = False  # ZeRO-2 refuses it
        groups.append([offload, offload | ckpt])
    if settings["method"] != "qlora" and settings["n_gpus"] == 1 and not one_device:
        # fewest GPUs first, each also with checkpointing: sharding leaves the activations
        # whole, so a run whose weights alone overflow one GPU (a mixture of experts) needs both
        sharded = [{"n_gpus": n, "zero_stage": 3} for n in (2, 4, 8)]
        groups.append([change | extra for change in sharded for extra in ({}, ckpt)])
    return groups


def fit_changes(
    model: Any,
    settings: dict[str, Any],
    usable_bytes: float,
    limit: int = 2,
    native_bf16: bool = True,
    more: bool = False,
    one_device: bool = False,
    cached: bool = False,
    skip_hopeless: bool = False,
) -> list[tuple[dict[str, Any], Any]]:
    """Up to ``limit`` changes to a run that make it fit in ``usable_bytes``, cheapest first,
    as (changed estimate() keywords, MemoryReport) pairs; a change that only adds to one
    already found is left out. ``more`` and ``one_device``: see ``fix_candidates``.
    ``cached``: estimates through ``estimate_cached`` (for a live readout that asks again).
    ``skip_hopeless``: try each group's last, strongest change first and leave the group
    out when even that does not fit (fewer estimates for a live readout)."""
    from ..errors import LessonkitError
    from ..memory.estimating import estimate as estimate_afresh

    estimate = estimate_cached if cached else estimate_afresh

    found: list[tuple[dict[str, Any], Any]] = []
    for group in fix_candidates(settings, native_bf16, more, one_device):
        if skip_hopeless and len(group) > 1:
            try:
                if not estimate(model, **(settings | group[-1])).fits(usable_bytes):
                    continue
            except LessonkitError:
                pass  # the strongest is refused: try the others
        for change in group:
            change = {k: v for k, v in change.items() if settings.get(k) != v}
            if not change or any(kept.items() <= change.items() for kept, _ in found):
                continue
            try:
                report = estimate(model, **(settings | change))
            except LessonkitError:  # e.g. a setting that QLoRA does not allow
                continue
            if report.fits(usable_bytes):
                found.append((change, report))
                break
        if len(found) >= limit:
            break
    return found


def change_flags(change: dict[str, Any]) -> str:
    """A change as command-line flags: '--gradient-checkpointing --batch-size 2'; flags to
    drop come last: '--gradient-checkpointing, without --no-sync'."""
    words, dropped = [], []
    for name, value in change.items():
        flag = "--" + name.replace("_", "-")
        if value is False:
            dropped.append(flag)
        elif isinstance(value, (list, tuple)):  # LoRA targets: as --lora-targets takes them
            words.append(f"{flag} {','.join(map(str, value))}")
        else:
            words.append(flag if value is True else f"{flag} {value}")
    without = f"without {' '.join(dropped)}" if dropped else ""
    return ", ".join(part for part in (" ".join(words), without) if part)


def vram_fixes(
    model: object,
    settings: dict[str, Any],
    usable_bytes: int,
    limit: int = 2,
    native_bf16: bool = True,
) -> list[tuple[str, Any]]:
    """Up to ``limit`` changes to a run that make it fit in ``usable_bytes``, as
    (command-line flags, MemoryReport) pairs (``fit_changes``)."""
    return [
        (change_flags(change), report)
        for change, report in fit_changes(model, settings, usable_bytes, limit, native_bf16)
    ]
