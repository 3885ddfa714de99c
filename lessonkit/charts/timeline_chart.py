"""The memory of one training step drawn over time: ``charts.memory_timeline``.

A stacked area of live tensor memory by category (GiB, the unit of GPU memory; coloured as in
the breakdown chart), moment by moment through the forward, the backward and the optimizer step
(shaded and named), with the peak marked. A report's timeline holds tensors only: where the
report adds a CUDA context and an allocator margin (on a GPU), a dotted line shows its peak per
GPU with them. matplotlib is imported only when drawing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..errors import LessonkitError
from ..memory.report import LABELS, MemoryReport
from ..memory.timeline import Timeline
from ..units import GiB
from .layout import clear_of
from .palette import CATEGORY_COLORS

FONT_SIZE = 9  # every text, at the size the chart is shown (see charts/layout.py)
HEADROOM = 1.3  # the y axis reaches this times the highest value drawn: room for the labels
PEAK_OFFSETS = [(6, 4), (6, 16), (6, 28), (6, 40), (6, -6), (6, -18)]  # points from the peak
PHASE_SHADES = {"forward": "#F2F2F2", "backward": "#FFFFFF", "optimizer": "#ECECF4"}
SOURCE_WORDS = {"estimate": "estimated", "measure": "measured", "snapshot": "CUDA snapshot"}


def _label(category: str) -> str:
    if category == "before_trace":
        from ..memory.cuda_snapshot import BEFORE_LABEL

        return BEFORE_LABEL
    return LABELS.get(category, category.replace("_", " ").capitalize())


def _parts(source: Any) -> tuple[Timeline, MemoryReport | None]:
    # the step itself is drawn; loading's moments before it are the report's text
    if isinstance(source, Timeline):
        return source.step_only(), None
    if isinstance(source, MemoryReport):
        timeline = source.timeline
        if timeline is None:
            raise LessonkitError(
                "This report has no timeline (reports from estimate() and measure() have one)."
            )
        return timeline.step_only(), source
    raise LessonkitError(
        f"memory_timeline draws a MemoryReport or a Timeline, got {type(source).__name__}."
    )


class TimelineChart:
    """A memory timeline on ``ax``; ``update`` draws another report or timeline on it, changing
    its artists in place (so a live explorer redraws quickly).

    "Peak" means what it means everywhere in the course: the peak per GPU, the report's
    ``total_bytes``. Where the report adds a CUDA context and an allocator margin, the highest
    moment of the tensors is labelled "tensors' peak" and the dotted line "peak per GPU"; where
    it adds nothing (a measurement on the CPU) the two are one, labelled "peak per GPU". Labels
    are placed when the chart is drawn, where no other label and no line is (``layout``).
    """

    def __init__(self, ax: Any, gpu: Any = None, legend: bool = True) -> None:
        from matplotlib.collections import PolyCollection

        self._poly = PolyCollection
        self.ax, self.gpu, self.legend = ax, gpu, legend
        self.timeline: Timeline | None = None
        self.report: MemoryReport | None = None
        self.areas: dict[str, Any] = {}  # category -> its band (a PolyCollection)
        self._shown: tuple[str, ...] = ()
        self._phase_artists: list[Any] = []
        self._phase_texts: list[tuple[Any, float]] = []  # (name, middle of its span)
        self._totals: list[int] = []
        self._top = 1.0  # the highest value drawn (GiB); the axis leaves room above it
        # the peak's line rises from the axis to the peak, so it crosses no label above it
        (self.peak_line,) = ax.plot([0, 0], [0, 0], color="black", lw=0.9, ls="--", zorder=3)
        (self.peak_dot,) = ax.plot([0], [0], marker="o", color="black", ms=4, zorder=4)
        self.peak_text = ax.annotate(
            "",
            (0, 0),
            xytext=(6, 4),
            textcoords="offset points",
            fontsize=FONT_SIZE,
            va="bottom",
            zorder=5,
        )
        self.total_line = ax.axhline(0, color="0.3", lw=0.9, ls=":", zorder=3)
        self.total_text = ax.text(
            0.99,
            0,
            "",
            transform=ax.get_yaxis_transform(),
            fontsize=FONT_SIZE,
            va="bottom",
            ha="right",
            color="0.25",
            zorder=5,
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
            fontsize=FONT_SIZE,
            color="#B22222",
            zorder=5,
        )
        for text in (self.peak_text, self.total_text, self.gpu_text):
            # over the coloured bands a label stays readable
            text.set_bbox(dict(fc="white", ec="none", alpha=0.8, pad=1))
        ax.set_ylabel("Live memory (GiB)", fontsize=FONT_SIZE + 1)
        ax.set_xlabel("moments of one training step, in order", fontsize=FONT_SIZE + 1)
        ax.set_xticks([])
        ax.tick_params(labelsize=FONT_SIZE)
        ax.add_artist(_placer(self))

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
        self._totals = timeline.totals
        ax, n = self.ax, len(timeline)
        names = tuple(timeline.categories)
        bottom = [0.0] * n
        for category in names:
            stacked = [b + v / GiB for b, v in zip(bottom, timeline.series[category], strict=True)]
            verts = [(i, t) for i, t in enumerate(stacked)] + [
                (i, b) for i, b in reversed(list(enumerate(bottom)))
            ]
            self._band(category).set_verts([verts])
            bottom = stacked
        for category, band in self.areas.items():
            band.set_visible(category in names)
        self._phases(timeline)
        peak_i, peak = timeline.peak_index, timeline.peak_bytes / GiB
        self.peak_line.set_data([peak_i, peak_i], [0, peak])
        self.peak_dot.set_data([peak_i], [peak])
        where = timeline.labels[peak_i] if timeline.labels else timeline.peak_phase
        self.peak_text.xy = (peak_i, peak)
        extra = report is not None and report.total_bytes > timeline.peak_bytes
        if report is not None and not extra:
            name = "peak per GPU"  # nothing added to the tensors: the two peaks are one
        else:
            name = "tensors' peak"
        self.peak_text.set_text(f"{name} {peak:,.2f} GiB\n({where})")
        top = peak
        self.total_line.set_visible(extra)
        self.total_text.set_visible(extra)
        if extra:
            assert report is not None
            total = report.total_bytes / GiB
            self.total_line.set_ydata([total, total])
            self.total_text.set_y(total)
            self.total_text.set_text(
                f"{total:,.2f} GiB peak per GPU with the CUDA context and allocator margin"
            )
            top = max(top, total)
        if self.gpu is not None:
            usable = float(getattr(self.gpu, "usable_bytes", None) or self.gpu) / GiB
            self.gpu_line.set_ydata([usable, usable])
            self.gpu_text.set_y(usable)
            self.gpu_text.set_text(f"{getattr(self.gpu, 'name', 'GPU')}: {usable:,.1f} GiB usable")
            top = max(top, usable)
        self._top = top if top > 0 else 1.0
        ax.set_ylim(0, self._top * HEADROOM)
        ax.set_xlim(-0.5, n - 0.5)
        if self.legend and names != self._shown:
            handles = [self.areas[c] for c in reversed(names)]
            ax.legend(
                handles,
                [h.get_label() for h in handles],
                fontsize=FONT_SIZE,
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
        ax.set_title(title, fontsize=FONT_SIZE)
        self.place(ax.figure._get_renderer(), grow=True)

    def _phases(self, timeline: Timeline) -> None:
        for artist in self._phase_artists:
            artist.remove()
        self._phase_artists, self._phase_texts = [], []
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
                text = self.ax.text(
                    (first + last) / 2,
                    0.985,
                    phase,
                    transform=self.ax.get_xaxis_transform(),
                    ha="center",
                    va="top",
                    fontsize=FONT_SIZE,
                    color="0.35",
                )
                self._phase_artists.append(text)
                self._phase_texts.append((text, (first + last) / 2))

    def place(self, renderer: Any, grow: bool = False) -> None:
        """Put the line labels, then the peak's label, where no other label and no line is:
        above the coloured bands where there is room, else over them on a white ground. With
        ``grow`` (``update`` does it, before a layout sizes the axes and their tick labels)
        the y axis first grows where that makes room; when drawing it keeps the axis."""
        if self.timeline is None:
            return
        self._fit_phase_names(renderer)
        if grow:
            top = self._top * HEADROOM
            for above_bands in (True, True, False, False, False):
                self.ax.set_ylim(0, top)
                if self._place(renderer, above_bands):
                    return
                top *= 1.2
        elif not (self._place(renderer, True) or self._place(renderer, False)):
            self.place(renderer, grow=True)  # this size has no room at all

    def _fit_phase_names(self, renderer: Any) -> None:
        """A phase's name inside the axes (a short last phase's name ends at the right edge),
        and left out where it would run into its neighbour's."""
        frame, shown = self.ax.bbox, list[Any]()
        for text, middle in self._phase_texts:
            text.set_visible(True)
            text.set_x(middle)
            text.set_horizontalalignment("center")
            box = text.get_window_extent(renderer)
            if box.x1 > frame.x1 - 2 or box.x0 < frame.x0 + 2:
                text.set_horizontalalignment("right" if box.x1 > frame.x1 - 2 else "left")
                x = frame.x1 - 3 if box.x1 > frame.x1 - 2 else frame.x0 + 3
                text.set_x(self.ax.transData.inverted().transform((x, 0))[0])
                box = text.get_window_extent(renderer)
            if not clear_of(box.padded(3), shown):
                text.set_visible(False)
            else:
                shown.append(box)

    def _place(self, renderer: Any, above_bands: bool) -> bool:
        assert self.timeline is not None
        frame = self.ax.bbox
        peak_i, n = self.timeline.peak_index, len(self.timeline)
        fixed = [t.get_window_extent(renderer) for t, _ in self._phase_texts if t.get_visible()]
        lines = [self.peak_line, self.peak_dot]
        labelled = [
            (text, line)
            for text, line in ((self.total_text, self.total_line), (self.gpu_text, self.gpu_line))
            if text.get_visible() and text.get_text()
        ]
        away = peak_i <= 0.5 * n  # the side away from the peak first: the right when it is left
        sides = [(0.99, "right"), (0.01, "left")] if away else [(0.01, "left"), (0.99, "right")]
        for text, line in labelled:
            others = [other for _, other in labelled if other is not line]
            for (x, ha), va in [(side, va) for side in sides for va in ("bottom", "top")]:
                text.set_x(x)
                text.set_horizontalalignment(ha)
                text.set_verticalalignment(va)
                box = text.get_window_extent(renderer)
                if self._fits(box, frame, fixed, lines + others, above_bands):
                    fixed.append(box)
                    break
            else:
                return False
        lines += [line for _, line in labelled]
        sign = 1 if peak_i <= 0.7 * n else -1  # the peak's label on the side with more room
        for dx, dy in [(sign * x, y) for x, y in PEAK_OFFSETS] + [
            (-sign * x, y) for x, y in PEAK_OFFSETS
        ]:
            self.peak_text.set_position((dx, dy))
            self.peak_text.set_horizontalalignment("left" if dx > 0 else "right")
            self.peak_text.set_verticalalignment("bottom" if dy > 0 else "top")
            box = self.peak_text.get_window_extent(renderer)
            if self._fits(box, frame, fixed, lines, above_bands):
                return True
        return False

    def _fits(
        self, box: Any, frame: Any, boxes: list[Any], lines: list[Any], above_bands: bool
    ) -> bool:
        inside = (
            box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0 and box.y1 <= frame.y1
        )
        if not inside or not clear_of(box.padded(2), boxes, lines):
            return False
        return not above_bands or box.y0 >= self._bands_under(box)

    def _bands_under(self, box: Any) -> float:
        """The top of the coloured bands (display y) under a box's width."""
        assert self.timeline is not None
        to_data = self.ax.transData.inverted()
        (left, _), (right, _) = to_data.transform([(box.x0, box.y0), (box.x1, box.y0)])
        totals = self._totals
        first = max(0, math.floor(left))
        last = min(len(totals) - 1, math.ceil(right))
        if first > last:
            return -math.inf
        highest = max(totals[first : last + 1]) / GiB
        return float(self.ax.transData.transform((0, highest))[1])

    def heights(self, index: int) -> dict[str, float]:
        """GiB per category at moment ``index``, as drawn (for checks)."""
        assert self.timeline is not None
        return {c: self.timeline.series[c][index] / GiB for c in self.timeline.categories}


