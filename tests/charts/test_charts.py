"""The course's matplotlib charts: what is drawn must be the numbers given, in fixed colours."""

from __future__ import annotations

import subprocess
import sys

import matplotlib

matplotlib.use("Agg")

import itertools

import pytest
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from lessonkit import charts
from lessonkit.charts import memory_charts, palette, planning_charts
from lessonkit.errors import LessonkitError
from lessonkit.hardware import gpu_records
from lessonkit.hardware.gpus import get_gpu, list_gpus
from lessonkit.memory.report import CATEGORIES, LABELS, MemoryReport
from lessonkit.models.presets import resolve_model
from lessonkit.units import GiB


def make_report(model: str = "7B", **breakdown: float) -> MemoryReport:
    return MemoryReport(
        model=resolve_model(model),
        settings={
            "method": "lora",
            "precision": "bf16-mixed",
            "optimizer": "adamw",
            "batch_size": 2,
            "seq_len": 1024,
            "lora_rank": 16,
        },
        breakdown=breakdown,
        peak_phase="backward",
    )


SMALL = make_report(
    weights=13.5e9,
    gradients=0.02e9,
    optimizer=0.04e9,
    activations=3.1e9,
    logits=0.5e9,
    temporaries=0.2e9,
    cuda_context=0.4e9,
    allocator_margin=1.2e9,
)
HUGE = make_report("70B", weights=140e9, gradients=140e9, optimizer=560e9, activations=20e9)


def new_ax(width: float = 7.5, height: float = 3.6):
    return Figure(figsize=(width, height)).add_subplot()


def test_bar_segments_are_the_reports_numbers_stacked_in_category_order_in_gib():
    ax = new_ax()
    chart = charts.draw_breakdown(ax, [SMALL, HUGE])
    for i, report in enumerate([SMALL, HUGE]):
        bottom = 0.0
        for key in CATEGORIES:
            patch = chart.containers[key].patches[i]
            assert patch.get_height() == pytest.approx(report.breakdown[key] / GiB)
            assert patch.get_y() == pytest.approx(bottom)
            bottom += report.breakdown[key] / GiB
        assert bottom == pytest.approx(report.total_bytes / GiB)
        assert chart.peak_texts[i].get_text() == f"{report.total_bytes / GiB:,.1f} GiB"
    assert ax.get_ylim()[1] > HUGE.total_bytes / GiB
    assert "GiB" in ax.get_ylabel()


def test_colours_and_legend_match_the_categories():
    ax = new_ax()
    chart = charts.draw_breakdown(ax, SMALL)
    for key in CATEGORIES:
        assert to_hex(chart.containers[key].patches[0].get_facecolor()) == to_hex(
            palette.CATEGORY_COLORS[key]
        )
    texts = [t.get_text() for t in chart.legend.get_texts()]
    assert texts == [LABELS[k] for k in reversed(CATEGORIES)]
    handles = getattr(chart.legend, "legend_handles", None) or chart.legend.legendHandles  # < 3.7
    for handle, key in zip(handles, reversed(CATEGORIES), strict=False):
        assert to_hex(handle.get_facecolor()) == to_hex(palette.CATEGORY_COLORS[key])
    assert len(set(palette.CATEGORY_COLORS.values())) == len(palette.CATEGORY_COLORS)


def test_extra_categories_are_stacked_as_other_and_join_the_legend():
    report = make_report(weights=2e9, custom_buffers=1e9)
    chart = charts.draw_breakdown(new_ax(), report)
    assert chart.containers["other"].patches[0].get_height() == pytest.approx(1e9 / GiB)
    assert "Other" in [t.get_text() for t in chart.legend.get_texts()]
    assert chart.peak_texts[0].get_text() == f"{3e9 / GiB:.1f} GiB"


def line_gpus(chart) -> list:
    """The catalog card each GPU line names first, with the line's height (GiB)."""
    by_name = {g.name: g for g in list_gpus()}
    return [
        (line.get_ydata()[0], by_name[text.get_text().split(" (")[0].split(", ")[0]])
        for line, text in zip(chart.gpu_lines, chart.gpu_texts, strict=False)
    ]


