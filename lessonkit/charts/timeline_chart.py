"""The memory of one training step drawn over time: ``charts.memory_timeline``.

A stacked area of live tensor memory by category (GiB, the unit of GPU memory; coloured as in
the breakdown chart), moment by moment through the forward, the backward and the optimizer step
(shaded and named), with the peak marked. A report's timeline holds tensors only: where the
report adds a CUDA context and an allocator margin (on a GPU), a dotted line shows its peak per
GPU with them. matplotlib is imported only when drawing.
"""

from __future__ import annotations

from typing import Any

from ..errors import LessonkitError
from ..memory.report import LABELS, MemoryReport
from ..memory.timeline import Timeline
from ..units import GiB
from .palette import CATEGORY_COLORS

PHASE_SHADES = {"forward": "#F2F2F2", "backward": "#FFFFFF", "optimizer": "#ECECF4"}
SOURCE_WORDS = {"estimate": "estimated", "measure": "measured", "snapshot": "CUDA snapshot"}


def _label(category: str) -> str:
    if category == "before_trace":
        from ..memory.cuda_snapshot import BEFORE_LABEL

        return BEFORE_LABEL
    return LABELS.get(category, category.replace("_", " ").capitalize())


def _parts(source: Any) -> tuple[Timeline, MemoryReport | None]:
    if isinstance(source, Timeline):
        return source, None
    if isinstance(source, MemoryReport):
        timeline = source.timeline
        if timeline is None:
            raise LessonkitError(
                "This report has no timeline (reports from estimate() and measure() have one)."
            )
        return timeline, source
    raise LessonkitError(
        f"memory_timeline draws a MemoryReport or a Timeline, got {type(source).__name__}."
    )