def _placer(chart: TimelineChart) -> Any:
    """An invisible artist drawn first in its axes: it places the chart's labels once the axes
    have their final size (a constrained layout sets it only when the figure is drawn)."""
    from matplotlib.artist import Artist

    class Placer(Artist):
        def draw(self, renderer: Any) -> None:
            chart.place(renderer)

    placer = Placer()
    placer.set_zorder(-100)
    return placer


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


def memory_timelines(
    sources: Sequence[MemoryReport | Timeline],
    *,
    gpu: Any = None,
    titles: Sequence[str | None] | None = None,
) -> list[TimelineChart]:
    """Several timelines to compare (a measurement and an estimate, say), one above the other
    at a width a notebook shows without shrinking them, so their fonts stay readable; each has
    its own legend and the same words for its peaks. A new pyplot figure is made."""
    import matplotlib.pyplot as plt

    sources = list(sources)
    if not sources:
        raise LessonkitError("memory_timelines needs at least one report or timeline.")
    if titles is not None and len(titles) != len(sources):
        raise LessonkitError(f"Got {len(titles)} titles for {len(sources)} timelines.")
    _, axes = plt.subplots(
        len(sources), 1, figsize=(8.5, 3.3 * len(sources)), layout="constrained", squeeze=False
    )
    return [
        memory_timeline(
            source, ax, gpu=gpu, title=None if titles is None else titles[i], legend=True
        )
        for i, (source, ax) in enumerate(zip(sources, axes[:, 0], strict=False))
    ]
