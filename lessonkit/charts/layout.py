"""Whether a chart can be read at the size it is shown: ``layout_problems(figure)``.

A chart is readable when, drawn at its own size, no text lies over another text, no line (a GPU
line, the "needs" line, an arrow, the peak's dot) runs through a text, every text lies inside
the figure and every font is at least ``MIN_FONT_SIZE`` points at display size. Display size:
a notebook shows a figure at its own dots (100 per inch, matplotlib's default and the
explorers' ``CHART_DPI``) and shrinks one wider than the output area, ``DISPLAY_WIDTH_INCHES``
(950 pixels, the narrowest of classic Notebook, JupyterLab and Colab at a laptop's width), to
fit; its fonts shrink with it.

The charts use ``clear_of`` to put a label where nothing else is; the tests use
``layout_problems`` on every chart the course draws. matplotlib is imported inside the
functions that need it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

MIN_FONT_SIZE = 9.0
DISPLAY_WIDTH_INCHES = 9.5
TOLERANCE = 1.0  # pixels: boxes that only touch (a label sitting on its own line) are clear


def display_scale(figure: Any) -> float:
    """How much a notebook shrinks this figure to show it (1.0 when it fits the output area)."""
    width = float(figure.get_size_inches()[0])
    return min(1.0, DISPLAY_WIDTH_INCHES / width) if width > 0 else 1.0


def render(figure: Any) -> tuple[Any, list[Any], list[Any]]:
    """Draw ``figure`` on an Agg canvas; (renderer, texts drawn, lines and arrows drawn)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyArrowPatch
    from matplotlib.text import Text

    canvas: Any = figure.canvas
    if not isinstance(canvas, FigureCanvasAgg):
        canvas = FigureCanvasAgg(figure)
    texts: list[Any] = []
    lines: list[Any] = []
    calls = [0]
    renderer = canvas.get_renderer()
    draw_text = renderer.draw_text
    text_draw, line_draw, arrow_draw = Text.draw, Line2D.draw, FancyArrowPatch.draw

    def count_text(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return draw_text(*args, **kwargs)

    def record_text(self: Any, renderer: Any) -> Any:
        before = calls[0]
        result = text_draw(self, renderer)
        if calls[0] > before and self.get_text().strip() and self not in texts:
            texts.append(self)
        return result

    def record_line(self: Any, renderer: Any) -> Any:
        if self.get_visible():
            lines.append(self)
        return line_draw(self, renderer)

    def record_arrow(self: Any, renderer: Any) -> Any:
        if self.get_visible():
            lines.append(self)
        return arrow_draw(self, renderer)

    renderer.draw_text = count_text
    Text.draw, Line2D.draw, FancyArrowPatch.draw = record_text, record_line, record_arrow  # type: ignore[method-assign]
    try:
        canvas.draw()
    finally:
        Text.draw, Line2D.draw, FancyArrowPatch.draw = text_draw, line_draw, arrow_draw  # type: ignore[method-assign]
        del renderer.draw_text
    return canvas.get_renderer(), texts, lines


def _ticks_and_legends(figure: Any) -> set[int]:
    """Ids of the lines that are tick marks or legend keys (never over a chart's own text)."""
    skip: set[int] = set()
    for ax in figure.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                skip.update((id(tick.tick1line), id(tick.tick2line), id(tick.gridline)))
    legends = list(figure.legends) + [ax.get_legend() for ax in figure.axes]
    for legend in legends:
        if legend is not None:
            skip.update(id(line) for line in legend.get_lines())
    return skip


def _segments(line: Any) -> Iterator[tuple[tuple[float, float], tuple[float, float]]]:
    """A drawn line's segments in display coordinates (clipped to its axes where it is)."""
    from matplotlib.lines import Line2D

    if isinstance(line, Line2D):
        polygons = [line.get_transform().transform(line.get_xydata())]
        clip = line.get_clip_box() if line.get_clip_on() else None
    else:  # an arrow (its shaft and head) or an axes' spine
        path = line.get_transform().transform_path(line.get_path())
        polygons = path.to_polygons(closed_only=False)
        clip = None
    for points in polygons:
        for a, b in itertools.pairwise(points):
            segment = _clip(a, b, clip)
            if segment is not None:
                yield segment


def _clip(a: Sequence[float], b: Sequence[float], box: Any) -> Any:
    """The part of segment a-b inside ``box`` (Liang-Barsky), or None."""
    (x0, y0), (x1, y1) = a, b
    if box is None:
        return (x0, y0), (x1, y1)
    low, high = 0.0, 1.0
    dx, dy = x1 - x0, y1 - y0
    for p, q in ((-dx, x0 - box.x0), (dx, box.x1 - x0), (-dy, y0 - box.y0), (dy, box.y1 - y0)):
        if p == 0:
            if q < 0:
                return None
            continue
        t = q / p
        if p < 0:
            low = max(low, t)
        else:
            high = min(high, t)
        if low > high:
            return None
    return (x0 + low * dx, y0 + low * dy), (x0 + high * dx, y0 + high * dy)


def _shrunk(box: Any, by: float = TOLERANCE) -> Any:
    from matplotlib.transforms import Bbox

    return Bbox([[box.x0 + by, box.y0 + by], [box.x1 - by, box.y1 - by]])


def segment_crosses(segment: Any, box: Any) -> bool:
    """True when a segment (display coordinates) runs through the inside of ``box``."""
    return _clip(segment[0], segment[1], _shrunk(box)) is not None


def line_crosses(line: Any, box: Any, renderer: Any = None) -> bool:
    """True when a drawn line (its segments, or its marker) runs through ``box``; a thick
    line reaches half its width further."""
    from matplotlib.lines import Line2D
    from matplotlib.transforms import Bbox

    half = line.get_linewidth() * line.figure.dpi / 72 / 2
    box = Bbox([[box.x0 - half, box.y0 - half], [box.x1 + half, box.y1 + half]])

    if isinstance(line, Line2D) and line.get_marker() not in (None, "None", "", " "):
        size = line.get_markersize() * line.figure.dpi / 72 / 2
        inner = _shrunk(box)
        for x, y in line.get_transform().transform(line.get_xydata()):
            if inner.x0 - size < x < inner.x1 + size and inner.y0 - size < y < inner.y1 + size:
                return True
        if line.get_linestyle() in ("None", "", " "):
            return False
    return any(segment_crosses(segment, box) for segment in _segments(line))


def masks(text: Any, line: Any) -> bool:
    """True when ``text`` stands on an opaque ground drawn over ``line``: the line stops at the
    label (a GPU line at the height of a bar's peak label)."""
    patch = text.get_bbox_patch()
    if patch is None or not patch.get_visible() or text.get_zorder() <= line.get_zorder():
        return False
    face = patch.get_facecolor()
    return bool(face[3] >= 0.9 and patch.get_alpha() in (None, 1, 1.0))


def boxes_overlap(a: Any, b: Any) -> bool:
    """True when two boxes share more than an edge (TOLERANCE pixels)."""
    return bool(_shrunk(a).overlaps(_shrunk(b)))


def _name(text: Any) -> str:
    words = " ".join(text.get_text().split())
    return repr(words if len(words) <= 40 else words[:37] + "...")


def layout_problems(figure: Any) -> list[str]:
    """What makes ``figure`` hard to read at its display size, one sentence each ([] if none):
    texts over texts, lines through texts, texts outside the figure, fonts too small."""
    renderer, texts, lines = render(figure)
    skip = _ticks_and_legends(figure)
    lines = [line for line in lines if id(line) not in skip]
    lines += [s for ax in figure.axes if ax.axison for s in ax.spines.values() if s.get_visible()]
    boxes = [(text, text.get_window_extent(renderer)) for text in texts]
    problems = []
    scale = display_scale(figure)
    outer = figure.bbox
    for text, box in boxes:
        size = text.get_fontsize() * scale
        if size < MIN_FONT_SIZE - 1e-9:
            problems.append(f"{_name(text)} is {size:.1f} pt at display size (under 9 pt).")
        if (
            box.x0 < outer.x0 - TOLERANCE
            or box.y0 < outer.y0 - TOLERANCE
            or box.x1 > outer.x1 + TOLERANCE
            or box.y1 > outer.y1 + TOLERANCE
        ):
            problems.append(f"{_name(text)} runs off the figure.")
    legends = list(figure.legends) + [ax.get_legend() for ax in figure.axes]
    for legend in legends:
        if legend is not None and legend.get_visible():
            box = legend.get_window_extent(renderer)
            if (
                box.x0 < outer.x0 - TOLERANCE
                or box.x1 > outer.x1 + TOLERANCE
                or box.y0 < outer.y0 - TOLERANCE
                or box.y1 > outer.y1 + TOLERANCE
            ):
                problems.append("A legend runs off the figure.")
    for i, (text, box) in enumerate(boxes):
        for other, other_box in boxes[i + 1 :]:
            if boxes_overlap(box, other_box):
                problems.append(f"{_name(text)} overlaps {_name(other)}.")
        for line in lines:
            if not masks(text, line) and line_crosses(line, box, renderer):
                problems.append(f"A line ({line.get_label() or type(line).__name__}) runs "
                                f"through {_name(text)}.")  # fmt: skip
    return problems


def clear_of(box: Any, obstacles: Iterable[Any], lines: Iterable[Any] = ()) -> bool:
    """True when ``box`` (display coordinates) overlaps no box in ``obstacles`` and no line in
    ``lines`` runs through it."""
    return not any(boxes_overlap(box, other) for other in obstacles) and not any(
        line_crosses(line, box) for line in lines
    )
