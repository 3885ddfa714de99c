"""The memory of one training step over time: live tensor bytes by category, moment by moment.

A ``Timeline`` is what ``MemoryReport.timeline`` holds: for each moment of the step (in time
order) its phase (forward, backward, optimizer) and the bytes of each category (report.CATEGORIES)
alive then. Its highest moment is the report's peak of tensors (``report.tensor_bytes``); the
CUDA context and the allocator's margin, which a report adds on a GPU, are not moments of tensors
and are left out.

Where the moments come from:
- ``measure``: every allocation and free of the tracked step (tracking.Tracker.moments), thinned
  to at most ``MAX_POINTS`` moments that keep each stretch's highest and lowest (so the peak is
  kept exactly);
- ``estimate``: first, before the step, two "loading" moments (memory/loading.py: the peak of
  loading the checkpoint, and the weights once loaded; the step's peak leaves them out); then
  the moments memory/estimating.py computes, layer by layer: the forward's saved activations
  growing layer by layer (drawn as a straight rise, as estimate models the forward by its end),
  the logits, then in the backward each layer's own moments (with checkpointing its
  recomputation: the saw-tooth) and the level between layers, then the optimizer step (its
  temporaries, between its start and end without them);
- ``cuda_snapshot.timeline_from_snapshot``: a real ``torch.cuda.memory._snapshot()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .report import CATEGORIES

MAX_POINTS = 1500


@dataclass
class Timeline:
    """Moments of one step in time order: ``phases[i]`` and ``series[category][i]`` (bytes)."""

    phases: list[str]
    series: dict[str, list[int]]
    source: str = "estimate"
    labels: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.phases)

    @property
    def categories(self) -> list[str]:
        """Categories with any bytes, in stacking order: others (a snapshot's memory from
        before its trace) at the bottom, then report.CATEGORIES."""
        order = [c for c in self.series if c not in CATEGORIES]
        order += [c for c in CATEGORIES if c in self.series]
        return [c for c in order if any(self.series[c])]

    @property
    def totals(self) -> list[int]:
        return (
            [sum(values) for values in zip(*self.series.values(), strict=True)]
            if self.series
            else []
        )

    @property
    def peak_index(self) -> int:
        """The step's highest moment (loading, before the step, left out)."""
        totals = self.totals
        step = [i for i, phase in enumerate(self.phases) if phase != "loading"]
        return max(step or range(len(totals)), key=totals.__getitem__) if totals else 0

    @property
    def peak_bytes(self) -> int:
        """Bytes at the step's highest moment."""
        totals = self.totals
        return totals[self.peak_index] if totals else 0

    @property
    def peak_phase(self) -> str:
        return self.phases[self.peak_index] if self.phases else ""

    def step_only(self) -> Timeline:
        """The step's own moments, without loading's before it (what the charts draw)."""
        keep = [i for i, phase in enumerate(self.phases) if phase != "loading"]
        if len(keep) == len(self.phases):
            return self
        return Timeline(
            phases=[self.phases[i] for i in keep],
            series={c: [values[i] for i in keep] for c, values in self.series.items()},
            source=self.source,
            labels=[self.labels[i] for i in keep] if self.labels else [],
        )

    def at(self, index: int) -> dict[str, int]:
        """Bytes by category at moment ``index``."""
        return {c: values[index] for c, values in self.series.items()}

    def phase_spans(self) -> list[tuple[str, int, int]]:
        """(phase, first index, last index) of each run of one phase, in order."""
        spans: list[tuple[str, int, int]] = []
        for i, phase in enumerate(self.phases):
            if spans and spans[-1][0] == phase:
                spans[-1] = (phase, spans[-1][1], i)
            else:
                spans.append((phase, i, i))
        return spans

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "phases": list(self.phases),
            "series": {k: list(v) for k, v in self.series.items()},
            "labels": list(self.labels),
            "peak_bytes": self.peak_bytes,
            "peak_index": self.peak_index,
        }


