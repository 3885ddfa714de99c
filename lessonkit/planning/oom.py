"""The OOM doctor: an out-of-memory error turned into the cheapest changes that make the run fit.

``oom_doctor(error, model, **settings)`` reads the error (planning/oom_messages.py, a log of any
length through planning/oom_logs.py), works out how much memory the run could have had on that
GPU (its free memory plus what this process held), reads the run from its settings or objects
(planning/training_objects.py), and answers with a ``Diagnosis``:
what the message shows (fragmentation, another process holding memory, a run larger than its
settings say) and the ranked changes that make the estimate fit, each with its new peak
(``fitting.fit_changes``, the same search ``lessonkit vram --gpu`` uses). It never raises: a
message it cannot read, or settings it cannot estimate, are said so in the diagnosis.

``oom_doctor.watch(...)`` is a context manager for notebooks: an out-of-memory error inside it
prints the diagnosis, then propagates: the very same exception, whatever happens while the
diagnosis is made or printed.
"""

from __future__ import annotations

import contextlib
import re
import sys
import textwrap
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from ..safe_repr import describe_error, short_repr, short_str
from ..units import GiB
from .oom_messages import WORDINGS, OOMMessage, parse_oom

MORE_FIXES = 5
# The message's figures are rounded (to 0.01 GiB): memory "held elsewhere" below this is their
# rounding, not another process.
ROUNDING = 16 * 2**20
LONGEST_PROBLEM = 2000  # characters of one problem shown
WIDTH = 88  # the doctor's lines are wrapped between words at this width
# "Large": reserved-but-unallocated or other processes' memory above this share of the card.
LARGE_SHARE = 0.05
MIN_LARGE = 512 * 2**20
NOT_OOM = (
    "This is not an out-of-memory message I know. I expected the error PyTorch raises as "
    "torch.OutOfMemoryError, e.g. 'CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
    "has a total capacity of 14.75 GiB of which 1.04 GiB is free. ...' (ROCm: 'HIP out "
    "of memory ...', PyTorch 2.0 and earlier: '... (GPU 0; 15.78 GiB total capacity; "
    "...)', a Mac: 'MPS backend out of memory ...'), the exception itself, or a "
    "traceback or log that contains it."
)


# What each figure of a message is, for saying which could not be read.
FIGURE_WORDS = {
    "tried_bytes": "the size it tried to allocate",
    "device": "the GPU's number",
    "total_bytes": "the memory of the device",
    "free_bytes": "the free memory",
    "process_bytes": "this process's memory",
    "allocated_bytes": "the memory allocated by PyTorch",
    "reserved_bytes": "the memory reserved by PyTorch",
    "private_pool_bytes": "the private pools' memory",
    "other_processes": "another process's memory or id",
    "mps_other_bytes": "the other allocations",
    "last_batch_size": "the last batch size tried",
}


def gib(n: float) -> str:
    """Device memory as PyTorch's messages write it: bytes, KiB, MiB under 1 GiB, else GiB."""
    size = abs(n)
    if size < 2**10:
        return f"{n:,.0f} bytes"
    if size < 2**20:
        return f"{n / 2**10:,.0f} KiB"
    return f"{n / 2**20:,.0f} MiB" if size < GiB else f"{n / GiB:,.2f} GiB"


@dataclass
class Fix:
    """One change to try: what it is, how to write it, and the estimated peak with it."""

    key: str
    title: str
    how: str
    peak_bytes: int | None = None
    spare_bytes: int | None = None
    change: dict[str, Any] = field(default_factory=dict)
    report: Any = field(default=None, repr=False)

    def line(self) -> str:
        text = f"{self.title}: {self.how}"
        if self.peak_bytes is not None:
            text += f" -> peak {gib(self.peak_bytes)}"
            if self.spare_bytes is not None:
                text += f" ({gib(self.spare_bytes)} to spare)"
        return text


