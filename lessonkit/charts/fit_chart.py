"""Which GPUs a run fits on: one bar per GPU at its usable memory (GiB), the run's peak a
vertical line, each bar labelled with its headroom (or shortfall) and price.

``draw_gpu_fit`` draws on an ``ax`` it is given; ``update_gpu_fit`` shows another report on the
same artists (the GPU-matrix explorer repaints ``gpu_fit_live_artists`` over a saved picture of
the rest). Labels are placed where the line does not run through them (``charts/layout.py``
checks it). matplotlib is imported only when drawing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..errors import LessonkitError
from ..hardware.gpu_records import (
    field,
    fit_note,
    gpu_fits,
    gpu_label,
    gpu_memory_gb,
    gpu_usable_bytes,
    headroom_text,
    price_text,
)
from ..memory.report import MemoryReport
from ..units import GiB
from .palette import ALERT_COLOR, FIT_COLOR, NO_FIT_COLOR

# ----- which GPUs fit ----------------------------------------------------------------------
FIT_FONT_SIZE = 9
ROW_POINTS = 11.5  # the height one GPU's row needs (9 pt text and its spacing)
SHORT_NOTES = {  # fit_note's words, shortened to fit beside a bar
    "no kernels in current PyTorch wheels": "no kernels in current wheels",
    "no native bf16: runs in fp16 (same memory)": "no native bf16: runs in fp16",
}


def gpu_fit_height(n_gpus: int, margins: float = 1.4) -> float:
    """The figure height (inches) at which ``draw_gpu_fit`` shows ``n_gpus`` rows at 9 pt
    without one row's name running into the next (``margins``: the title and x axis)."""
    return margins + n_gpus * ROW_POINTS / 72


def gpu_fit_name(gpu: Any, in_guide: bool = False) -> str:
    """A bar's name: the card and the size it is sold as, unless its name says it ('RTX A6000
    (48 GB) *', 'A100 80GB *'); * marks the guide's GPUs."""
    name, sold = gpu_label(gpu), f"{gpu_memory_gb(gpu):g}"
    size = "" if f"{sold}GB" in name.replace(" ", "") else f" ({sold} GB)"
    return f"{name}{size}{' *' if in_guide else ''}"


