"""MemoryReport: the shape of both an estimate and a measurement of a training step's memory."""

from __future__ import annotations

import html
import json
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from ..errors import LessonkitError
from ..models.spec import ModelSpec
from ..units import GB, GiB, parse_bytes

# Breakdown categories, in the order they are stacked in charts and tables.
CATEGORIES = (
    "weights",  # parameters and buffers (quantized base weights for QLoRA)
    "gradients",  # gradients of trainable parameters
    "optimizer",  # optimizer states (and fp32 master weights where used)
    "activations",  # tensors saved for backward, live at the peak
    "logits",  # fp32 logits / loss temporaries (large for big vocabularies)
    "temporaries",  # other short-lived buffers: optimizer-step temporaries, dequantized weights
    "cuda_context",  # CUDA context and library workspaces (0 on CPU)
    "allocator_margin",  # caching-allocator reserve above allocated tensors (0 on CPU)
)
LABELS = {
    "weights": "Weights",
    "gradients": "Gradients",
    "optimizer": "Optimizer states",
    "activations": "Activations",
    "logits": "Logits & loss (fp32)",
    "temporaries": "Temporaries",
    "cuda_context": "CUDA context",
    "allocator_margin": "Allocator margin",
}
PHASES = ("forward", "backward", "optimizer")


# How the course says each phase of a step in a sentence ("the peak is in the backward pass").
PHASE_WORDS = {
    "loading": "loading of the checkpoint",
    "forward": "forward pass",
    "backward": "backward pass",
    "optimizer": "optimizer step",
}


def phase_words(phase: str) -> str:
    """'backward pass' for 'backward', 'optimizer step' for 'optimizer'; others as they are."""
    return PHASE_WORDS.get(phase, phase)


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


def _memory_bytes(memory: Any) -> float:
    """Bytes from a number of bytes, a size string ('16 GB') or an object with usable_bytes."""
    usable = getattr(memory, "usable_bytes", None)
    if isinstance(usable, numbers.Real) and not isinstance(memory, (numbers.Real, str)):
        return float(usable)
    if isinstance(memory, str):
        value = parse_bytes(memory)
    elif isinstance(memory, numbers.Real) and not _is_bool(memory):
        value = float(memory)
    else:
        raise LessonkitError(
            f"GPU memory must be a number of bytes (16e9), a size such as "
            f"'16 GB' or '15 GiB', or a GPU from get_gpu(); got {memory!r}."
        )
    if not math.isfinite(value) or value < 0:
        raise LessonkitError(f"GPU memory must be a finite size >= 0, got {memory!r}.")
    return value


