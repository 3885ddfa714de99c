"""The memory of one training step drawn over time: ``charts.memory_timeline``.

A stacked area of live tensor memory by category (GiB, the unit of GPU memory; coloured as in
the breakdown chart), moment by moment through the forward, the backward and the optimizer step
(shaded and named), with the peak marked. A report's timeline holds tensors only: where the
report adds a CUDA context and an allocator margin (on a GPU), a dotted line shows its peak per
GPU with them. matplotlib is imported only when drawing.
"""

from __future__ import annotations

from typing import Any

from .errors import LessonkitError
from .palette import CATEGORY_COLORS
from .report import LABELS, MemoryReport
from .timeline import Timeline
from .units import GiB

PHASE_SHADES = {"forward": "#F2F2F2", "backward": "#FFFFFF", "optimizer": "#ECECF4"}
SOURCE_WORDS = {"estimate": "estimated", "measure": "measured", "snapshot": "CUDA snapshot"}


def _label(category: str) -> str:
    if category == "before_trace":
        from .memory_snapshot import BEFORE_LABEL

        return BEFORE_LABEL
    return LABELS.get(category, category.replace("_", " ").capitalize())


def _parts(source: Any) -> tuple[Timeline, MemoryReport | None]:
    if isinstance(source, Timeline):
        return source, None
    if isinstance(source, MemoryReport):
        timeline = source.timeline
        if timeline is None:
            raise LessonkitError("This report has no timeline (reports from estimate() and "
                                 "measure() have one).")
        return timeline, source
    raise LessonkitError(f"memory_timeline draws a MemoryReport or a Timeline, got "
                         f"{type(source).__name__}.")


class TimelineChart:
    """A memory timeline on ``ax``; ``update`` draws another report or timeline on it."""

    def __init__(self, ax: Any, gpu: Any = None, legend: bool = True) -> None:
        self.ax, self.gpu, self.legend = ax, gpu, legend
        self.timeline: Timeline | None = None
        self.report: MemoryReport | None = None
        self.peak_line: Any = None
        self.stacks: list[Any] = []

    def update(self, source: Any, title: str | None = None) -> None:
        timeline, report = _parts(source)
        if len(timeline) == 0:
            raise LessonkitError("This timeline has no moments to draw.")
        self.timeline, self.report = timeline, report
        ax = self.ax
        ax.clear()
        x = list(range(len(timeline)))
        names = timeline.categories
        ys = [[v / GiB for v in timeline.series[c]] for c in names]
        for phase, first, last in timeline.phase_spans():
            ax.axvspan(first - 0.5, last + 0.5, color=PHASE_SHADES.get(phase, "#F7F7F7"), lw=0,
                       zorder=0)
        self.stacks = ax.stackplot(
            x, *ys, colors=[CATEGORY_COLORS.get(c, CATEGORY_COLORS["other"]) for c in names],
            labels=[_label(c) for c in names], linewidth=0, zorder=2)
        peak_i, peak = timeline.peak_index, timeline.peak_bytes / GiB
        self.peak_line = ax.axvline(peak_i, color="black", lw=0.9, ls="--", zorder=3)
        ax.plot([peak_i], [peak], marker="o", color="black", ms=4, zorder=4)
        where = timeline.labels[peak_i] if timeline.labels else timeline.peak_phase
        ax.annotate(f"peak {peak:,.2f} GiB\n({where})", (peak_i, peak), xytext=(6, 4),
                    textcoords="offset points", fontsize=8, va="bottom",
                    ha="right" if peak_i > 0.7 * len(x) else "left", zorder=5)
        top = peak
        if report is not None and report.total_bytes > timeline.peak_bytes:
            total = report.total_bytes / GiB
            ax.axhline(total, color="0.3", lw=0.9, ls=":", zorder=3)
            ax.text(0.99, total, f"{total:,.2f} GiB per GPU with the CUDA context and allocator "
                    "margin", transform=ax.get_yaxis_transform(), fontsize=7.5, va="bottom",
                    ha="right", color="0.25")
            top = total
        if self.gpu is not None:
            usable = getattr(self.gpu, "usable_bytes", None) or self.gpu
            usable = float(usable) / GiB
            ax.axhline(usable, color="#B22222", lw=0.9, ls="--", zorder=3)
            ax.text(0.99, usable, f"{getattr(self.gpu, 'name', 'GPU')}: {usable:,.1f} GiB usable",
                    transform=ax.get_yaxis_transform(), ha="right", va="top", fontsize=7.5,
                    color="#B22222")
            top = max(top, usable)
        ax.set_ylim(0, top * 1.22 if top > 0 else 1)
        ax.set_xlim(-0.5, len(x) - 0.5)
        for phase, first, last in timeline.phase_spans():
            if last - first >= 0.06 * len(x):
                ax.text((first + last) / 2, 0.985, phase, transform=ax.get_xaxis_transform(),
                        ha="center", va="top", fontsize=8, color="0.35")
        ax.set_ylabel("Live memory (GiB)")
        ax.set_xlabel("moments of one training step, in order")
        ax.set_xticks([])
        if self.legend:
            handles, labels = ax.get_legend_handles_labels()
            ax.legend(handles[::-1], labels[::-1], fontsize=7.5, loc="upper left",
                      bbox_to_anchor=(1.01, 1.0), frameon=False)
        if title is None:
            words = SOURCE_WORDS.get(timeline.source, timeline.source)
            title = (f"{report.model.name}: {report._settings_line()} ({words})"
                     if report is not None else f"One training step ({words})")
        ax.set_title(title, fontsize=9)

    def heights(self, index: int) -> dict[str, float]:
        """GiB per category at moment ``index``, as drawn (for checks)."""
        assert self.timeline is not None
        return {c: self.timeline.series[c][index] / GiB for c in self.timeline.categories}


def memory_timeline(source: MemoryReport | Timeline, ax: Any = None, *, gpu: Any = None,
                    title: str | None = None, legend: bool = True) -> TimelineChart:
    """Draw one training step's memory over time: ``source`` is a MemoryReport (from
    ``estimate`` or ``measure``) or a Timeline (e.g. ``memory_snapshot.timeline_from_snapshot``);
    ``gpu`` (a catalog GPU or bytes) adds a line at its usable memory. Without ``ax`` a new
    pyplot figure is made."""
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(8.5, 3.6), layout="constrained")
    chart = TimelineChart(ax, gpu=gpu, legend=legend)
    chart.update(source, title)
    return chart
