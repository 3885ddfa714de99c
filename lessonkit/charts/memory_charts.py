"""Plain matplotlib charts of the course: each function draws on an ``ax`` it is given.

No widgets here (see widgets/explorers.py); matplotlib is imported inside the functions that need it, so
importing this module is cheap. ``draw_breakdown`` returns a chart object whose ``update``
changes the bars in place, which is how the live explorers redraw quickly.

This module draws a run's memory: the breakdown with its GPU lines and which GPUs fit.
Its neighbours, re-exported here so that ``lessonkit.charts.<name>`` reaches them all:
hardware/gpu_records.py (what is read from a GPU record), charts/planning_charts.py (cost per environment,
the guide's decision flow), charts/timeline_chart.py (memory over a training step) and charts/palette.py
(the colours).

Units: the memory charts draw in GiB (2**30 bytes), the unit of GPU memory. A card sold as
"80 GB" has 80 GiB of memory chips, of which PyTorch can allocate its *usable* memory (79.2 GiB
on an A100 80GB); a run's peak must fit in that, so the GPU lines of ``draw_breakdown`` and the
GPU bars of ``draw_gpu_fit`` stand at usable memory, and headroom is usable memory minus the
peak.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import LessonkitError

# Re-exported: ``lessonkit.charts.<name>`` is the one place the notebooks and tests look.
from ..hardware.gpu_records import (
    catalog_gpus,
    field,
    fit_note,
    gpu_fits,
    gpu_label,
    gpu_memory_gb,
    gpu_usable_bytes,
    headroom_text,
    price_text,
    usable_text,
)
from ..memory.report import CATEGORIES, LABELS, MemoryReport
from ..units import GiB
from .palette import ALERT_COLOR, CATEGORY_COLORS, FIT_COLOR, NO_FIT_COLOR

# The sizes cards are sold as ("24 GB", really GiB) of common training GPUs: the breakdown
# chart draws a line at the usable memory of the catalog's card of each size.
COMMON_GPU_SIZES_GB = (16, 24, 40, 48, 80, 141)


def size_lines(
    gpu_sizes: Iterable[float] | None = None, gpus: Sequence[Any] | None = None
) -> list[tuple[float, str]]:
    """(GiB, label) of each GPU line, lowest first.

    For each card size (what it is sold as: 24 for "24 GB"), the line stands at the usable
    memory of the catalog's first card of that size (the guide's, then one you can rent, then by
    name) and names the cards with exactly that usable memory: (79.2, "A100 80GB, H100 PCIe
    (79.2 GiB usable)"). A size with no catalog card is drawn at its full size, so labelled.
    """
    gpus = catalog_gpus() if gpus is None else gpus
    lines = []
    for size in sorted(float(s) for s in (gpu_sizes or COMMON_GPU_SIZES_GB)):
        same = [g for g in gpus if abs(gpu_memory_gb(g) - size) < 0.5]
        same.sort(
            key=lambda g: (
                not field(g, "in_guide", default=False),
                field(g, "price_per_hour") is None,
                gpu_label(g),
            )
        )
        if not same:
            lines.append((size, f"{size:g} GB card (full size; usable is less)"))
            continue
        usable = gpu_usable_bytes(same[0])
        names = [gpu_label(g) for g in same if gpu_usable_bytes(g) == usable]
        lines.append((usable / GiB, f"{', '.join(names[:2])} ({usable_text(same[0])} usable)"))
    return sorted(lines)


def largest_gpu(
    gpus: Sequence[Any] | None = None, gpu_sizes: Iterable[float] | None = None
) -> tuple[float, str]:
    """(bytes, description) of the largest single device known, by usable memory
    ('MI300X, 191.5 GiB usable'); without a catalog, the largest size line."""
    gpus = catalog_gpus() if gpus is None else gpus
    best = max(gpus, key=gpu_usable_bytes, default=None)
    if best is not None:
        return gpu_usable_bytes(best), f"{gpu_label(best)}, {usable_text(best)} usable"
    size = max(float(s) for s in (gpu_sizes or COMMON_GPU_SIZES_GB))
    return size * GiB, f"a {size:g} GB card"


# ----- memory breakdown --------------------------------------------------------------------
def _segments(report: MemoryReport) -> dict[str, float]:
    """GiB per category in stacking order, extra categories folded into 'other'."""
    seg = {key: report.breakdown.get(key, 0) / GiB for key in CATEGORIES}
    seg["other"] = sum(v for k, v in report.breakdown.items() if k not in CATEGORIES) / GiB
    return seg


LABEL_HEIGHT = 0.055  # a GPU line's label, as a fraction of the axis height (7.5 pt text)


def axis_top(peaks: Sequence[float], lines: Sequence[float]) -> float:
    """The y axis' top (GiB): the tallest bar and the nearest GPU line above it, so that a small
    LoRA/QLoRA bar is read against the cards it fits on, not against the largest one."""
    peak = max(peaks)
    above = [s for s in lines if s >= peak]
    if not above:
        return peak * 1.4  # room for the note that it does not fit
    return max(peak * 1.15, min(above) * 1.12)


def ways_to_fit(report: MemoryReport) -> list[str]:
    """What would bring this run's peak down, given the settings it already has."""
    s = report.settings
    ways = []
    if s.get("method") == "full":
        ways.append("LoRA/QLoRA")
    elif s.get("method") == "lora":
        ways.append("QLoRA (4-bit base weights)")
    if not s.get("gradient_checkpointing"):
        ways.append("gradient checkpointing")
    if s.get("method") != "qlora" and (s.get("n_gpus", 1) == 1 or s.get("zero_stage", 0) < 3):
        ways.append(
            "more GPUs with ZeRO-3/FSDP"
            if s.get("n_gpus", 1) == 1
            else "ZeRO-3/FSDP to shard the weights"
        )
    if s.get("method") == "full" and not s.get("offload_optimizer"):
        ways.append("optimizer offload")
    if s.get("batch_size", 1) > 1:
        ways.append("a smaller batch")
    return ["Try " + ", ".join(ways)] if ways else ["A larger GPU or a smaller model"]


def default_label(report: MemoryReport) -> str:
    s = report.settings
    label = f"{report.model.name}\n{s.get('method', '')}"
    if s.get("method") in ("lora", "qlora") and s.get("lora_rank"):
        label += f" r={s['lora_rank']}"
    return label


class BreakdownChart:
    """Stacked bars of MemoryReport breakdowns (GiB) with dashed lines at common GPUs' usable
    memory; ``update`` redraws in place."""

    def __init__(
        self, ax: Any, gpu_sizes: Iterable[float] | None = None, gpus: Sequence[Any] | None = None
    ) -> None:
        self.ax = ax
        gpus = catalog_gpus() if gpus is None else list(gpus)
        self.lines = size_lines(gpu_sizes, gpus)
        self.largest_bytes, self.largest_name = largest_gpu(gpus, gpu_sizes)
        self.containers: dict[str, Any] = {}
        self.peak_texts: list[Any] = []
        self.n_bars = -1
        ax.set_ylabel("Peak memory per GPU (GiB)")
        self.gpu_lines = []
        self.gpu_texts = []
        for size, label in self.lines:
            self.gpu_lines.append(ax.axhline(size, color="0.35", lw=0.9, ls="--", zorder=1))
            self.gpu_texts.append(
                ax.text(
                    0.995,
                    size,
                    label,
                    transform=ax.get_yaxis_transform(),
                    ha="right",
                    va="bottom",
                    fontsize=7.5,
                    color="0.25",
                    clip_on=True,
                    zorder=4,
                )
            )
        self.note = ax.text(
            0.01,
            0.98,
            "",
            transform=ax.transAxes,
            ha="left",
            va="top",
            fontsize=9,
            color=ALERT_COLOR,
            fontweight="bold",
            zorder=5,
        )
        self.legend = None
        self.show_other = False
        self.legend_version = 0
        self.xlabels: tuple[str, ...] = ()
        self._over_bars: list[Any] | None = None

    def _build(self, n: int) -> None:
        for container in self.containers.values():
            container.remove()
        for text in self.peak_texts:
            text.remove()
        x = list(range(n))
        self.containers = {
            key: self.ax.bar(
                x,
                [0.0] * n,
                width=0.55,
                color=CATEGORY_COLORS[key],
                label=LABELS.get(key, "Other"),
                zorder=2,
            )
            for key in (*CATEGORIES, "other")
        }
        self.peak_texts = [
            self.ax.text(
                i, 0, "", ha="center", va="bottom", fontsize=9, fontweight="bold", zorder=5
            )
            for i in x
        ]
        self.ax.set_xticks(x)
        self.ax.set_xlim(-0.6, n - 0.4 + (0.6 if n == 1 else 0.0))
        self.n_bars = n
        self._over_bars = None

    def _legend(self, show_other: bool) -> None:
        keys = [*CATEGORIES, "other"] if show_other else list(CATEGORIES)
        handles = [self.containers[k] for k in reversed(keys)]
        from matplotlib.legend import Legend

        if self.legend is not None:
            self.legend.remove()
        # Placed beside the axes but owned by the figure: a live redraw can then repaint the
        # axes alone over a saved picture of the rest (the legend changes rarely).
        legend = Legend(
            self.ax,
            handles,
            [h.get_label() for h in handles],
            fontsize=7.5,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            frameon=False,
        )
        figure = self.ax.figure
        figure.legends.append(legend)
        legend._remove_method = figure.legends.remove
        self.legend = legend
        self.show_other = show_other
        self.legend_version += 1

    def update(
        self, reports: MemoryReport | Sequence[MemoryReport], labels: Sequence[str] | None = None
    ) -> None:
        """Show these reports: bar heights, peak labels, limits and the no-fit note."""
        reports = [reports] if isinstance(reports, MemoryReport) else list(reports)
        if not reports:
            raise LessonkitError("draw_breakdown needs at least one MemoryReport.")
        if labels is not None and len(labels) != len(reports):
            raise LessonkitError(f"Got {len(labels)} labels for {len(reports)} reports.")
        if len(reports) != self.n_bars:
            self._build(len(reports))
            self.legend = None
        segments = [_segments(r) for r in reports]
        show_other = any(s["other"] > 0 for s in segments)
        if self.legend is None or show_other != self.show_other:
            self._legend(show_other)
        bottoms = [0.0] * len(reports)
        for key, container in self.containers.items():
            for i, patch in enumerate(container.patches):
                patch.set_y(bottoms[i])
                patch.set_height(segments[i][key])
                bottoms[i] += segments[i][key]
        too_big = []
        for i, (report, text) in enumerate(zip(reports, self.peak_texts, strict=True)):
            text.set_position((i, report.total_bytes / GiB))
            text.set_text(f"{report.total_bytes / GiB:,.1f} GiB")
            big = report.total_bytes > self.largest_bytes
            text.set_color(ALERT_COLOR if big else "black")
            if big:
                too_big.append(i)
        xlabels = tuple(labels) if labels is not None else tuple(default_label(r) for r in reports)
        if xlabels != self.xlabels:
            self.ax.set_xticklabels(list(xlabels), fontsize=8)
            self.xlabels = xlabels
        top = axis_top([r.total_bytes / GiB for r in reports], [s for s, _ in self.lines])
        self.ax.set_ylim(0, top)
        self._thin_gpu_labels(top)
        if too_big:
            which = "" if len(reports) == 1 else f"Bar {', '.join(str(i + 1) for i in too_big)}: "
            self.note.set_text(
                f"{which}does not fit on any single GPU (largest: {self.largest_name}).\n"
                + textwrap.fill("; ".join(ways_to_fit(reports[too_big[0]])) + ".", 62)
            )
        else:
            self.note.set_text("")
        if len(reports) == 1:
            title = reports[0]._settings_line()
            # a long one (every saver, several GPUs) a size smaller, so it stays on the figure
            self.ax.set_title(title, fontsize=9 if len(title) <= 90 else 8)

    def _thin_gpu_labels(self, top: float) -> None:
        # A label sits on top of its line and is LABEL_HEIGHT of the axis tall: it is shown only
        # where no other line crosses it and it does not overlap the last label shown.
        height = LABEL_HEIGHT * top
        sizes = [size for size, _ in self.lines]
        shown = -math.inf
        for i, (size, text) in enumerate(zip(sizes, self.gpu_texts, strict=True)):
            above = sizes[i + 1] if i + 1 < len(sizes) else math.inf
            visible = size - shown >= height and above - size >= height and size < top - height
            text.set_visible(visible)
            if visible:
                shown = size

    def static_key(self) -> tuple:
        """Changes whenever anything but the live artists (see ``live_artists``) changes: a
        picture of the rest can be reused while it stays the same."""
        note = self.note.get_text() if self._note_apart() else None
        return (self.legend_version, self.n_bars, tuple(self.ax.get_ylim()), self.xlabels, note)

    def live_artists(self) -> list[Any]:
        """What a control change redraws, in drawing order: bars, spines, GPU labels, peak labels,
        the note and the title (spines and labels drawn over the bars, as in a full draw). The
        note (long, slow to draw) is left to the saved picture when nothing live overlaps it."""
        artists = [p for c in self.containers.values() for p in c.patches]
        artists += [*self.ax.spines.values(), *self._gpu_texts_over_bars(), *self.peak_texts]
        if not self._note_apart():
            artists.append(self.note)
        return [*sorted(artists, key=lambda a: a.get_zorder()), self.ax.title]

    def _note_apart(self) -> bool:
        """True when the note is empty or clear of every bar and label drawn live."""
        if not self.note.get_text():
            return True
        renderer = self.ax.figure._get_renderer()
        text = self.note.get_window_extent(renderer)
        box = text.padded(2)
        others = [p for c in self.containers.values() for p in c.patches if p.get_height()]
        others += [*self._gpu_texts_over_bars(), *self.peak_texts]
        # a note long enough to reach the axes' edge is drawn under the spines when live
        spines = [s.get_window_extent(renderer) for s in self.ax.spines.values()]
        return not any(
            box.overlaps(a.get_window_extent(renderer)) for a in others if a.get_visible()
        ) and not any(text.overlaps(spine) for spine in spines)

    def _gpu_texts_over_bars(self) -> list[Any]:
        # A GPU size label beside the bars never changes; only one a bar can reach must be
        # drawn again over it. Neither the bars' nor the labels' x extent depends on the data.
        if self._over_bars is None:
            renderer = self.ax.figure._get_renderer()
            to_display = self.ax.transData.transform
            spans = []
            for container in self.containers.values():
                for patch in container.patches:
                    x0, x1 = patch.get_x(), patch.get_x() + patch.get_width()
                    spans.append((to_display((x0, 0))[0], to_display((x1, 0))[0]))
                break  # every category's bars share the same x extents
            over = []
            for text in self.gpu_texts:
                box = text.get_window_extent(renderer)
                if any(box.x0 - 2 < b and a < box.x1 + 2 for a, b in spans):
                    over.append(text)
            self._over_bars = over
        return self._over_bars

    def heights(self) -> list[dict[str, float]]:
        """GiB per category of each bar, as drawn (for checks)."""
        return [
            {key: c.patches[i].get_height() for key, c in self.containers.items()}
            for i in range(self.n_bars)
        ]


def draw_breakdown(
    ax: Any,
    reports: MemoryReport | Sequence[MemoryReport],
    gpu_sizes: Iterable[float] | None = None,
    labels: Sequence[str] | None = None,
) -> BreakdownChart:
    """Stacked bars of one or more reports' peak memory (GiB), with lines at the usable memory
    of common GPUs (one per card size in ``gpu_sizes``, see ``size_lines``)."""
    chart = BreakdownChart(ax, gpu_sizes)
    chart.update(reports, labels)
    return chart


# ----- which GPUs fit ----------------------------------------------------------------------
def draw_gpu_fit(
    ax: Any, report: MemoryReport, gpus: Sequence[Any], *, settings: bool = True
) -> dict[str, Any]:
    """One bar per GPU (usable memory, GiB), coloured by whether the report's peak fits on it.

    The required peak is a vertical line; labels give the headroom (or shortfall) and the price
    per hour; the guide's four GPUs (``in_guide``) are drawn with a dark edge and bold names.
    ``update_gpu_fit`` shows another report on the same artists. With ``settings=False`` the
    title leaves out the setup (an explorer shows it in its readout, and a title that changes
    less often stays in its saved picture).
    """
    gpus = sorted(gpus, key=lambda g: (gpu_usable_bytes(g), gpu_label(g)))
    if not gpus:
        raise LessonkitError("draw_gpu_fit needs at least one GPU record.")
    sizes = [gpu_usable_bytes(g) / GiB for g in gpus]
    guide = [bool(field(g, "in_guide", default=False)) for g in gpus]
    y = list(range(len(gpus)))
    bars = ax.barh(
        y,
        sizes,
        height=0.65,
        color=NO_FIT_COLOR,
        edgecolor=["black" if g else "none" for g in guide],
        linewidth=1.4,
        zorder=2,
    )
    ax.set_yticks(y)
    ax.set_yticklabels(
        [
            f"{gpu_label(g)}{' *' if gd else ''} ({gpu_memory_gb(g):g} GB card)"
            for g, gd in zip(gpus, guide, strict=True)
        ],
        fontsize=8,
    )
    for tick, gd in zip(ax.get_yticklabels(), guide, strict=True):
        tick.set_fontweight("bold" if gd else "normal")
    labels = [ax.text(0, i, "", va="center", fontsize=7.5) for i in y]
    line = ax.axvline(0, color=ALERT_COLOR, lw=1.6, zorder=3)
    need_text = ax.text(
        0,
        0.995,
        "",
        transform=ax.get_xaxis_transform(),
        ha="left",
        va="top",
        fontsize=8,
        color=ALERT_COLOR,
        bbox=dict(fc="white", ec="none", pad=1),
        zorder=4,
    )
    ax.set_ylim(-0.7, len(gpus) - 0.3)
    ax.set_xlabel("Memory one device offers to PyTorch (GiB); * = in the guide's matrix")
    drawn = {
        "bars": bars,
        "labels": labels,
        "line": line,
        "need_text": need_text,
        "gpus": gpus,
        "sizes": sizes,
        "fits": [],
    }
    update_gpu_fit(ax, drawn, report, settings=settings)
    return drawn


def update_gpu_fit(
    ax: Any, drawn: dict[str, Any], report: MemoryReport, *, settings: bool = True
) -> dict[str, Any]:
    """Show ``report`` on a chart from ``draw_gpu_fit``: colours, labels, the line and the title
    change in place (the bars' lengths and names stay)."""
    gpus, sizes = drawn["gpus"], drawn["sizes"]
    need = report.total_bytes / GiB
    fits = [gpu_fits(g, report) for g in gpus]
    # The x axis grows in steps of 1.5x past the largest GPU, so most changes keep it (and the
    # explorer repaints only what changed).
    steps = math.ceil(math.log(need / max(sizes), 1.5)) if need > max(sizes) else 0
    right = max(sizes) * 1.45 * 1.5**steps
    for i, (gpu, size, fit, patch, label) in enumerate(
        zip(gpus, sizes, fits, drawn["bars"].patches, drawn["labels"], strict=True)
    ):
        patch.set_facecolor(FIT_COLOR if fit else NO_FIT_COLOR)
        text = headroom_text(gpu, report)
        note = fit_note(gpu, report)
        if note:
            text = f"{text}; {note}"
        price = price_text(gpu)
        label.set_text(text + (f"  {price}" if price else ""))
        label.set_position((size + right * 0.01, i))
        label.set_color("black" if fit else ALERT_COLOR)
    drawn["line"].set_xdata([need, need])
    drawn["need_text"].set_position((need + right * 0.008, 0.995))
    drawn["need_text"].set_text(f"needs {need:,.1f} GiB")
    if ax.get_xlim() != (0, right):
        ax.set_xlim(0, right)
    setup = f" {report._settings_line()}\n" if settings else " "
    title = f"{report.model.name}:{setup}fits on {sum(fits)} of {len(gpus)} GPUs"
    if ax.get_title() != title:
        ax.set_title(title, fontsize=9)
    drawn["fits"] = fits
    return drawn


def gpu_fit_live_artists(ax: Any, drawn: dict[str, Any]) -> list[Any]:
    """What a new report changes on a ``draw_gpu_fit`` chart, in drawing order (bars under the
    spines, labels and the line, as in a full draw). The title is not among them: an explorer
    keeps it in its saved picture (its static key holds the title)."""
    artists = [
        *drawn["bars"].patches,
        *ax.spines.values(),
        *drawn["labels"],
        drawn["line"],
        drawn["need_text"],
    ]
    return sorted(artists, key=lambda a: a.get_zorder())