def keep_extremes(totals: Sequence[int], max_points: int = MAX_POINTS) -> list[int]:
    """Indices of at most about ``max_points`` moments: in each stretch, its lowest and highest
    (in time order), so the shape and the exact peak survive; the first and last are kept."""
    n = len(totals)
    if n <= max_points:
        return list(range(n))
    per = max(1, (2 * n) // max_points)
    keep = {0, n - 1}
    for start in range(0, n, per):
        stretch = range(start, min(n, start + per))
        keep.add(max(stretch, key=totals.__getitem__))
        keep.add(min(stretch, key=totals.__getitem__))
    return sorted(keep)


def from_moments(
    moments: Iterable[tuple[str, dict[str, int]]],
    source: str,
    labels: Iterable[str] | None = None,
    max_points: int = MAX_POINTS,
) -> Timeline:
    """A Timeline from (phase, {category: bytes}) moments in time order, thinned."""
    moments = list(moments)
    names = [c for c in CATEGORIES if any(c in m for _, m in moments)]
    names += sorted({c for _, m in moments for c in m} - set(names))
    series = {c: [int(m.get(c, 0)) for _, m in moments] for c in names}
    phases = [p for p, _ in moments]
    texts = list(labels) if labels is not None else []
    totals = [sum(v) for v in zip(*series.values(), strict=True)] if series else []
    keep = keep_extremes(totals, max_points)
    return Timeline(
        phases=[phases[i] for i in keep],
        series={c: [v[i] for i in keep] for c, v in series.items()},
        source=source,
        labels=[texts[i] for i in keep] if texts else [],
    )


# ----- estimate: the moments of vram._Step ------------------------------------------------------
def estimated(step: Any) -> Timeline:
    """The moments of an estimate (``step`` is vram's _Step, read through the moments it
    exposes: see the module doc)."""
    step.phases()
    parts = step.moments
    fws, bws, opt = parts["forward"], parts["backward"], parts["optimizer"]
    layers = step.spec.n_layers
    fw_end = fws[0]
    start = {
        "weights": fw_end["weights"],
        "optimizer": fw_end["optimizer"],
        "gradients": fw_end["gradients"],
        "activations": step.inputs,
    }
    top = {k: v for k, v in fw_end.items() if k != "logits"}
    moments: list[tuple[str, dict[str, int]]] = []
    labels: list[str] = []
    loading = getattr(step, "loading", None)
    if loading is not None:  # before the first forward: the checkpoint loaded (memory/loading.py)
        moments += [
            ("loading", dict(loading.peak_moment)),
            ("loading", {"weights": loading.weight_bytes}),
        ]
        labels += [
            f"loading, {loading.peak_tensor or 'the warm-up block'}",
            "loading, done",
        ]
    for j in range(layers + 1):  # the forward's saved activations, layer by layer
        moments.append(
            (
                "forward",
                {
                    k: start.get(k, 0) + (top.get(k, 0) - start.get(k, 0)) * j // layers
                    for k in set(start) | set(top)
                },
            )
        )
        labels.append(f"forward, {j} of {layers} layers")
    for moment in fws:
        moments.append(("forward", moment))
        labels.append("forward, the loss (logits)")
    if not step.fsdp:  # every layer's backward, with the level between layers
        static = {"weights": fw_end["weights"], "optimizer": fw_end["optimizer"]}
        inside, layer_labels = [], []
        for k in range(layers):  # k layers done: the last layer's backward comes first
            these = step._layer_moments(static, fw_end["gradients"], ks=[k])
            inside += these
            layer_labels += [f"backward, layer {layers - k} of {layers}"] * len(these)
        from .chunked_head import ACCUMULATION_LABELS
        from .chunked_head import LABELS as HEAD_LABELS

        head = step.head_backward  # LoRA with the chunked loss: its loss, then lm_head
        summed = step.head_accumulation  # full fine-tuning: lm_head's weight gradients
        bws = [bws[0], *summed, *head, *inside, bws[-1]]
        labels += ["backward, the loss's gradient", *ACCUMULATION_LABELS[: len(summed)]]
        labels += list(HEAD_LABELS[: len(head)])
        labels += [*layer_labels, "backward, the end"]
    else:
        labels += ["backward"] * len(bws)
    moments += [("backward", m) for m in bws]
    # the step between its start and end, where its temporaries do not exist yet or any more
    rest = dict(opt[0], temporaries=0)
    moments += [("optimizer", rest), *(("optimizer", m) for m in opt), ("optimizer", rest)]
    labels += ["optimizer step, before", *["optimizer step"] * len(opt), "optimizer step, after"]
    return from_moments(moments, "estimate", labels)