@dataclass
class Diagnosis:
    """What oom_doctor found: the message read, what it shows, the run's estimate and the fixes
    (cheapest first). ``recognized`` is False when the text was not an OOM message."""

    recognized: bool
    message: OOMMessage | None = None
    findings: list[str] = field(default_factory=list)
    fixes: list[Fix] = field(default_factory=list)
    report: Any = field(default=None, repr=False)
    budget_bytes: int | None = None
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    card: Any = field(default=None, repr=False)  # the catalog card the message's device is

    @property
    def first_fix(self) -> Fix | None:
        return self.fixes[0] if self.fixes else None

    def __str__(self) -> str:
        try:
            return self.text()
        except Exception as err:  # a bug here must not hide the user's own error
            return (
                "Out of memory, by the look of the message; the doctor could not say more "
                f"({describe_error(err)})."
            )

    def text(self, width: int | None = WIDTH) -> str:
        """The diagnosis as text, its lines wrapped between words at ``width`` (a number stays
        with its unit: "1,002 MiB"); ``width=None`` leaves each finding on one line."""
        lines = self._lines()
        if width is None:
            return "\n".join(lines)
        return "\n".join(
            wrapped
            for text in lines
            for line in text.split("\n")
            for wrapped in wrap_line(line, width)
        )

    def _lines(self) -> list[str]:
        if not self.recognized:
            return [NOT_OOM, *(short_str(p, LONGEST_PROBLEM) for p in self.problems)]
        m = self.message
        lines = [_headline(m)]
        if m is not None and m.unreadable:
            lines.append(
                "  ! The message's figure for "
                + ", ".join(FIGURE_WORDS.get(name, name) for name in m.unreadable)
                + " could not be read (a number too large to be one); the rest is read "
                "without it."
            )
        if self.findings:
            lines += ["What the message and the estimate show:"]
            lines += [f"  - {f}" for f in self.findings]
        if self.fixes:
            lines.append(
                "Changes to try, cheapest first"
                + (" (estimated peak per GPU):" if any(f.peak_bytes for f in self.fixes) else ":")
            )
            lines += [f"  {i}. {fix.line()}" for i, fix in enumerate(self.fixes, 1)]
        # a problem quotes what it was given: a huge value is shown shortened
        lines += [f"  ! {short_str(p, LONGEST_PROBLEM)}" for p in self.problems]
        if self.notes:
            lines += ["Read from your settings:"] + [f"  - {n}" for n in self.notes]
        return lines

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def to_dict(self) -> dict[str, Any]:
        return {
            "recognized": self.recognized,
            "message": self.message.to_dict() if self.message else None,
            "findings": list(self.findings),
            "budget_bytes": self.budget_bytes,
            "estimated_peak_bytes": self.report.total_bytes if self.report else None,
            "fixes": [
                {
                    "key": f.key,
                    "title": f.title,
                    "how": f.how,
                    "change": f.change,
                    "peak_bytes": f.peak_bytes,
                    "spare_bytes": f.spare_bytes,
                }
                for f in self.fixes
            ],
            "notes": list(self.notes),
            "problems": list(self.problems),
        }


_BULLET = re.compile(r"\s*(?:- |! |\d+\. )?")
_WITH_UNIT = re.compile(r"(\d) (?=(?:GiB|MiB|KiB|GB|MB|bytes|tokens|per)\b)")
_TIMES = re.compile(r"(\d) x (?=\d)")
_KEEP = "\u2060"  # holds a number and its unit together while wrapping