@dataclass
class MemoryReport:
    """Peak memory of one training step on one GPU, broken down by category.

    ``breakdown`` is the composition at the peak; ``total_bytes`` is the peak per GPU including
    the CUDA context and allocator margin (what nvidia-smi shows); ``tensor_bytes`` leaves those
    two out. ``managed_bytes`` is the part of the optimizer states a paged bitsandbytes
    optimizer keeps in CUDA managed memory on a GPU (also when the step is estimated or measured
    on the CPU, where bitsandbytes keeps them as ordinary tensors): nvidia-smi counts it while it
    is on the GPU, torch's ``max_memory_allocated`` and ``memory_reserved`` do not (see
    ``memory_figures``).
    """

    model: ModelSpec
    settings: dict[str, Any]
    breakdown: dict[str, int]
    peak_phase: str  # "forward", "backward" or "optimizer"; phase_words() says it in a sentence
    phase_peaks: dict[str, int] = field(default_factory=dict)
    assumptions: list[str] = field(default_factory=list)
    source: str = "estimate"
    # a timeline.Timeline, or a function that makes one when first asked for (see ``timeline``)
    timeline_source: Any = field(default=None, repr=False, compare=False)
    managed_bytes: int = 0
    # loading the checkpoint before the first step (memory/loading.py Loading), where known,
    # or a function that works it out when first asked for (see ``loading``)
    loading_source: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.breakdown = {key: int(self.breakdown.get(key, 0)) for key in CATEGORIES} | {
            key: int(value) for key, value in self.breakdown.items() if key not in CATEGORIES
        }

    @property
    def loading(self) -> Any:
        """Loading the checkpoint before the first step (a memory.loading.Loading), or None
        where it is not modelled; worked out on first use, so an estimate stays quick."""
        if callable(self.loading_source):
            self.loading_source = self.loading_source()
        return self.loading_source

    @property
    def timeline(self) -> Any:
        """The step's live tensor bytes by category, moment by moment (a timeline.Timeline),
        or None; its highest moment is ``tensor_bytes``."""
        if callable(self.timeline_source):
            self.timeline_source = self.timeline_source()
        return self.timeline_source

    @property
    def total_bytes(self) -> int:
        return sum(self.breakdown.values())

    @property
    def tensor_bytes(self) -> int:
        return (
            self.total_bytes - self.breakdown["cuda_context"] - self.breakdown["allocator_margin"]
        )

    @property
    def allocated_peak_bytes(self) -> int:
        """The peak of torch.cuda.max_memory_allocated: tensors in torch's caching allocator."""
        return self.tensor_bytes - self.managed_bytes

    @property
    def reserved_bytes(self) -> int:
        """torch.cuda.memory_reserved at the peak: the allocated peak plus the allocator margin."""
        return self.allocated_peak_bytes + self.breakdown["allocator_margin"]

    @property
    def run_reserved_bytes(self) -> int:
        """torch.cuda.max_memory_reserved over a run that loads the checkpoint first: the
        higher of what loading left reserved and the step's reserve (the step reuses the
        segments loading made)."""
        loaded = self.loading.reserved_bytes if self.loading is not None else 0
        return max(loaded, self.reserved_bytes)

    def loading_lines(self) -> list[str]:
        """The loading moment in words, for the report's text ([] where it is not known)."""
        load = self.loading
        if load is None:
            return []
        which = "loading's" if load.reserved_bytes > self.reserved_bytes else "the step's"
        return [
            f"  {'Loading (before step)':<22}{load.peak_allocated_bytes / GiB:>8.2f} GiB"
            f"  (peak allocated; {load.reserved_bytes / GiB:.2f} GiB stays reserved)",
            f"  {'Reserved over the run':<22}{self.run_reserved_bytes / GiB:>8.2f} GiB"
            f"  (torch.cuda.max_memory_reserved: {which} reserve, the higher)",
        ]

    def memory_figures(self) -> list[tuple[str, int, str]]:
        """(figure, bytes, what it includes) for each figure a learner reads on a GPU."""
        paged = self.managed_bytes
        states = f", not the {paged / GiB:.2f} GiB of paged optimizer states" if paged else ""
        return [
            (
                "torch.cuda.max_memory_allocated",
                self.allocated_peak_bytes,
                f"tensors in torch's caching allocator{states}",
            ),
            (
                "torch.cuda.memory_reserved",
                self.reserved_bytes,
                f"the allocated peak plus the allocator margin{states}",
            ),
            (
                "nvidia-smi",
                self.total_bytes,
                "the reserved memory, the CUDA context"
                + (
                    " and the paged optimizer states (CUDA managed memory) while they are on "
                    "the GPU; when the GPU runs short, the driver moves them to CPU RAM"
                    if paged
                    else ""
                ),
            ),
        ]

    @property
    def total_gb(self) -> float:
        return self.total_bytes / GB

    def fits(self, gpu_memory: Any) -> bool:
        """True when the peak fits in a GPU with this much memory: a number of bytes, a size
        such as '16 GB' or '14.75 GiB', or a catalog GPU (its usable memory)."""
        return self.total_bytes <= _memory_bytes(gpu_memory)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.name,
            "n_params": self.model.n_params,
            "active_params": self.model.active_params,
            "source": self.source,
            "settings": dict(self.settings),
            "breakdown": dict(self.breakdown),
            "total_bytes": self.total_bytes,
            "tensor_bytes": self.tensor_bytes,
            "managed_bytes": self.managed_bytes,
            "peak_phase": self.peak_phase,
            "phase_peaks": dict(self.phase_peaks),
            "assumptions": list(self.assumptions),
        } | (
            {"loading": self.loading.to_dict(), "run_reserved_bytes": self.run_reserved_bytes}
            if self.loading is not None
            else {}
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def _params_text(self) -> str:
        """ "6.74B params", or with experts "30.53B params, 3.35B active"."""
        return self.model.params_text

    def _settings_line(self) -> str:
        s = self.settings
        parts = [
            str(s.get("method", "")),
            str(s.get("precision", "")),
            str(s.get("optimizer", "")),
            f"batch {s.get('batch_size')} x {s.get('seq_len')} tokens",
        ]
        if s.get("gradient_checkpointing"):
            parts.append("checkpointing" + (" + offload" if s.get("activation_offload") else ""))
        if s.get("optimizer_in_backward"):
            parts.append("step in backward")
        if s.get("loss") == "chunked":
            parts.append("chunked loss")
        if s.get("n_gpus", 1) > 1:
            parts.append(
                f"{s['n_gpus']} GPUs, ZeRO-{s.get('zero_stage', 0)}"
                + (
                    f", {s['gradient_accumulation']} micro-batches with no_sync"
                    if s.get("no_sync")
                    else ""
                )
            )
        return ", ".join(p for p in parts if p)

    def rows(self) -> list[tuple[str, int]]:
        """(label, bytes) for each non-empty category, in stacking order."""
        return [(LABELS.get(k, k), v) for k, v in self.breakdown.items() if v]

    def __str__(self) -> str:
        title = f"{self.model.name} ({self._params_text()}): {self._settings_line()}"
        lines = [title] + ([f"{'source':<22}{self.source}"] if self.source != "estimate" else [])
        for label, value in self.rows():
            lines.append(f"  {label:<20}{value / GiB:>10.2f} GiB")
        lines.append(
            f"  {'Peak per GPU':<20}{self.total_bytes / GiB:>10.2f} GiB"
            f"  (during the {phase_words(self.peak_phase)})"
        )
        if self.managed_bytes:
            for figure, value, includes in self.memory_figures():
                lines.append(f"  {figure:<33}{value / GiB:>8.2f} GiB  ({includes})")
        lines += self.loading_lines()
        lines += [f"  - {a}" for a in self.assumptions]
        return "\n".join(lines)

    def _loading_html(self) -> str:
        load = self.loading
        if load is None:
            return ""
        return (
            f" Loading the checkpoint first: {load.peak_allocated_bytes / GiB:.2f} GiB "
            f"allocated at its peak, {load.reserved_bytes / GiB:.2f} GiB stays reserved; "
            f"reserved over the run {self.run_reserved_bytes / GiB:.2f} GiB."
        )

    def _repr_html_(self) -> str:
        body = "".join(
            f"<tr><td>{html.escape(label)}</td><td style='text-align:right'>{value / GiB:.2f} GiB</td></tr>"
            for label, value in self.rows()
        )
        notes = "".join(f"<li>{html.escape(a)}</li>" for a in self.assumptions)
        return (
            f"<div class='lessonkit-report'><b>{html.escape(self.model.name)}</b> "
            f"({html.escape(self._params_text())}): {html.escape(self._settings_line())}"
            f"<br><small>{html.escape(self.source)}</small>"
            f"<table>{body}<tr><th>Peak per GPU</th><th style='text-align:right'>"
            f"{self.total_bytes / GiB:.2f} GiB</th></tr></table>"
            f"<small>Peak during the {phase_words(self.peak_phase)}.{self._loading_html()}</small>"
            f"{'<ul>' + notes + '</ul>' if notes else ''}</div>"
        )