def test_gpu_lines_stand_at_usable_memory_and_name_their_cards():
    chart = charts.draw_breakdown(new_ax(), SMALL)
    drawn = line_gpus(chart)
    assert sorted(g.memory_gb for _, g in drawn) == sorted(memory_charts.COMMON_GPU_SIZES_GB)
    guide = {g.memory_gb: g for g in list_gpus(in_guide=True)}
    for (height, gpu), text in zip(drawn, chart.gpu_texts, strict=False):
        assert height == pytest.approx(gpu.usable_bytes / GiB)
        assert text.get_text().endswith(f"({gpu.usable_text} usable)")
        if gpu.memory_gb in guide:  # the guide's card of that size is the one drawn
            assert gpu == guide[gpu.memory_gb]
        for name in text.get_text().split(" (")[0].split(", "):  # every card named is that high
            assert next(g for g in list_gpus() if g.name == name).usable_bytes == gpu.usable_bytes
    h200 = next(
        text.get_text()
        for _, text in zip(drawn, chart.gpu_texts, strict=False)
        if "H200" in text.get_text()
    )
    assert h200 == "H200 (139.8 GiB usable)"
    assert "141 GB" not in " ".join(t.get_text() for t in chart.gpu_texts)
    custom = charts.draw_breakdown(new_ax(), SMALL, gpu_sizes=[12, 32])
    assert [line.get_ydata()[0] for line in custom.gpu_lines] == [12, pytest.approx(31.4)]
    assert custom.gpu_texts[0].get_text().startswith("12 GB card (full size")


@pytest.mark.parametrize("margin", [-0.05, 0.05])
def test_a_bar_is_below_a_gpus_line_exactly_when_it_fits_that_gpu(margin):
    # 142.0 GB is 132.3 GiB: it fits an H200 (139.8 GiB usable), so its bar is under the line.
    chart = charts.draw_breakdown(new_ax(), SMALL)
    for height, gpu in line_gpus(chart):
        report = make_report(weights=gpu.usable_bytes + margin * GiB)
        chart.update(report)
        top = sum(chart.heights()[0].values())
        assert (top <= height) == gpu.fits(report) == (margin < 0)
    h200 = make_report(weights=142.0e9)
    chart.update(h200)
    assert get_gpu("H200").fits(h200)
    assert sum(chart.heights()[0].values()) < {g.name: h for h, g in line_gpus(chart)}["H200"]


def test_a_run_larger_than_every_gpu_says_so_and_a_small_one_does_not():
    biggest = max(list_gpus(), key=lambda g: g.usable_bytes)
    chart = charts.draw_breakdown(new_ax(), HUGE)
    note = chart.note.get_text()
    assert "does not fit on any single GPU" in note
    assert f"(largest: {biggest.name}, {biggest.usable_text} usable)" in note
    assert to_hex(chart.peak_texts[0].get_color()) == to_hex(palette.ALERT_COLOR)
    chart.update(SMALL)
    assert chart.note.get_text() == ""
    fits_biggest = make_report(weights=biggest.usable_bytes - 1e9)
    chart.update(fits_biggest)
    assert chart.note.get_text() == ""


def test_update_changes_the_same_artists_in_place():
    ax = new_ax()
    chart = charts.draw_breakdown(ax, SMALL)
    patches = list(chart.containers["weights"].patches)
    n_artists = len(ax.get_children())
    chart.update(HUGE)
    assert chart.containers["weights"].patches == patches
    assert patches[0].get_height() == pytest.approx(140e9 / GiB)
    assert len(ax.get_children()) == n_artists
    assert chart.heights()[0]["optimizer"] == pytest.approx(560e9 / GiB)


def test_static_key_and_live_artists_split_what_a_data_change_redraws():
    ax = new_ax()
    chart = charts.draw_breakdown(ax, SMALL)
    key = chart.static_key()
    live = chart.live_artists()
    patches = [p for c in chart.containers.values() for p in c.patches]
    assert set(patches) <= set(live) and chart.peak_texts[0] in live
    assert chart.note not in live and key[-1] == ""  # no note: it is in the saved picture
    assert live[-1] is ax.title
    zorders = [a.get_zorder() for a in live[:-1]]
    assert zorders == sorted(zorders)  # bars first, labels over them, as a full draw
    smaller = make_report(weights=15e9, activations=2e9)
    chart.update(smaller)  # under the same nearest GPU line: the axes stay the same
    assert chart.static_key() == key
    chart.update(HUGE)
    assert chart.static_key() != key
    chart.update([SMALL, HUGE])
    assert chart.static_key()[1] == 2


def test_only_gpu_labels_a_bar_can_reach_are_redrawn_over_the_bars():
    one = charts.draw_breakdown(new_ax(), SMALL)
    assert not set(one.gpu_texts) & set(one.live_artists())  # labels at the right, clear of it
    reports = [SMALL] * 8
    many = charts.draw_breakdown(new_ax(), reports)
    over = set(many.gpu_texts) & set(many.live_artists())
    assert over  # the rightmost bars run under the labels
    renderer = many.ax.figure._get_renderer()
    last = many.containers["weights"].patches[-1]
    left = many.ax.transData.transform((last.get_x(), 0))[0]
    for text in over:
        assert text.get_window_extent(renderer).x1 >= left - 2


