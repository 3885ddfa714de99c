"""Every chart the course draws can be read at the size it is shown: no text over text, no line
through text, nothing off the figure, fonts at least 9 pt at display size; at the figure sizes
the notebooks and the explorers use, over small and huge runs, many GPUs and several presets."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure

import lessonkit as lk
from lessonkit import charts
from lessonkit.charts import layout
from lessonkit.charts.fit_chart import gpu_fit_height
from lessonkit.planning import method_settings
from lessonkit.units import GiB


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def run(model: str = "7B", method: str = "full", **settings: object) -> lk.MemoryReport:
    return lk.estimate(model, **{**method_settings(method), **settings})


def explorer_figure(width: float, height: float, **margins: float) -> Figure:
    from lessonkit.widgets.explorer import new_figure

    return new_figure(width, height, **margins)


def readable(figure: Figure) -> None:
    problems = layout.layout_problems(figure)
    assert problems == [], "\n".join(problems)


RUNS = {  # small and huge runs, several GPUs, runs that fit a card and runs that fit none
    "gpt2 lora": dict(model="gpt2", method="lora", batch_size=1, seq_len=128),
    "7B qlora": dict(model="7B", method="qlora", batch_size=1, seq_len=256),
    "7B lora": dict(model="7B", method="lora", batch_size=4, seq_len=2048),
    "7B full": dict(model="7B", method="full", batch_size=1, seq_len=512),
    "llama-3.1-8b lora long": dict(model="llama-3.1-8b", method="lora", batch_size=8, seq_len=8192),
    "qwen2.5-0.5b full": dict(model="qwen2.5-0.5b", method="full", batch_size=16, seq_len=1024),
    "gemma-2-9b qlora": dict(model="gemma-2-9b", method="qlora", batch_size=2, seq_len=2048),
    "70B full on 8 GPUs": dict(
        model="70B", method="full", batch_size=8, seq_len=4096, n_gpus=8, zero_stage=3
    ),
    "70B full": dict(model="70B", method="full", batch_size=64, seq_len=32768),
}


# ----- the checker itself finds what it is for ---------------------------------------------
def test_the_checker_finds_overlaps_lines_through_text_small_fonts_and_text_off_the_figure():
    figure = Figure(figsize=(6, 3))
    ax = figure.add_subplot()
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    ax.text(2, 5, "first label", fontsize=10)
    ax.text(2.3, 5.1, "second label", fontsize=10)
    ax.axhline(8.2)
    ax.text(6, 8, "crossed", fontsize=10)
    ax.text(6, 2, "tiny", fontsize=7)
    ax.text(9.9, 1, "runs past the right edge of the figure", fontsize=10)
    problems = " | ".join(layout.layout_problems(figure))
    assert "'first label' overlaps 'second label'" in problems
    assert "runs through 'crossed'" in problems
    assert "'tiny' is 7.0 pt" in problems
    assert "'runs past the right edge of the figure' runs off the figure" in problems
    fine = Figure(figsize=(6, 3))
    ax = fine.add_subplot()
    ax.text(0.1, 0.5, "alone", fontsize=10)
    assert layout.layout_problems(fine) == []


def test_a_figure_wider_than_the_output_area_is_judged_at_its_shrunk_size():
    wide = Figure(figsize=(15, 3.8))
    wide.add_subplot().text(0.1, 0.5, "ten points", fontsize=10)
    assert layout.display_scale(wide) == pytest.approx(layout.DISPLAY_WIDTH_INCHES / 15)
    assert any("'ten points' is 6.3 pt" in p for p in layout.layout_problems(wide))
    assert layout.display_scale(Figure(figsize=(8, 4))) == 1.0


def test_an_opaque_label_over_a_line_is_not_crossed_by_it():
    figure = Figure(figsize=(6, 3))
    ax = figure.add_subplot()
    ax.set_ylim(0, 10)
    ax.axhline(5, zorder=1)
    ax.text(0.5, 4.9, "on white", fontsize=10, zorder=5, bbox=dict(fc="white", ec="none"))
    assert layout.layout_problems(figure) == []


# ----- the memory breakdown -------------------------------------------------------------------
@pytest.mark.parametrize("name", list(RUNS))
def test_the_vram_explorers_breakdown_is_readable(name):
    figure = explorer_figure(7.5, 3.6, left=0.1, right=0.77, bottom=0.2, top=0.9)
    charts.BreakdownChart(figure.add_subplot()).update(run(**RUNS[name]))
    readable(figure)


@pytest.mark.parametrize(
    ("model", "batch", "seq"), [("7B", 1, 512), ("llama-3.1-8b", 4, 2048), ("gpt2", 1, 128)]
)
def test_notebook_ones_breakdown_of_three_methods_is_readable(model, batch, seq):
    figure, ax = plt.subplots(figsize=(8, 4.2))
    reports = [run(model, m, batch_size=batch, seq_len=seq) for m in ("full", "lora", "qlora")]
    charts.draw_breakdown(ax, reports)
    ax.set_title(f"{model}: peak memory per GPU, batch {batch} x {seq} tokens")
    figure.tight_layout()
    readable(figure)


def test_six_bars_wrap_their_names_and_keep_gpu_labels_off_the_peak_labels():
    figure, ax = plt.subplots(figsize=(8, 4.2))
    reports = [
        run("7B", m, batch_size=b, seq_len=1024) for m in ("full", "lora", "qlora") for b in (1, 8)
    ]
    chart = charts.draw_breakdown(ax, reports)
    figure.tight_layout()
    readable(figure)
    assert all("\n" in t.get_text() for t in ax.get_xticklabels() if t.get_text())
    assert any(not t.get_visible() for t in chart.gpu_texts)  # one gave way to a peak label


# ----- which GPUs fit -------------------------------------------------------------------------
def fit_runs() -> list[str]:
    return ["7B qlora", "7B lora", "7B full", "70B full on 8 GPUs", "70B full"]


@pytest.mark.parametrize("name", fit_runs())
def test_notebook_twos_fit_chart_of_the_whole_catalog_is_readable(name):
    figure, ax = plt.subplots(figsize=(8, 6.5))
    drawn = charts.draw_gpu_fit(ax, run(**RUNS[name]), lk.list_gpus())
    figure.tight_layout()
    readable(figure)
    no_line_through_labels(ax, drawn)


@pytest.mark.parametrize("name", fit_runs())
@pytest.mark.parametrize("whole_catalog", [False, True])
def test_the_gpu_matrix_explorers_fit_chart_is_readable(name, whole_catalog):
    gpus = lk.list_gpus() if whole_catalog else lk.list_gpus(in_guide=True)
    height = max(4.6, gpu_fit_height(len(gpus)))
    figure = explorer_figure(
        7.5, height, left=0.26, right=0.97, bottom=0.55 / height, top=1 - 0.65 / height
    )
    ax = figure.add_subplot()
    drawn = charts.draw_gpu_fit(ax, run(**RUNS[name]), gpus, settings=False)
    readable(figure)
    no_line_through_labels(ax, drawn)
    for other in fit_runs():  # in place, as the explorer redraws
        charts.update_gpu_fit(ax, drawn, run(**RUNS[other]), settings=False)
        readable(figure)
        no_line_through_labels(ax, drawn)


def no_line_through_labels(ax, drawn) -> None:
    """The "needs X" line runs through no bar's label, nor through its own."""
    renderer = ax.figure._get_renderer()
    for text in [*drawn["labels"], drawn["need_text"]]:
        assert not layout.line_crosses(drawn["line"], text.get_window_extent(renderer)), (
            text.get_text()
        )
    need = drawn["line"].get_xdata()[0]
    assert need == pytest.approx(
        float(drawn["need_text"].get_text().split()[1].replace(",", "")), abs=0.05
    )


