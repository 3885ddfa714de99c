"""Charts that plan where to run: a run's cost per environment and the guide's decision flow.

Each function draws on an ``ax`` it is given and returns its artists; the ``update_*``
functions change them in place for the live explorers (widgets/explorers.py). The environment explorer
repaints only ``environment_costs_live_artists`` over a saved picture of the rest; the flow
explorer keeps a picture per path. matplotlib is imported inside the functions that need it.
"""

from __future__ import annotations

import itertools
import math
import re
import textwrap
from collections.abc import Sequence
from typing import Any

from ..errors import LessonkitError, choose
from ..hardware.gpu_records import field
from ..units import format_hours, parse_count
from .palette import ALERT_COLOR, TIER_COLORS

FONT_SIZE = 9  # every text, at the size the chart is shown (see charts/layout.py)


def not_possible_text(note: str, chars: int = 60, width: float | None = None) -> str:
    """A row's label where the run is not possible: the reason's first clause (the whole
    reason is in the explorer's readout and the rows), on at most two lines of ``chars``
    characters, or, given ``width``, of at most that many points of 9 pt text as drawn."""
    if not note:
        return "not possible"
    clause = re.split(r"[:;] ", note, maxsplit=1)[0].strip().rstrip(".")
    text = f"not possible: {clause}"
    if width is not None:
        return _wrap_to_width(text, width)
    lines = textwrap.wrap(text, max(20, chars))
    if len(lines) > 2:
        lines = [lines[0], textwrap.shorten(" ".join(lines[1:]), max(20, chars), placeholder="…")]
    return "\n".join(lines)