def wrap_line(line: str, width: int = WIDTH) -> list[str]:
    """One line of the diagnosis wrapped between words at ``width``, under its own bullet
    ("  - ", "  1. ", "  ! "); never inside a number, nor between a number and its unit."""
    if len(line) <= width:
        return [line]
    bullet = _BULLET.match(line)
    indent = " " * (bullet.end() if bullet else 0)
    kept = _WITH_UNIT.sub(lambda match: match.group(1) + _KEEP, line)
    kept = _TIMES.sub(lambda match: match.group(1) + _KEEP + "x" + _KEEP, kept)  # "8 x 2048"
    pieces = textwrap.wrap(
        kept,
        width,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [piece.replace(_KEEP, " ") for piece in pieces] or [line]


def _headline(m: OOMMessage | None) -> str:
    if m is None:
        return "Out of memory (the message itself could not be read)."
    gpu = "the GPU" if m.device is None else f"GPU {m.device}"
    where = {"mps": "the Mac's GPU (MPS)", "cpu": "the computer's RAM"}.get(
        m.backend, f"{gpu} ({m.backend.upper()})"
    )
    text = f"Out of memory on {where}, in the words of {WORDINGS[m.wording]}"
    if m.tried_bytes is not None:  # the figures on a line of their own
        text += f":\nit tried to allocate {gib(m.tried_bytes)}"
        if m.free_bytes is not None and m.total_bytes is not None:
            text += f" with {gib(m.free_bytes)} free of {gib(m.total_bytes)}"
    if m.wrapped_by:
        text += f" (inside {', '.join(m.wrapped_by)})"
    return text + "."


# ----- what the message shows ---------------------------------------------------------------
def _this_process(m: OOMMessage) -> tuple[int | None, int]:
    """(bytes this process held, bytes other processes held) as far as the message says."""
    others = sum(b for _, b in m.other_processes)
    if m.process_bytes is not None:
        return m.process_bytes, others
    if m.other_processes and m.reserved_bytes is not None:
        # In a container the process ids differ from the host's, so this process can be listed
        # as "Process N": it is the one holding at least what PyTorch reserved.
        ours = [p for p in m.other_processes if p[1] >= m.reserved_bytes]
        if ours:
            mine = min(ours, key=lambda p: p[1])
            return mine[1], others - mine[1]
    return None, others


def _budget(m: OOMMessage, context_bytes: int) -> tuple[int | None, int | None]:
    """(memory the run could have had on this device, memory held by others) in bytes."""
    if m.backend == "mps":
        return m.total_bytes, None
    if m.total_bytes is None or m.free_bytes is None:
        return None, None
    mine, listed = _this_process(m)
    if mine is None and m.reserved_bytes is not None:
        mine = m.reserved_bytes + context_bytes  # the context is not in PyTorch's reserve
    if mine is None:
        return None, None
    budget = min(m.total_bytes, m.free_bytes + mine)
    return budget, max(listed, m.total_bytes - budget)


def _message_fixes(m: OOMMessage, d: Diagnosis, others: int | None) -> tuple[list[Fix], list[Fix]]:
    """(fixes to put first, fixes to put last) from the message alone; where both can be
    enough, the one that frees more memory comes first."""
    first: list[tuple[int, Fix]] = []
    last: list[Fix] = []
    unallocated = m.reserved_unallocated_bytes
    share = (m.total_bytes or 0) * LARGE_SHARE
    if unallocated is not None and m.backend in ("cuda", "hip"):
        cause = m.tried_bytes is not None and unallocated >= m.tried_bytes
        if cause or unallocated >= max(share, MIN_LARGE):
            # the variable the message names (ROCm builds print either spelling)
            hint = m.alloc_conf_hint or ""
            var = (
                hint.split("=")[0]
                if "=" in hint
                else ("PYTORCH_HIP_ALLOC_CONF" if m.backend == "hip" else "PYTORCH_CUDA_ALLOC_CONF")
            )
            d.findings.append(
                f"Fragmentation: PyTorch held {gib(unallocated)} reserved but unallocated"
                + (
                    f", more than the {gib(m.tried_bytes or 0)} it asked for, but in pieces too small"
                    if cause
                    else ""
                )
                + "."
            )
            old = m.alloc_conf_hint == "max_split_size_mb"
            fix = Fix(
                "expandable_segments",
                "Let the allocator grow its segments (no change to training)",
                f"set {var}=expandable_segments:True before torch starts "
                "(os.environ in the first cell, or in the shell), then restart"
                + (
                    " (this wording is from a PyTorch that suggested max_split_size_mb; "
                    "use max_split_size_mb:128 if yours has no expandable_segments)"
                    if old
                    else ""
                ),
            )
            if cause:
                first.append((unallocated, fix))
            else:
                last.append(fix)
    if others is not None and others >= max(share, MIN_LARGE):
        mine = _this_process(m)[0] if m.process_bytes is None else None
        others_listed = list(m.other_processes)
        ours = [p for p in others_listed if p[1] == mine]
        if ours:  # the one listed that is this process (in a container)
            others_listed.remove(ours[0])
        listed = ", ".join(
            f"process {'?' if pid is None else pid}: {gib(b)}"
            for pid, b in others_listed
            if b < (m.process_bytes or 0) or m.process_bytes is None
        )
        d.findings.append(
            f"Another process held about {gib(others)} of this GPU"
            + (f" ({listed})" if listed else "")
            + ": this process could use "
            f"at most {gib(d.budget_bytes or 0)}."
        )
        fix = Fix(
            "free_other_process",
            "Free the GPU memory another process holds",
            "see it with nvidia-smi (rocm-smi on ROCm); shut down other notebooks' "
            "kernels or jobs on this GPU",
        )
        helps = (
            m.tried_bytes is not None
            and m.free_bytes is not None
            and m.free_bytes + others >= m.tried_bytes
        )
        if helps:
            first.append((others, fix))
        else:
            last.append(fix)
    return [fix for _, fix in sorted(first, key=lambda item: -item[0])], last


# ----- the run's estimate and its fixes ------------------------------------------------------
_TRAINING_WORDS = {
    "gradient_checkpointing": "gradient_checkpointing=True (activation_checkpointing=True in "
    "transformers 5)",
    "optimizer": 'optim="adamw_bnb_8bit" (bitsandbytes)',
    "offload_optimizer": 'DeepSpeed ZeRO-2 with "offload_optimizer": {"device": "cpu"}',
    "activation_offload": "activation offloading: SFTConfig(activation_offloading=True) in TRL, "
    "enable_activation_offloading: True in torchtune",
    "loss": "a chunked cross-entropy that never makes the full fp32 logits: torchtune's "
    "CEWithChunkedOutputLoss (loss: torchtune.modules.loss.CEWithChunkedOutputLoss)",
    "optimizer_in_backward": "the optimizer step in backward: optimizer_in_bwd: True in "
    "torchtune (no gradient accumulation)",
    "no_sync": "reduce the gradients on every micro-batch: TrainingArguments(accelerator_config="
    "{'gradient_accumulation_kwargs': {'sync_each_batch': True}})",
}


def _fix_from_change(change: dict[str, Any], report: Any, budget: int) -> Fix:
    from .fitting import change_flags

    parts, key = [], "gradient_checkpointing"
    if "n_gpus" in change:
        key = "more_gpus"
        parts.append(f"{change['n_gpus']} GPUs with FSDP (fsdp='full_shard') or DeepSpeed ZeRO-3")
    elif "method" in change:
        key = change["method"]
        parts.append(
            "BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', "
            "bnb_4bit_use_double_quant=True) and a peft LoraConfig"
            if key == "qlora"
            else "a peft LoraConfig on the model loaded in bf16"
        )
    elif "offload_optimizer" in change:
        key = "offload_optimizer"
        parts.append(_TRAINING_WORDS["offload_optimizer"])
    elif "optimizer" in change:
        key = "8bit_optimizer"
        parts.append(_TRAINING_WORDS["optimizer"])
    elif "precision" in change:
        key = "precision"
        parts.append(
            {"bf16-mixed": "bf16=True", "fp16-mixed": "fp16=True"}.get(
                change["precision"], f"precision {change['precision']}"
            )
        )
    elif "seq_len" in change:
        key = "shorter_sequence"
        parts.append(
            f"sequences of at most {change['seq_len']} tokens (max_length= in TRL's "
            "SFTConfig, or truncate)"
        )
    elif "batch_size" in change:
        key = "smaller_micro_batch"
    elif "lora_targets" in change:
        key = "lora_targets"
        parts.append(
            f"LoraConfig(target_modules={list(change['lora_targets'])}) without "
            "target_parameters: no folded copy of each layer's expert stack"
        )
    else:
        for saver in ("no_sync", "optimizer_in_backward", "loss", "activation_offload"):
            if saver in change:
                key = saver
                parts.append(_TRAINING_WORDS[saver])
                break
    if "batch_size" in change:
        accum = change.get("gradient_accumulation")
        parts.append(
            f"per_device_train_batch_size={change['batch_size']}"
            + (f", gradient_accumulation_steps={accum} (same effective batch)" if accum else "")
        )
    if change.get("gradient_checkpointing"):
        parts.append(_TRAINING_WORDS["gradient_checkpointing"])
    titles = {
        "gradient_checkpointing": "Gradient checkpointing",
        "smaller_micro_batch": "A smaller micro-batch with gradient accumulation",
        "8bit_optimizer": "An 8-bit optimizer",
        "precision": "Mixed precision",
        "shorter_sequence": "Shorter sequences",
        "lora": "LoRA",
        "qlora": "QLoRA",
        "offload_optimizer": "Optimizer states in CPU RAM",
        "more_gpus": "More GPUs",
        "activation_offload": "Activation offloading to CPU RAM",
        "loss": "Chunked cross-entropy",
        "optimizer_in_backward": "The optimizer step in backward",
        "no_sync": "Gradients reduced every micro-batch",
        "lora_targets": "LoRA off the experts' weights",
    }
    how = "; ".join(parts) + f" [lessonkit: {change_flags(change)}]"
    return Fix(
        key,
        titles[key],
        how,
        int(report.total_bytes),
        int(budget - report.total_bytes),
        dict(change),
        report,
    )


# Settings that spread a run over several devices, and what one device runs instead.
SEVERAL_DEVICES = {"n_gpus": 1, "zero_stage": 0, "offload_optimizer": False, "no_sync": False}


def _single_device(m: OOMMessage, gpu: Any) -> str:
    """What the run is on when it is one device that cannot be joined by more ('' otherwise):
    a Mac's GPU (MPS: no NCCL, no DeepSpeed), or a one-GPU machine such as the DGX Spark."""
    if m.backend == "mps":
        return "A Mac's GPU (MPS)"
    if gpu is not None and getattr(gpu, "unified_memory", False):
        return f"The {gpu.name} (one GPU sharing its memory with the CPU)"
    return ""


def _on_one_device(d: Diagnosis, settings: dict[str, Any], single: str) -> None:
    """Settings for several GPUs (FSDP, ZeRO, DeepSpeed offload) put back to one device, said."""
    asked = {
        k: settings[k] for k in SEVERAL_DEVICES if settings.get(k) not in (None, SEVERAL_DEVICES[k])
    }
    if not asked:
        return
    settings.update({k: SEVERAL_DEVICES[k] for k in asked})
    words = ", ".join(f"{k}={short_repr(v)}" for k, v in asked.items())  # a value may be huge
    d.findings.append(
        f"{single} is a single device: several GPUs, FSDP and DeepSpeed do not run on it, so "
        f"the run is estimated on that one device (your settings said {words}) and no change "
        "below adds GPUs."
    )


def _native_bf16(m: OOMMessage | None, gpu: Any) -> bool:
    if gpu is not None:
        return bool(getattr(gpu, "native_bf16", True))
    if m is None or m.total_bytes is None:
        return True
    from ..hardware.gpus import list_gpus

    near = [g for g in list_gpus() if abs(g.usable_bytes - m.total_bytes) < 0.01 * m.total_bytes]
    return all(g.native_bf16 for g in near) if near else True


def _run_fixes(d: Diagnosis, m: OOMMessage, description: Any, gpu: Any) -> list[Fix]:
    from ..errors import LessonkitError
    from ..memory.estimating import estimate
    from .fitting import fit_changes

    settings = dict(description.settings)
    if m.wording == "batch-search":
        d.findings.append(
            "Trainer(auto_find_batch_size=True) halved the batch until none was "
            "left: even one sequence per step ran out of memory, so a smaller "
            "batch cannot help; the changes start from batch 1."
        )
        settings["batch_size"] = 1
    single = _single_device(m, gpu)
    if single:
        _on_one_device(d, settings, single)
    settings.setdefault("device", "cuda")
    try:
        report = estimate(description.model, **settings)
    except LessonkitError as err:
        d.problems.append(f"Could not estimate the run: {err}")
        return []
    d.report = report
    from ..models.presets import alias_note

    if alias_note(report.model):
        d.notes.insert(0, alias_note(report.model))
    full = {
        k: report.settings[k]
        for k in (
            "method",
            "precision",
            "optimizer",
            "batch_size",
            "seq_len",
            "gradient_checkpointing",
            "n_gpus",
            "zero_stage",
            "gradient_accumulation",
            "offload_optimizer",
        )
    }
    full |= {k: v for k, v in settings.items() if k not in full}
    budget = d.budget_bytes
    peak = report.total_bytes
    run = f"{report.model.name}, {report._settings_line()}"
    if budget is None:
        d.findings.append(
            f"The estimate of your run ({run}) is {gib(peak)} per GPU. Give gpu= (e.g. 'T4') "
            "for changes that fit."
        )
        return []
    target = budget
    if peak > budget:
        d.findings.append(
            f"The estimate of your run ({run}) is {gib(peak)} per GPU, {gib(peak - budget)} "
            f"more than {_budget_words(d, budget)}."
        )
    else:
        held = m.process_bytes if m.process_bytes is not None else _this_process(m)[0]
        if held is None and m.reserved_bytes is not None:
            held = m.reserved_bytes
        needed = None if held is None or m.tried_bytes is None else held + m.tried_bytes
        d.findings.append(
            f"The estimate of your run ({run}) is {gib(peak)} per GPU, within "
            f"{_budget_words(d, budget)}."
        )
        if needed is not None and needed > peak:
            gap = needed - peak
            target = budget - gap
            d.findings.append(
                f"Yet the process held {gib(held or 0)} and asked for {gib(m.tried_bytes or 0)} more: at "
                f"least {gib(needed)}, {gib(gap)} above the estimate. Either the run is not the "
                "one described (longer sequences than seq_len, padding to a max length, a "
                "larger evaluation batch) or this process holds something else (a model "
                "loaded earlier in the notebook: restart the kernel). The changes below keep "
                f"that {gib(gap)} free."
            )
        else:
            return []
    if target <= 0:
        return []
    # A Mac has one GPU, and neither NCCL (FSDP's several GPUs) nor DeepSpeed runs on MPS.
    mps = m.backend == "mps" or bool(single)
    found = fit_changes(
        description.model,
        full,
        target,
        limit=MORE_FIXES,
        native_bf16=_native_bf16(m, gpu),
        more=True,
        one_device=mps,
    )
    if not found:
        d.problems.append(
            "No single change tried makes it fit on this GPU (checkpointing, "
            "a smaller batch, an 8-bit optimizer, shorter sequences, LoRA/QLoRA"
            + ("): a Mac with more memory, or a rented" if mps else ", offload, more GPUs): ")
            + (" GPU, is the next step" if mps else "`lessonkit recommend` ranks GPUs that do")
            + (" (`lessonkit recommend` ranks them)." if mps else ".")
        )
    return [_fix_from_change(change, rep, target) for change, rep in found]


# ----- the doctor ------------------------------------------------------------------------------
def _diagnose(
    message: OOMMessage | None,
    objects: tuple[Any, ...],
    model: Any,
    gpu: Any,
    settings: dict[str, Any],
) -> Diagnosis:
    if message is None:
        return Diagnosis(False)
    d = Diagnosis(True, message)
    if message.backend == "cpu":
        d.findings.append(
            "This is the computer's RAM, not the GPU's: loading a model (in fp32 "
            "it takes 4 bytes per parameter) or optimizer offload needs more RAM "
            "than there is. Load in bf16 (torch_dtype=torch.bfloat16), or use a "
            "machine with more RAM."
        )
        return d
    gpu_obj = None
    if gpu is not None:
        from ..errors import LessonkitError
        from ..hardware.gpus import get_gpu

        try:
            gpu_obj = get_gpu(gpu)
        except LessonkitError as err:
            d.problems.append(str(err))
    from ..memory.step_notes import cuda_constants

    context = int(cuda_constants()["cuda_context_bytes"])
    d.budget_bytes, others = _budget(message, context)
    others = _use_the_catalog_figure(d, message, others)
    if d.budget_bytes is None and gpu_obj is not None:
        d.budget_bytes = gpu_obj.usable_bytes
    first, last = _message_fixes(message, d, others)
    fixes: list[Fix] = []
    if model is not None or objects or settings:
        from .training_objects import describe_run

        description = describe_run(*objects, model=model, **settings)
        d.notes += description.notes
        if description.model is None:
            d.problems.append(
                "No model in what was given: pass model= (a preset such as "
                "'llama-2-7b', a size such as '7B', or the model's config)."
            )
        else:
            fixes = _run_fixes(d, message, description, gpu_obj)
    else:
        d.notes.append(
            "Give the doctor your run (model= and batch_size=, seq_len=, ... or your "
            "TrainingArguments, LoraConfig, BitsAndBytesConfig) for the changes that "
            "make it fit, each with its estimated peak."
        )
    d.fixes = _rank(d, first, fixes, last, others)
    return d


def _use_the_catalog_figure(d: Diagnosis, m: OOMMessage, others: int | None) -> int | None:
    """A device the catalog knows (the message's total is a card's usable memory, give or take
    the driver's few MiB) is given the catalog's one figure for it: what a T4 offers is 14.75
    GiB here as in every other part of the course, less only what other processes held (the
    processes listed, when the rest is the rounding of the message's figures). Returns that
    memory held elsewhere."""
    if d.budget_bytes is None or m.total_bytes is None or m.backend not in ("cuda", "hip"):
        return others
    from ..hardware.gpus import card_with_total

    card = card_with_total(m.total_bytes)
    if card is None:
        return others
    _, listed = _this_process(m)
    elsewhere = others or 0
    if elsewhere - listed <= ROUNDING:
        elsewhere = listed
    d.card = card
    d.budget_bytes = max(0, card.usable_bytes - elsewhere)
    return elsewhere


def _budget_words(d: Diagnosis, budget: int) -> str:
    """'the 14.75 GiB a T4 offers', or what it could have when other processes held some."""
    if d.card is None:
        return f"the {gib(budget)} it could have here"
    name = d.card.name
    article = "an" if name[:1].upper() in "AEFHILMNORSX" else "a"  # as the letter is said
    if budget == d.card.usable_bytes:
        return f"the {d.card.usable_text} {article} {name} offers"
    return (
        f"the {gib(budget)} it could have here ({article} {name}'s {d.card.usable_text} "
        "less what other processes held)"
    )


def _rank(
    d: Diagnosis, first: list[Fix], fixes: list[Fix], last: list[Fix], others: int | None
) -> list[Fix]:
    """The message's own fixes come first only where they can be enough: when the estimate
    fits (or there is none); freeing another process when the run fits with its memory."""
    if d.report is None or d.budget_bytes is None or d.report.total_bytes <= d.budget_bytes:
        return first + fixes + last
    free = [f for f in first + last if f.key == "free_other_process"]
    if free and others is not None and d.report.total_bytes <= d.budget_bytes + others:
        return free + fixes + [f for f in first + last if f not in free]
    return fixes + first + last


def oom_doctor(
    error_or_message: Any, *objects: Any, model: Any = None, gpu: Any = None, **run_settings: Any
) -> Diagnosis:
    """Diagnose an out-of-memory error: what it shows and the cheapest changes that fit.

    ``error_or_message``: the exception, its message, or a traceback or log containing it.
    The run: ``model`` (a preset, a size, a config object or dict, a model) and estimate()
    keywords, and/or ``objects`` (a Trainer, TrainingArguments, LoraConfig, BitsAndBytesConfig).
    ``gpu``: a catalog GPU name, for messages without the card's size. Never raises.
    """
    try:
        message = parse_oom(error_or_message)
    except Exception as err:  # a bug in the reading: say so, never raise
        d = Diagnosis(False)
        d.problems.append(f"The doctor could not read the message ({describe_error(err)}).")
        return d
    try:
        return _diagnose(message, objects, model, gpu, run_settings)
    except Exception as err:  # a bug must not hide the user's own error
        d = Diagnosis(message is not None, message)
        d.problems.append(f"The doctor failed ({describe_error(err)}); the error itself is above.")
        return d


class _Watch(contextlib.ContextDecorator):
    """The context manager ``watch`` returns (see there)."""

    def __init__(
        self, objects: tuple[Any, ...], model: Any, gpu: Any, file: Any, settings: dict[str, Any]
    ) -> None:
        self.objects, self.model, self.gpu = objects, model, gpu
        self.file, self.settings = file, settings

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        if isinstance(error, Exception):
            with contextlib.suppress(Exception):  # nothing here may replace the user's error
                self._report(error)
        return False  # the error, if any, goes on as it was: the same object, untouched

    def _report(self, error: Exception) -> None:
        diagnosis = oom_doctor(
            error, *self.objects, model=self.model, gpu=self.gpu, **self.settings
        )
        if not diagnosis.recognized:
            return
        print(
            f"lessonkit.oom_doctor:\n{diagnosis}\n(In a notebook the failed step's "
            "tensors stay referenced by this traceback: restart the kernel before the "
            "next try.)",
            file=self.file or sys.stdout,
        )


def watch(
    *objects: Any, model: Any = None, gpu: Any = None, file: Any = None, **run_settings: Any
) -> contextlib.ContextDecorator:
    """``with oom_doctor.watch(trainer): trainer.train()``: an out-of-memory error inside prints
    the diagnosis (to ``file``, default stdout) and then propagates, the very same exception
    object, whatever happens while the diagnosis is made or printed; any other error passes
    untouched."""
    return _Watch(objects, model, gpu, file, run_settings)


oom_doctor.watch = watch  # type: ignore[attr-defined]