def test_a_label_that_would_cross_the_line_moves_past_it_or_into_its_bar():
    gpus = [lk.get_gpu(n) for n in ("RTX 4090", "RTX A6000", "A100 80GB", "H100 SXM")]
    figure = explorer_figure(7.5, 4.6, left=0.26, right=0.97, bottom=0.12, top=0.86)
    ax = figure.add_subplot()
    report = run("7B", "lora", batch_size=4, seq_len=1024)  # between 24 and 48 GB cards
    drawn = charts.draw_gpu_fit(ax, report, gpus, settings=False)
    figure.canvas.draw()
    need = report.total_bytes / GiB
    by_name = {g.name: label for g, label in zip(drawn["gpus"], drawn["labels"], strict=True)}
    short = by_name["RTX 4090"]  # its bar ends before the line: its label starts after it
    assert short.get_text().startswith("short by") and short.get_position()[0] > need
    long = by_name["A100 80GB"]  # the line crosses its bar: its label is clear of the line
    renderer = figure._get_renderer()
    assert not layout.line_crosses(drawn["line"], long.get_window_extent(renderer))


def test_the_whole_catalog_needs_a_taller_figure_than_the_guides_four():
    assert gpu_fit_height(27) > gpu_fit_height(4)
    figure, ax = plt.subplots(figsize=(7.5, gpu_fit_height(27)))
    charts.draw_gpu_fit(ax, run(**RUNS["7B lora"]), lk.list_gpus())
    figure.tight_layout()
    readable(figure)