def _text_width(text: str) -> float:
    """The width in points of ``text`` drawn at FONT_SIZE in matplotlib's default font."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    width, _, _ = TextToPath().get_text_width_height_descent(
        text, FontProperties(size=FONT_SIZE), ismath=False
    )
    return float(width)


def _wrap_to_width(text: str, width: float) -> str:
    """``text`` on one line if it fits in ``width`` points, else two, the second cut with "…"
    where the rest does not fit either (each line as long as the width allows)."""
    words, lines = text.split(), [""]
    for word in words:
        line = f"{lines[-1]} {word}".strip()
        if _text_width(line) <= width or not lines[-1]:
            lines[-1] = line
        elif len(lines) == 1:
            lines.append(word)
        else:  # a third line: cut the second where it fits, with "…"
            lines[-1] = f"{lines[-1]} {word}"
            break
    if len(lines) == 2 and _text_width(lines[1]) > width:
        second = lines[1]
        while second and _text_width(second + "…") > width:
            second = second.rsplit(" ", 1)[0] if " " in second else second[:-1]
        lines[1] = second + "…"
    return "\n".join(lines)


def _label_width(ax: Any) -> float:
    """The points a 9 pt label has across the axes: from where it starts (1% of the axes in)
    to the right edge, less a margin that keeps it off the spine."""
    return float(ax.get_position().width * ax.figure.get_size_inches()[0] * 72 * 0.99 - 12)


def environment_row(row: Any) -> dict[str, Any]:
    """Read one environment row (mapping or object) into name, cost, hours, tier, gpu, note."""
    return {
        "name": str(field(row, "name", "environment", "platform", default="?")),
        "cost": field(row, "cost_usd", "cost", "total_cost"),
        "hours": field(row, "hours", "time_hours", "wall_hours"),
        "tier": str(field(row, "tier", default="")).lower(),
        "gpu": field(row, "gpu", "gpu_name", default=""),
        "note": str(field(row, "note", "reason", default="")),
    }


def draw_environment_costs(ax: Any, rows: Sequence[Any]) -> dict[str, Any]:
    """Horizontal bars of a run's cost per environment, labelled with its time and GPU.

    Rows without a cost (the run is not possible there) are listed with their note instead.
    ``update_environment_costs`` shows other rows for the same environments on the same artists.
    """
    data = [environment_row(r) for r in rows]
    if not data:
        raise LessonkitError("draw_environment_costs needs at least one row.")
    y = list(range(len(data)))[::-1]  # first row on top
    bars = ax.barh(y, [0.0] * len(data), height=0.6, zorder=2)
    labels = [ax.text(0, yi, "", va="center", fontsize=FONT_SIZE) for yi in y]
    ax.set_yticks(y)
    ax.set_yticklabels([textwrap.fill(d["name"], 22) for d in data], fontsize=FONT_SIZE)
    ax.tick_params(axis="x", labelsize=FONT_SIZE)
    ax.set_xlabel("Cost of the run (USD)", fontsize=FONT_SIZE)
    drawn = {
        "bars": bars,
        "labels": labels,
        "rows": data,
        "legend": None,
        "tiers": None,
        "names": [d["name"] for d in data],
        "costs": [],
    }
    ax.add_artist(_environment_placer(ax, drawn))
    update_environment_costs(ax, drawn, rows)
    return drawn


def update_environment_costs(ax: Any, drawn: dict[str, Any], rows: Sequence[Any]) -> dict[str, Any]:
    """Show ``rows`` (the same environments, in the same order) on a chart from
    ``draw_environment_costs``: bar lengths and colours, labels, the x axis and the legend of
    tiers change in place."""
    data = [environment_row(r) for r in rows]
    if [d["name"] for d in data] != drawn["names"]:
        raise LessonkitError(
            "update_environment_costs needs the rows' environments in the "
            f"order drawn: {drawn['names']}."
        )
    costs = [float(d["cost"]) if d["cost"] is not None else 0.0 for d in data]
    # The x axis grows in steps of 1.5x, so most changes keep it (and the explorer repaints
    # only the bars and their labels over a saved picture of the axis).
    right = 1.6 * 1.5 ** max(0, math.ceil(math.log(max([*costs, 1.0]), 1.5) - 1e-9))
    for i, (d, cost, patch, label) in enumerate(
        zip(data, costs, drawn["bars"].patches, drawn["labels"], strict=False)
    ):
        patch.set_width(cost)
        patch.set_facecolor(TIER_COLORS.get(d["tier"], "#4C72B0"))
        if d["cost"] is None:
            text, color = not_possible_text(d["note"], width=_label_width(ax)), ALERT_COLOR
        else:
            hours = d["hours"]
            text = f"${cost:,.2f}"
            if hours is not None:
                text += f" · {format_hours(float(hours))}"
            if d["gpu"]:
                text += f" on {d['gpu']}"
            color = "black"
        label.set_text(text)
        label.set_position((cost + right * 0.01, len(data) - 1 - i))
        label.set_horizontalalignment("left")
        label.set_color(color)
    if ax.get_xlim() != (0, right):
        ax.set_xlim(0, right)
    drawn["costs"], drawn["rows"] = costs, data
    place_environment_labels(ax, drawn)
    tiers = [t for t in TIER_COLORS if any(d["tier"] == t for d in data)]
    if tiers != drawn["tiers"]:
        from matplotlib.patches import Patch

        if drawn["legend"] is not None:
            drawn["legend"].remove()
        drawn["legend"] = (
            ax.legend(
                handles=[Patch(color=TIER_COLORS[t], label=t) for t in tiers],
                fontsize=FONT_SIZE,
                ncol=2,
                columnspacing=0.6,
                handlelength=0.8,
                handletextpad=0.4,
                loc="lower right",
                bbox_to_anchor=(-0.01, 0.0),
                bbox_transform=_corner(ax),
                borderaxespad=0.2,
                borderpad=0.1,
                labelspacing=0.3,
                frameon=False,
            )
            if tiers
            else None
        )
        drawn["tiers"] = tiers
    drawn["rows"] = data
    return drawn


def place_environment_labels(ax: Any, drawn: dict[str, Any], renderer: Any = None) -> None:
    """A label that would run past the axes' right edge goes inside its bar, in white; a row
    that is not possible has its reason wrapped to the axes' width."""
    renderer = renderer or ax.figure._get_renderer()
    frame = ax.bbox
    pad = 3 * ax.figure.dpi / 72
    to_data = ax.transData.inverted()
    for cost, label, row in zip(drawn["costs"], drawn["labels"], drawn["rows"], strict=True):
        if row["cost"] is None:  # wrapped again for the axes' final width (a tight layout's)
            text = not_possible_text(row["note"], width=_label_width(ax))
            if label.get_text() != text:
                label.set_text(text)
            continue
        end = ax.transData.transform((cost, 0))[0]
        label.set_horizontalalignment("left")
        label.set_color("black")
        label.set_x(to_data.transform((end + pad, 0))[0])
        box = label.get_window_extent(renderer)
        if box.x1 > frame.x1 - pad and end - pad - box.width > frame.x0 + pad:
            label.set_horizontalalignment("right")
            label.set_color("white")
            label.set_x(to_data.transform((end - pad, 0))[0])