def test_bad_inputs_are_clear_errors():
    with pytest.raises(LessonkitError, match="labels"):
        charts.draw_breakdown(new_ax(), [SMALL, HUGE], labels=["one"])
    with pytest.raises(LessonkitError, match="at least one"):
        charts.draw_breakdown(new_ax(), [])
    with pytest.raises(LessonkitError, match="at least one"):
        charts.draw_gpu_fit(new_ax(), SMALL, [])


def test_gpu_fit_colours_bars_by_the_catalogs_own_fit_test_and_gives_headroom_in_gib():
    gpus = list_gpus()
    report = make_report(weights=30e9)  # fits 40 GB cards and up, not 24/32 GB ones
    ax = new_ax(7, 6)
    drawn = charts.draw_gpu_fit(ax, report, gpus)
    assert len(drawn["bars"].patches) == len(gpus)
    for gpu, patch, label in zip(
        drawn["gpus"], drawn["bars"].patches, drawn["labels"], strict=False
    ):
        assert patch.get_width() == pytest.approx(gpu.usable_bytes / GiB)
        colour = palette.FIT_COLOR if gpu.fits(report) else palette.NO_FIT_COLOR
        assert to_hex(patch.get_facecolor()) == to_hex(colour)
        assert (patch.get_edgecolor()[3] > 0) == gpu.in_guide  # dark edge on the guide's GPUs
        room = (gpu.usable_bytes - report.total_bytes) / GiB
        expected = f"+{room:,.1f} GiB free" if gpu.fits(report) else f"short by {-room:,.1f} GiB"
        assert label.get_text().startswith(expected)
        assert gpu_records.headroom_text(gpu, report) == expected
        if gpu.price_per_hour is not None:
            assert f"{gpu.price_per_hour.low:.2f}" in label.get_text()
    assert drawn["line"].get_xdata()[0] == pytest.approx(30e9 / GiB)
    assert "GiB" in ax.get_xlabel()
    ticks = {t.get_text().split(" (")[0].rstrip(" *"): t.get_text() for t in ax.get_yticklabels()}
    for gpu in gpus:  # the size a card is sold as, in its name or after it
        sold = f"{gpu.memory_gb:g}GB"
        assert sold in ticks[gpu.name].replace(" ", "")
        assert ticks[gpu.name].endswith(" *") == gpu.in_guide
    assert any(gpu.fits(report) for gpu in gpus) and not all(gpu.fits(report) for gpu in gpus)
    assert f"fits on {sum(g.fits(report) for g in gpus)} of {len(gpus)}" in ax.get_title()


def test_gpu_fit_never_says_a_bf16_run_fits_without_bf16_or_without_kernels():
    small = make_report(weights=5e9)
    gpus = [get_gpu(n) for n in ("T4", "V100 16GB", "P100 16GB", "A100 80GB")]
    drawn = charts.draw_gpu_fit(new_ax(), small, gpus)
    by_name = {
        g.name: (fit, label.get_text())
        for g, fit, label in zip(drawn["gpus"], drawn["fits"], drawn["labels"], strict=False)
    }
    assert by_name["P100 16GB"][0] is False and "no kernels" in by_name["P100 16GB"][1]
    for name in ("T4", "V100 16GB"):  # bf16 asked, fp16 said
        assert by_name[name][0] and "no native bf16: runs in fp16" in by_name[name][1]
        assert "(same memory)" not in by_name[name][1]  # the chart's shorter words
    assert "fp16" not in by_name["A100 80GB"][1]
    fp32 = MemoryReport(
        model=small.model,
        settings={**small.settings, "precision": "fp32"},
        breakdown=dict(small.breakdown),
        peak_phase="backward",
    )
    assert gpu_records.fit_note(get_gpu("T4"), fp32) == ""
    assert "fits on 3 of 4" in charts.draw_gpu_fit(new_ax(), small, gpus)["line"].axes.get_title()


def test_environment_costs_draws_costs_and_marks_impossible_rows():
    rows = [
        {"name": "Colab (free)", "cost": 0.0, "hours": 5.0, "tier": "hobbyist", "gpu": "T4"},
        {"name": "Lambda", "cost_usd": 12.5, "hours": 3.2, "tier": "engineer", "gpu": "A100 80GB"},
        {"name": "SageMaker", "cost": None, "note": "no GPU large enough"},
    ]
    drawn = charts.draw_environment_costs(new_ax(), rows)
    widths = [p.get_width() for p in drawn["bars"].patches]
    assert widths == [0.0, 12.5, 0.0]
    texts = [t.get_text() for t in drawn["labels"]]
    assert texts[1] == "$12.50 · 3.2 h on A100 80GB"
    assert texts[2] == "not possible: no GPU large enough"
    assert to_hex(drawn["bars"].patches[1].get_facecolor()) == to_hex(
        palette.TIER_COLORS["engineer"]
    )