# ----- the memory timeline --------------------------------------------------------------------
TIMELINE_RUNS = ["7B full", "7B lora", "7B qlora", "70B full on 8 GPUs", "gemma-2-9b qlora"]


@pytest.mark.parametrize("name", TIMELINE_RUNS)
@pytest.mark.parametrize("gpu", [None, "A100 80GB", "T4"])
def test_the_timeline_is_readable_and_its_peak_label_clear_of_the_cuda_context_label(name, gpu):
    figure, ax = plt.subplots(figsize=(8.5, 3.6), layout="constrained")
    report = run(**RUNS[name])
    chart = charts.memory_timeline(report, ax, gpu=None if gpu is None else lk.get_gpu(gpu))
    readable(figure)
    renderer = figure._get_renderer()
    peak = chart.peak_text.get_window_extent(renderer)
    assert chart.total_text.get_visible()  # an estimate adds the CUDA context and margin
    total = chart.total_text.get_window_extent(renderer)
    assert not layout.boxes_overlap(peak, total)
    for line in (chart.total_line, chart.gpu_line):
        assert not line.get_visible() or not layout.line_crosses(line, peak)


@pytest.mark.parametrize("name", TIMELINE_RUNS)
def test_the_timeline_explorers_chart_is_readable(name):
    figure = explorer_figure(8.5, 3.6, left=0.08, right=0.74, bottom=0.12, top=0.9)
    chart = charts.TimelineChart(figure.add_subplot())
    chart.update(run(**RUNS[name]))
    readable(figure)
    for other in TIMELINE_RUNS:  # in place, and again: the same picture each time
        chart.update(run(**RUNS[other]))
        readable(figure)
    limits = chart.ax.get_ylim()
    figure.canvas.draw()
    assert chart.ax.get_ylim() == limits  # drawing again does not grow the axis


def test_side_by_side_timelines_are_readable_and_say_peak_the_same_way():
    on_cpu = lk.estimate("gpt2", method="full", batch_size=1, seq_len=512, device="cpu")
    on_gpu = run("7B", "full", batch_size=1, seq_len=512)
    shown = charts.memory_timelines([on_cpu, on_gpu])
    figure = shown[0].ax.figure
    assert figure.get_size_inches()[0] <= layout.DISPLAY_WIDTH_INCHES  # never shrunk to fit
    readable(figure)
    cpu, gpu = shown
    # "Peak" is the peak per GPU, as in the breakdown and the report; the tensors' highest moment
    # is called so where the CUDA context and margin come on top of it.
    assert cpu.peak_text.get_text().startswith(f"peak per GPU {on_cpu.total_bytes / GiB:,.2f} GiB")
    assert not cpu.total_text.get_visible()
    assert gpu.peak_text.get_text().startswith(
        f"tensors' peak {on_gpu.tensor_bytes / GiB:,.2f} GiB"
    )
    assert gpu.total_text.get_text().startswith(f"{on_gpu.total_bytes / GiB:,.2f} GiB peak per GPU")
    with pytest.raises(lk.LessonkitError, match="at least one"):
        charts.memory_timelines([])
    with pytest.raises(lk.LessonkitError, match="titles"):
        charts.memory_timelines([on_cpu], titles=["a", "b"])


# ----- cost per environment and the decision flow ----------------------------------------------
ENVIRONMENT_RUNS = [("7B", "lora"), ("7B", "full"), ("70B", "full"), ("70B", "qlora")]


@pytest.mark.parametrize(("model", "method"), ENVIRONMENT_RUNS)
def test_the_environment_charts_are_readable(model, method):
    from lessonkit.widgets.explorers import environment_rows

    rows = environment_rows(lk.recommend(model, method=method, tokens=50e6))
    figure, ax = plt.subplots(figsize=(8, 4.8))
    charts.draw_environment_costs(ax, rows)
    figure.tight_layout()
    readable(figure)
    figure = explorer_figure(7.5, 4.2, left=0.27, right=0.97, bottom=0.12, top=0.88)
    ax = figure.add_subplot()
    charts.draw_environment_costs(ax, rows)
    ax.set_title(f"{model}, {method}: cheapest setup that fits in each environment", fontsize=9)
    readable(figure)


def test_a_long_reason_is_cut_to_its_first_clause_on_two_lines_at_most():
    reason = (
        "no GPU setup it offers has enough memory for this run: the closest, full fine-tuning "
        "on 1 x T4, needs 132.3 GiB per GPU at batch 1 x 512 tokens, against 14.75 GiB usable"
    )
    text = charts.planning_charts.not_possible_text(reason, 40)
    assert text.replace("\n", " ") == (
        "not possible: no GPU setup it offers has enough memory for this run"
    )
    assert all(len(line) <= 40 for line in text.split("\n")) and text.count("\n") <= 1
    long = charts.planning_charts.not_possible_text("word " * 60, 30)
    assert long.count("\n") == 1 and long.endswith("…")
    assert charts.planning_charts.not_possible_text("") == "not possible"