def _environment_placer(ax: Any, drawn: dict[str, Any]) -> Any:
    """An invisible artist drawn first: it places the labels again once the axes have their
    final size (a notebook's tight layout sets it only when drawing)."""
    from matplotlib.artist import Artist

    class Placer(Artist):
        def draw(self, renderer: Any) -> None:
            place_environment_labels(ax, drawn, renderer)

    placer = Placer()
    placer.set_zorder(-100)
    return placer


def _corner(ax: Any) -> Any:
    """Coordinates in which (0, 0) is the lower left corner of the axes and (x, 0) lies on the
    figure's bottom edge: the legend of tiers sits under the row names, outside the axes."""
    from matplotlib.transforms import blended_transform_factory

    return blended_transform_factory(ax.transAxes, ax.figure.transFigure)


def environment_costs_static_key(ax: Any, drawn: dict[str, Any]) -> tuple[Any, ...]:
    """What the rest of a ``draw_environment_costs`` chart shows besides
    ``environment_costs_live_artists``: the rows, the x axis, the legend, the title and the
    labels of rows that are not possible (they stay as long as the note does)."""
    fixed = tuple(
        (i, label.get_text())
        for i, (d, label) in enumerate(zip(drawn["rows"], drawn["labels"], strict=False))
        if d["cost"] is None
    )
    return (
        tuple(drawn["names"]),
        ax.get_xlim(),
        tuple(drawn["tiers"] or ()),
        ax.get_title(),
        fixed,
    )


def environment_costs_live_artists(ax: Any, drawn: dict[str, Any]) -> list[Any]:
    """What new rows change on a ``draw_environment_costs`` chart, in drawing order (the bars
    under the left spine and the labels of rows that are possible, as in a full draw). The x
    axis is under the bars, the legend outside the axes and the other spines out of the bars'
    reach (a long label may cross the right one), so they stay in the saved picture."""
    labels = [
        label
        for d, label in zip(drawn["rows"], drawn["labels"], strict=False)
        if d["cost"] is not None
    ]
    artists = [*drawn["bars"].patches, ax.spines["left"], *labels]
    return sorted(artists, key=lambda a: a.get_zorder())


def environment_costs_rows(ax: Any, drawn: dict[str, Any]) -> list[tuple[Any, Any, list[Any]]]:
    """Each row of a ``draw_environment_costs`` chart as (what it shows, its band in display
    coordinates, its bar and label): a band runs from halfway to the row above to halfway to
    the row below and from the left spine to the figure's right edge, which no other row's bar
    or label reaches, so the explorer can put back a saved picture of a row that is unchanged."""
    from matplotlib.transforms import Bbox

    box, n = ax.bbox, len(drawn["names"])
    rows = []
    for i, (patch, label) in enumerate(zip(drawn["bars"].patches, drawn["labels"], strict=False)):
        y = n - 1 - i
        low, high = sorted(ax.transData.transform([(0, y - 0.5), (0, y + 0.5)])[:, 1])
        band = Bbox([[box.x0 - 3, max(low, box.y0)], [ax.figure.bbox.x1, min(high, box.y1)]])
        shows = (
            label.get_text(),
            label.get_position(),
            label.get_color(),
            patch.get_width(),
            tuple(patch.get_facecolor()),
        )
        rows.append(((i, shows), band, [patch, label]))
    return rows


# ----- the guide's decision flow -----------------------------------------------------------
FLOW_NODES = {  # id: (text, x, y, shape)
    "goal": ("Your project goal", 0.5, 0.9, "box"),
    "size": ("Model size?", 0.5, 0.66, "diamond"),
    "budget": ("Budget?", 0.3, 0.42, "diamond"),
    "rtx4090": ("Local RTX 4090\nworkstation", 0.14, 0.13, "box"),
    "colab_lambda": ("Google Colab (A100)\nor Lambda Labs", 0.47, 0.13, "box"),
    "cluster": ("Multi-GPU cluster\n(8x A100s)", 0.82, 0.13, "box"),
}
FLOW_EDGES = {  # (from, to): label
    ("goal", "size"): "",
    ("size", "budget"): "7B / 8B",
    ("size", "cluster"): "70B",
    ("budget", "colab_lambda"): "Low",
    ("budget", "rtx4090"): "High",
}
HIGHLIGHT = "#F2C14E"