def canvas_pixels(ax):
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(ax.figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba()).copy()


def test_environment_costs_update_in_place_draws_what_a_new_chart_draws():
    first = [
        {"name": "Colab (free)", "cost": 0.0, "hours": 5.0, "tier": "hobbyist", "gpu": "T4"},
        {"name": "Lambda", "cost": 12.5, "hours": 3.2, "tier": "engineer", "gpu": "A100"},
        {"name": "SageMaker", "cost": None, "note": "no GPU large enough"},
    ]
    second = [
        {"name": "Colab (free)", "cost": None, "note": "needs 40 GiB"},
        {"name": "Lambda", "cost": 310.0, "hours": 41.0, "tier": "enterprise", "gpu": "8x H100"},
        {
            "name": "SageMaker",
            "cost": 95.0,
            "hours": 7.5,
            "tier": "own hardware",
            "gpu": "RTX 4090",
        },
    ]
    ax = new_ax(7.5, 4.2)
    drawn = charts.draw_environment_costs(ax, first)
    bars, legend = drawn["bars"], drawn["legend"]
    charts.update_environment_costs(ax, drawn, second)
    assert drawn["bars"] is bars and drawn["legend"] is not legend  # new tiers: new legend
    assert drawn["tiers"] == ["enterprise", "own hardware"]
    fresh = new_ax(7.5, 4.2)
    charts.draw_environment_costs(fresh, second)
    assert (canvas_pixels(ax) == canvas_pixels(fresh)).all()
    with pytest.raises(LessonkitError, match="order drawn"):
        charts.update_environment_costs(ax, drawn, second[::-1])


def test_decision_flow_update_in_place_draws_what_a_new_chart_draws():
    ax = new_ax(7, 4.5)
    drawn = charts.draw_decision_flow(ax, charts.decision_path("7B", "low"))
    for size, budget in (("70B", None), ("8B", "high"), ("13B", None)):
        path = charts.decision_path(size, budget)
        charts.update_decision_flow(ax, drawn, path)
        fresh = new_ax(7, 4.5)
        charts.draw_decision_flow(fresh, path)
        assert (canvas_pixels(ax) == canvas_pixels(fresh)).all(), path
    with pytest.raises(LessonkitError, match="no step"):
        charts.update_decision_flow(ax, drawn, ["goal", "cluster"])


@pytest.mark.parametrize(
    ("size", "budget", "end"),
    [
        ("7B", "low", "colab_lambda"),
        ("8B", "High", "rtx4090"),
        (7e9, None, "budget"),
        ("70B", "low", "cluster"),
        ("13B", "low", "size"),
        (None, None, "size"),
    ],
)
def test_decision_path_follows_the_guides_flow(size, budget, end):
    path = charts.decision_path(size, budget)
    assert path[:2] == ["goal", "size"] and path[-1] == end
    for a, b in itertools.pairwise(path):
        assert (a, b) in planning_charts.FLOW_EDGES


def test_decision_flow_highlights_exactly_the_path():
    path = charts.decision_path("7B", "low")
    drawn = charts.draw_decision_flow(new_ax(7, 4.5), path)
    assert set(drawn["nodes"]) == set(planning_charts.FLOW_NODES)
    for key, artist in drawn["nodes"].items():
        assert charts.is_highlighted(artist) == (key in path)
    for edge, arrow in drawn["edges"].items():
        hot = edge in set(itertools.pairwise(path))
        assert (arrow.arrow_patch.get_linewidth() > 2) == hot
    plain = charts.draw_decision_flow(new_ax(7, 4.5))
    assert not any(charts.is_highlighted(a) for a in plain["nodes"].values())


def test_decision_flow_rejects_bad_paths_and_budgets():
    with pytest.raises(LessonkitError, match="flow node"):
        charts.draw_decision_flow(new_ax(), ["goal", "moon"])
    with pytest.raises(LessonkitError, match="no step"):
        charts.draw_decision_flow(new_ax(), ["goal", "cluster"])
    with pytest.raises(LessonkitError, match="budget"):
        charts.decision_path("7B", "medium")


def test_importing_charts_does_not_import_matplotlib():
    code = (
        "import sys, lessonkit.charts; "
        "print('matplotlib' in sys.modules, 'ipywidgets' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