def test_a_reason_wraps_only_where_the_width_runs_out():
    planning = charts.planning_charts
    reason = "no GPU setup it offers has enough memory for this run: the closest needs more"
    whole = "not possible: no GPU setup it offers has enough memory for this run"
    wide = planning._text_width(whole)
    assert planning.not_possible_text(reason, width=wide + 1) == whole  # one line when it fits
    two = planning.not_possible_text(reason, width=wide * 0.7)
    first, second = two.split("\n")
    assert two.replace("\n", " ") == whole
    assert planning._text_width(first) <= wide * 0.7
    # the first line takes every word that fits: the next one would not
    assert planning._text_width(f"{first} {second.split()[0]}") > wide * 0.7
    cut = planning.not_possible_text("word " * 60, width=wide * 0.5)
    assert cut.count("\n") == 1 and cut.endswith("…")
    assert all(planning._text_width(line) <= wide * 0.5 for line in cut.split("\n"))


@pytest.mark.parametrize("layout_kind", ["explorer", "notebook"])
def test_not_possible_labels_use_the_width_of_the_axes(layout_kind):
    from lessonkit.widgets.explorers import environment_rows

    rows = environment_rows(lk.recommend("70B", method="full", tokens=50e6))
    if layout_kind == "explorer":
        figure = explorer_figure(7.5, 4.2, left=0.27, right=0.97, bottom=0.12, top=0.88)
        ax = figure.add_subplot()
        charts.draw_environment_costs(ax, rows)
    else:  # notebook 3: a tight layout narrows the axes after the labels are set
        figure, ax = plt.subplots(figsize=(8, 4.8))
        charts.draw_environment_costs(ax, rows)
        figure.tight_layout()
    readable(figure)  # draws: the labels are placed for the final axes
    renderer = figure.canvas.get_renderer()
    labels = [t for t in ax.texts if t.get_text().startswith("not possible")]
    assert labels
    for label in labels:
        box = label.get_window_extent(renderer)
        assert ax.bbox.x0 <= box.x0 and box.x1 <= ax.bbox.x1, label.get_text()
        one_line = label.get_text().replace("\n", " ")
        room = ax.bbox.width * 72 / figure.dpi * 0.99 - 12
        if charts.planning_charts._text_width(one_line) <= room:
            assert "\n" not in label.get_text(), label.get_text()


@pytest.mark.parametrize(
    ("size", "budget"), [("7B", "low"), ("8B", "high"), ("70B", None), ("13B", None)]
)
def test_the_decision_flow_is_readable(size, budget):
    path = charts.decision_path(size, budget)
    figure, ax = plt.subplots(figsize=(8, 4.5))
    charts.draw_decision_flow(ax, path)
    readable(figure)
    figure = explorer_figure(7.5, 4.2, left=0.0, right=1.0, bottom=0.0, top=1.0)
    charts.draw_decision_flow(figure.add_subplot(), path)
    readable(figure)


# ----- the explorers as they are built -----------------------------------------------------------
def test_every_explorer_draws_a_readable_chart():
    pytest.importorskip("ipywidgets")
    from lessonkit import widgets
    from lessonkit.widgets.timeline import timeline_explorer

    for explorer in (
        widgets.vram_explorer("7B", method="lora"),
        widgets.gpu_matrix_explorer("7B", method="lora"),
        widgets.environment_explorer("7B", method="lora"),
        widgets.decision_flow_explorer("70B"),
        timeline_explorer("7B", method="full"),
    ):
        assert explorer.error is None
        readable(explorer.figure)


def test_the_gpu_matrix_explorer_shows_the_whole_catalog_readably():
    pytest.importorskip("ipywidgets")
    from lessonkit import widgets

    explorer = widgets.gpu_matrix_explorer("7B", method="lora")
    whole = next(o for o in explorer.controls["gpu_set"].options if "four" not in str(o))
    explorer.controls["gpu_set"].value = whole
    assert explorer.error is None
    readable(explorer.figure)
    # the figure is made tall enough for the whole catalog, so the "needs" band shows above
    # the bars, as it does for the guide's four
    drawn = explorer.drawn
    assert len(drawn["gpus"]) == len(lk.list_gpus())
    assert drawn["need_text"].get_visible()
    assert f"needs {explorer.report.total_bytes / GiB:,.1f} GiB" in drawn["need_text"].get_text()