def decision_path(model_size: object = None, budget: str | None = None) -> list[str]:
    """The nodes the guide's flow visits for a model size ('7B', 8e9, '70B') and budget.

    Sizes the guide has no branch for (e.g. 13B) stop at 'Model size?'.
    """
    path = ["goal", "size"]
    if model_size is None:
        return path
    n = parse_count(model_size)
    if 6.5e9 <= n <= 8.6e9:
        path.append("budget")
        if budget is not None:
            path.append(
                {"low": "colab_lambda", "high": "rtx4090"}[
                    choose(budget, ("low", "high"), "budget").lower()
                ]
            )
    elif 65e9 <= n <= 75e9:
        path.append("cluster")
    return path


def draw_decision_flow(ax: Any, path: Sequence[str] | None = None) -> dict[str, Any]:
    """The guide's 'which hardware' flow as boxes and arrows, with ``path`` highlighted.

    ``path`` is a list of node ids (see FLOW_NODES and ``decision_path``).
    ``update_decision_flow`` highlights another path on the same artists.
    """
    from matplotlib.patches import Rectangle

    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_axis_off()
    for x0, x1, title in ((0.005, 0.275, "Consumer edge"), (0.305, 0.995, "Cloud core")):
        ax.add_patch(Rectangle((x0, 0.02), x1 - x0, 0.23, fill=False, ls=":", ec="0.5", lw=1))
        ax.text(x0 + 0.01, 0.03, title, fontsize=FONT_SIZE, color="0.4", va="bottom")
    nodes = {}
    for key, (text, x, y, shape) in FLOW_NODES.items():
        style = "round,pad=0.5" if shape == "box" else "round4,pad=0.6"
        nodes[key] = ax.text(
            x, y, text, ha="center", va="center", fontsize=9, zorder=3, bbox=dict(boxstyle=style)
        )
    edges, edge_labels = {}, {}
    for (a, b), label in FLOW_EDGES.items():
        (_, xa, ya, _), (_, xb, yb, _) = FLOW_NODES[a], FLOW_NODES[b]
        # From the bottom of one box to the top of the next, clear of the boxes' padding.
        edges[(a, b)] = ax.annotate(
            "",
            xy=(0.5, 1.0),
            xycoords=nodes[b],
            xytext=(0.5, 0.0),
            textcoords=nodes[a],
            zorder=2,
            arrowprops=dict(arrowstyle="-|>", shrinkA=7, shrinkB=8),
        )
        if label:
            edge_labels[(a, b)] = ax.text(
                (xa + xb) / 2 + 0.035,
                (ya + yb) / 2,
                label,
                fontsize=FONT_SIZE,
                ha="left",
                zorder=4,
                bbox=dict(fc="white", ec="none", pad=0.5),
            )
    drawn = {"nodes": nodes, "edges": edges, "edge_labels": edge_labels, "path": []}
    return update_decision_flow(ax, drawn, path)


def update_decision_flow(
    ax: Any, drawn: dict[str, Any], path: Sequence[str] | None = None
) -> dict[str, Any]:
    """Highlight ``path`` on a chart from ``draw_decision_flow`` (styles change in place)."""
    path = [choose(p, FLOW_NODES, "flow node") for p in (path or [])]
    on_path = set(path)
    path_edges = set(itertools.pairwise(path))
    for a, b in path_edges:
        if (a, b) not in FLOW_EDGES:
            raise LessonkitError(f"The flow has no step from {a!r} to {b!r}.")
    for key, node in drawn["nodes"].items():
        hot = key in on_path
        idle = "white" if FLOW_NODES[key][3] == "box" else "#E8EEF7"  # questions in light blue
        node.set_fontweight("bold" if hot else "normal")
        box = node.get_bbox_patch()
        box.set_facecolor(HIGHLIGHT if hot else idle)
        box.set_edgecolor("black" if hot else "0.45")
        box.set_linewidth(2 if hot else 1)
    for edge, arrow in drawn["edges"].items():
        hot = edge in path_edges
        arrow.arrow_patch.set_linewidth(2.4 if hot else 1.0)
        arrow.arrow_patch.set_color("#B8860B" if hot else "0.45")
        if edge in drawn["edge_labels"]:
            drawn["edge_labels"][edge].set_fontweight("bold" if hot else "normal")
    drawn["path"] = path
    return drawn


def is_highlighted(artist: Any) -> bool:
    """True when a flow node drawn by draw_decision_flow is on the highlighted path."""
    from matplotlib.colors import to_hex

    return to_hex(artist.get_bbox_patch().get_facecolor()) == to_hex(HIGHLIGHT)