def draw_gpu_fit(
    ax: Any, report: MemoryReport, gpus: Sequence[Any], *, settings: bool = True
) -> dict[str, Any]:
    """One bar per GPU (usable memory, GiB), coloured by whether the report's peak fits on it.

    The required peak is a vertical line; labels give the headroom (or shortfall) and the price
    per hour; the guide's four GPUs (``in_guide``) are drawn with a dark edge and bold names.
    ``update_gpu_fit`` shows another report on the same artists. With ``settings=False`` the
    title leaves out the setup (an explorer shows it in its readout, and a title that changes
    less often stays in its saved picture). A label is placed where the line does not run
    through it: beside its bar, else inside it, else past the line; "needs X GiB" stands in a
    row of its own above the bars. ``gpu_fit_height`` gives the figure height that holds the
    rows at 9 pt.
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
        [gpu_fit_name(g, gd) for g, gd in zip(gpus, guide, strict=True)], fontsize=FIT_FONT_SIZE
    )
    for tick, gd in zip(ax.get_yticklabels(), guide, strict=True):
        tick.set_fontweight("bold" if gd else "normal")
    ax.tick_params(axis="x", labelsize=FIT_FONT_SIZE)
    labels = [ax.text(0, i, "", va="center", fontsize=FIT_FONT_SIZE, zorder=4) for i in y]
    # The line stops under the row "needs X GiB" stands in, above the bars.
    (line,) = ax.plot([0, 0], [-0.7, len(gpus) - 0.4], color=ALERT_COLOR, lw=1.6, zorder=3)
    need_text = ax.text(
        0,
        len(gpus) - 0.4,
        "",
        ha="left",
        va="bottom",
        fontsize=FIT_FONT_SIZE,
        color=ALERT_COLOR,
        zorder=4,
    )
    ax.set_ylim(-0.7, len(gpus) + 0.5)  # place_gpu_fit_labels sets the top
    ax.set_xlabel(
        "Memory one device offers to PyTorch (GiB); * = in the guide's matrix",
        fontsize=FIT_FONT_SIZE,
    )
    drawn = {
        "bars": bars,
        "labels": labels,
        "line": line,
        "need_text": need_text,
        "gpus": gpus,
        "sizes": sizes,
        "fits": [],
        "need": 0.0,
        "words": [],
        "title": "",
    }
    ax.add_artist(_fit_placer(ax, drawn))
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
    # The x axis grows in steps of 1.25x past the largest GPU, so most changes keep it (and the
    # explorer repaints only what changed); past it, the line stays in the axis' right part, so
    # that the labels beside the bars end before it.
    largest = max(sizes)
    steps = math.ceil(math.log(need * 1.1 / (largest * 1.45), 1.25)) if need > largest else 0
    right = largest * 1.45 * 1.25 ** max(0, steps)
    words: list[list[str]] = []  # each label's words, longest first
    for gpu, fit, patch, label in zip(
        gpus, fits, drawn["bars"].patches, drawn["labels"], strict=True
    ):
        patch.set_facecolor(FIT_COLOR if fit else NO_FIT_COLOR)
        text = headroom_text(gpu, report)
        note = fit_note(gpu, report)
        if note:
            text = f"{text}; {SHORT_NOTES.get(note, note)}"
        price = price_text(gpu)
        words.append(
            list(dict.fromkeys([text + (f"  {price}" if price else ""), text, text.split(";")[0]]))
        )
        label.set_text(words[-1][0])
        label.set_color("black" if fit else ALERT_COLOR)
    drawn["line"].set_xdata([need, need])
    drawn["need_text"].set_text(f"needs {need:,.1f} GiB")
    drawn["need"], drawn["words"] = need, words
    if ax.get_xlim() != (0, right):
        ax.set_xlim(0, right)
    setup = f" {report._settings_line()}\n" if settings else " "
    drawn["title"] = f"{report.model.name}:{setup}fits on {sum(fits)} of {len(gpus)} GPUs"
    drawn["fits"] = fits
    place_gpu_fit_labels(ax, drawn)
    return drawn


def place_gpu_fit_labels(ax: Any, drawn: dict[str, Any], renderer: Any = None) -> None:
    """Put each label of a ``draw_gpu_fit`` chart where the "needs" line does not run through
    it: just past its bar; else inside its bar (a bar shorter than the line); else just past
    the line. "needs X GiB" goes right of the line, or left of it near the axis' right end."""
    renderer = renderer or ax.figure._get_renderer()
    frame = ax.bbox
    # a band above the bars as tall as "needs X GiB": the line stops under it. Where the rows
    # would then be closer than a label is tall, the title says it instead.
    n, low = len(drawn["sizes"]), -0.7
    below = n - 0.4
    height = max(1.0, frame.height * 72 / ax.figure.dpi)  # points
    share = min(0.5, FIT_FONT_SIZE * 1.6 / height)
    top = (below - share * low) / (1 - share)
    row = drawn["labels"][0].get_window_extent(renderer).height * 72 / ax.figure.dpi
    banded = height * (1 - share) / (top - low) >= row + 0.5
    if not banded:
        top = n - 0.3
    if ax.get_ylim() != (low, top):
        ax.set_ylim(low, top)
    drawn["need_text"].set_y(below)
    drawn["need_text"].set_visible(banded)
    title = drawn["title"] + ("" if banded else f"; needs {drawn['need']:,.1f} GiB (red line)")
    if ax.get_title() != title:
        ax.set_title(title, fontsize=FIT_FONT_SIZE)
    to_data = ax.transData.inverted()
    need_x = ax.transData.transform((drawn["need"], 0))[0]
    pad = 4 * ax.figure.dpi / 72
    for size, label, words in zip(drawn["sizes"], drawn["labels"], drawn["words"], strict=True):
        end = ax.transData.transform((size, 0))[0]
        label.set_horizontalalignment("left")
        label.set_x(size)
        chosen: tuple[float, float, str] | None = None
        for text in words:  # the whole label, then without the price, then the headroom alone
            label.set_text(text)
            width = label.get_window_extent(renderer).width
            places = [
                (end + pad, end + pad + width, "left"),  # just past the bar
                (end - pad - width, end - pad, "right"),  # inside the bar, at its end
                (need_x + pad, need_x + pad + width, "left"),  # past the line
                (need_x - pad - width, need_x - pad, "right"),  # before the line, past the bar
            ]
            clear = [
                (x0, x1, ha)
                for x0, x1, ha in places
                if not x0 - 1 <= need_x <= x1 + 1
                and x0 >= frame.x0 + pad
                and x1 <= frame.x1 - 1
                and not (x0 < end - 1 and x1 > end + 1)  # not across its bar's end
            ]
            if clear:
                chosen = clear[0]
                break
        x0, x1, ha = chosen or (end + pad, end + pad + width, "left")
        label.set_horizontalalignment(ha)
        label.set_x(to_data.transform((x0 if ha == "left" else x1, 0))[0])
    text = drawn["need_text"]
    text.set_horizontalalignment("left")
    text.set_x(to_data.transform((need_x + pad, 0))[0])
    if text.get_window_extent(renderer).x1 > frame.x1:
        text.set_horizontalalignment("right")
        text.set_x(to_data.transform((need_x - pad, 0))[0])


def _fit_placer(ax: Any, drawn: dict[str, Any]) -> Any:
    """An invisible artist drawn first: it places the labels again once the axes have their
    final size (a notebook's tight or constrained layout sets it only when drawing)."""
    from matplotlib.artist import Artist

    class Placer(Artist):
        def draw(self, renderer: Any) -> None:
            place_gpu_fit_labels(ax, drawn, renderer)

    placer = Placer()
    placer.set_zorder(-100)
    return placer


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