class TimelineChart:
    """A memory timeline on ``ax``; ``update`` draws another report or timeline on it, changing
    its artists in place (so a live explorer redraws quickly)."""

    def __init__(self, ax: Any, gpu: Any = None, legend: bool = True) -> None:
        from matplotlib.collections import PolyCollection

        self._poly = PolyCollection
        self.ax, self.gpu, self.legend = ax, gpu, legend
        self.timeline: Timeline | None = None
        self.report: MemoryReport | None = None
        self.areas: dict[str, Any] = {}  # category -> its band (a PolyCollection)
        self._shown: tuple[str, ...] = ()
        self._phase_artists: list[Any] = []
        self.peak_line = ax.axvline(0, color="black", lw=0.9, ls="--", zorder=3)
        (self.peak_dot,) = ax.plot([0], [0], marker="o", color="black", ms=4, zorder=4)
        self.peak_text = ax.annotate(
            "", (0, 0), xytext=(6, 4), textcoords="offset points", fontsize=8, va="bottom", zorder=5
        )
        self.total_line = ax.axhline(0, color="0.3", lw=0.9, ls=":", zorder=3)
        self.total_text = ax.text(
            0.99,
            0,
            "",
            transform=ax.get_yaxis_transform(),
            fontsize=7.5,
            va="bottom",
            ha="right",
            color="0.25",
        )
        self.gpu_line = ax.axhline(
            0, color="#B22222", lw=0.9, ls="--", zorder=3, visible=gpu is not None
        )
        self.gpu_text = ax.text(
            0.99,
            0,
            "",
            transform=ax.get_yaxis_transform(),
            ha="right",
            va="top",
            fontsize=7.5,
            color="#B22222",
        )
        ax.set_ylabel("Live memory (GiB)")
        ax.set_xlabel("moments of one training step, in order")
        ax.set_xticks([])

    @property
    def stacks(self) -> list[Any]:
        """The bands drawn, bottom first."""
        return [self.areas[c] for c in self._shown]

    def _band(self, category: str) -> Any:
        if category not in self.areas:
            band = self._poly(
                [],
                facecolors=CATEGORY_COLORS.get(category, CATEGORY_COLORS["other"]),
                linewidths=0,
                zorder=2,
                label=_label(category),
            )
            self.ax.add_collection(band)
            self.areas[category] = band
        return self.areas[category]

    def update(self, source: Any, title: str | None = None) -> None:
        timeline, report = _parts(source)
        if len(timeline) == 0:
            raise LessonkitError("This timeline has no moments to draw.")
        self.timeline, self.report = timeline, report
        ax, n = self.ax, len(timeline)
        names = tuple(timeline.categories)
        bottom = [0.0] * n
        for category in names:
            top = [b + v / GiB for b, v in zip(bottom, timeline.series[category], strict=True)]
            verts = [(i, t) for i, t in enumerate(top)] + [
                (i, b) for i, b in reversed(list(enumerate(bottom)))
            ]
            self._band(category).set_verts([verts])
            bottom = top
        for category, band in self.areas.items():
            band.set_visible(category in names)
        self._phases(timeline)
        peak_i, peak = timeline.peak_index, timeline.peak_bytes / GiB
        self.peak_line.set_xdata([peak_i, peak_i])
        self.peak_dot.set_data([peak_i], [peak])
        where = timeline.labels[peak_i] if timeline.labels else timeline.peak_phase
        self.peak_text.xy = (peak_i, peak)
        self.peak_text.set_text(f"peak {peak:,.2f} GiB\n({where})")
        self.peak_text.set_horizontalalignment("right" if peak_i > 0.7 * n else "left")
        self.peak_text.set_position((-6, 4) if peak_i > 0.7 * n else (6, 4))
        top = peak
        extra = report is not None and report.total_bytes > timeline.peak_bytes
        self.total_line.set_visible(extra)
        self.total_text.set_visible(extra)
        if extra:
            total = report.total_bytes / GiB
            self.total_line.set_ydata([total, total])
            right = peak_i > 0.5 * n  # the label on the side away from the peak's
            self.total_text.set_position((0.01 if right else 0.99, total))
            self.total_text.set_horizontalalignment("left" if right else "right")
            self.total_text.set_text(
                f"{total:,.2f} GiB per GPU with the CUDA context and allocator margin"
            )
            top = total
        if self.gpu is not None:
            usable = float(getattr(self.gpu, "usable_bytes", None) or self.gpu) / GiB
            self.gpu_line.set_ydata([usable, usable])
            self.gpu_text.set_y(usable)
            self.gpu_text.set_text(f"{getattr(self.gpu, 'name', 'GPU')}: {usable:,.1f} GiB usable")
            top = max(top, usable)
        ax.set_ylim(0, top * 1.22 if top > 0 else 1)
        ax.set_xlim(-0.5, n - 0.5)
        if self.legend and names != self._shown:
            handles = [self.areas[c] for c in reversed(names)]
            ax.legend(
                handles,
                [h.get_label() for h in handles],
                fontsize=7.5,
                loc="upper left",
                bbox_to_anchor=(1.01, 1.0),
                frameon=False,
            )
        self._shown = names
        if title is None:
            words = SOURCE_WORDS.get(timeline.source, timeline.source)
            title = (
                f"{report.model.name}: {report._settings_line()} ({words})"
                if report is not None
                else f"One training step ({words})"
            )
        ax.set_title(title, fontsize=9)

    def _phases(self, timeline: Timeline) -> None:
        for artist in self._phase_artists:
            artist.remove()
        self._phase_artists = []
        n = len(timeline)
        for phase, first, last in timeline.phase_spans():
            self._phase_artists.append(
                self.ax.axvspan(
                    first - 0.5,
                    last + 0.5,
                    color=PHASE_SHADES.get(phase, "#F7F7F7"),
                    lw=0,
                    zorder=0,
                )
            )
            if last - first >= 0.06 * n:
                self._phase_artists.append(
                    self.ax.text(
                        (first + last) / 2,
                        0.985,
                        phase,
                        transform=self.ax.get_xaxis_transform(),
                        ha="center",
                        va="top",
                        fontsize=8,
                        color="0.35",
                    )
                )

    def heights(self, index: int) -> dict[str, float]:
        """GiB per category at moment ``index``, as drawn (for checks)."""
        assert self.timeline is not None
        return {c: self.timeline.series[c][index] / GiB for c in self.timeline.categories}


def memory_timeline(
    source: MemoryReport | Timeline,
    ax: Any = None,
    *,
    gpu: Any = None,
    title: str | None = None,
    legend: bool = True,
) -> TimelineChart:
    """Draw one training step's memory over time: ``source`` is a MemoryReport (from
    ``estimate`` or ``measure``) or a Timeline (e.g. ``lessonkit.memory.timeline_from_snapshot``);
    ``gpu`` (a catalog GPU or bytes) adds a line at its usable memory. Without ``ax`` a new
    pyplot figure is made."""
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(8.5, 3.6), layout="constrained")
    chart = TimelineChart(ax, gpu=gpu, legend=legend)
    chart.update(source, title)
    return chart
