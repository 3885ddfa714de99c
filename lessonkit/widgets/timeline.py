"""The timeline explorer: one training step's estimated memory over time, live.

``timeline_explorer(model, **defaults)`` shows ``charts.memory_timeline`` of the estimate with
controls for the model, method, batch, sequence length and gradient checkpointing: turn
checkpointing on and the backward becomes a saw-tooth (each layer's activations recomputed, then
freed) far below the forward's pile of saved activations. Built like the other explorers
(widgets/explorer.py): CSS class ``lessonkit-timeline-explorer``; a callback never raises.
"""

from __future__ import annotations

import html
import re
from typing import Any

from ..charts.timeline_chart import TimelineChart
from ..units import GiB
from .controls import (
    build_controls,
    estimate_settings,
    precision_follows_method,
    split_defaults,
    sync_enabled,
)
from .explorer import explorer_class, new_figure

TIMELINE_CONTROLS = [
    "model",
    "method",
    "precision",
    "batch_size",
    "seq_len",
    "gradient_checkpointing",
]


# The timeline's moment labels (memory/timeline.py), in the words of the readout.
MOMENT_WORDS = (
    (r"loading, done", "at the end of the loading of the checkpoint"),
    (r"loading, the warm-up block", "as the loading of the checkpoint reserves its warm-up block"),
    (r"loading, (.+)", r"during the loading of the checkpoint, at \1"),
    (r"forward, (\d+) of (\d+) layers", r"in the forward pass, after \1 of \2 layers"),
    (r"forward, the loss \(logits\)", "at the end of the forward pass, as the loss is computed"),
    (
        r"backward, the loss's gradient",
        "at the start of the backward pass, when the gradients of the logits appear",
    ),
    (r"backward, layer (\d+) of (\d+)", r"in the backward pass, at layer \1 of \2"),
    (r"backward, the end", "at the end of the backward pass"),
    (r"optimizer step, before", "just before the optimizer step"),
    (r"optimizer step, after", "just after the optimizer step"),
)


def moment_words(label: str) -> str:
    """A moment of the step in a sentence: 'backward, layer 5 of 32' becomes 'in the backward
    pass, at layer 5 of 32'; a bare phase, 'during the backward pass'."""
    from ..memory.report import phase_words

    for pattern, words in MOMENT_WORDS:
        if re.fullmatch(pattern, label):
            return re.sub(pattern, words, label)
    phase = {"optimizer step": "optimizer"}.get(label, label)
    return f"during the {phase_words(phase)}"


def timeline_readout(report: Any) -> str:
    """HTML: the peak of tensors, the moment it happens (in words), and how high the forward
    and the backward go."""
    timeline = report.timeline
    where = timeline.labels[timeline.peak_index] if timeline.labels else timeline.peak_phase
    forward = [t for t, p in zip(timeline.totals, timeline.phases, strict=True) if p == "forward"]
    backward = [t for t, p in zip(timeline.totals, timeline.phases, strict=True) if p == "backward"]
    lows = (
        (
            f"; the backward swings between {min(backward) / GiB:,.1f} and "
            f"{max(backward) / GiB:,.1f} GiB"
        )
        if backward
        else ""
    )
    return (
        f"<b>Peak of tensors: {timeline.peak_bytes / GiB:,.2f} GiB</b>, "
        f"{html.escape(moment_words(where))}; the forward ends at {max(forward, default=0) / GiB:,.1f} "
        f"GiB{lows}.<br>Per GPU with the CUDA context and allocator margin: "
        f"{report.total_bytes / GiB:,.2f} GiB."
    )


def timeline_explorer(
    model: Any = "7B", *, continuous_update: bool = False, **defaults: Any
) -> Any:
    """Controls for a setup driving the estimated memory timeline of one step; other
    ``estimate`` keywords in ``defaults`` are passed through unchanged."""
    from ..planning.fitting import estimate_cached

    values, fixed = split_defaults(TIMELINE_CONTROLS, model, defaults)
    controls = build_controls(TIMELINE_CONTROLS, values, continuous_update)
    figure = new_figure(8.5, 3.6, left=0.08, right=0.74, bottom=0.12, top=0.9)
    chart = TimelineChart(figure.add_subplot())

    def update(explorer: Any) -> str:
        sync_enabled(controls)
        report = estimate_cached(controls["model"].value, **estimate_settings(controls, fixed))
        chart.update(report)
        explorer.report = report
        return timeline_readout(report)

    return explorer_class()(
        "timeline",
        controls,
        update,
        figure,
        [["model", "method"], ["precision", "batch_size"], ["seq_len", "gradient_checkpointing"]],
        link=precision_follows_method(controls),
        chart=chart,
        report=None,
    )
