"""The live explorers, driven as an instructor would: every control to its ends, every option."""

from __future__ import annotations

import base64
import html
import io
import re
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")

import itertools

import pytest

from lessonkit import charts
from lessonkit.charts import memory_charts, palette
from lessonkit.errors import LessonkitError
from lessonkit.hardware.gpus import get_gpu, list_gpus
from lessonkit.memory.estimating import estimate
from lessonkit.memory.report import CATEGORIES
from lessonkit.planning.fitting import usual_precision
from lessonkit.planning.verdicts import flow_notes
from lessonkit.units import GiB
from lessonkit.widgets import explorers as widgets
from lessonkit.widgets.explorer import NO_CHART


def settings_of(explorer) -> dict:
    settings = {k: w.value for k, w in explorer.controls.items() if k in widgets.SETUP_DEFAULTS}
    if explorer.controls["model"].value == "gpt2":
        settings["lora_targets"] = ("c_attn",)
    if settings.get("loss") == "standard":
        settings.pop("loss_chunks", None)  # estimate takes a chunk count for the chunked loss
    return settings


def extremes(widget) -> list:
    """The values an instructor reaches: both ends of a slider, every option of a menu."""
    if hasattr(widget, "options"):
        values = [v if not isinstance(v, tuple) else v[1] for v in widget.options]
        return [values[0], values[-1]] if "Slider" in type(widget).__name__ else values
    if hasattr(widget, "min"):
        return [widget.min, widget.max]
    return [not widget.value, widget.value]  # a checkbox


def fitting_names(readout: str) -> list[str]:
    match = re.search(r"GPUs: (.*?)\.<br>", readout)
    return match.group(1).split(", ") if match else []


def check_vram_state(explorer) -> None:
    """The chart and readout show estimate() for the controls' values, or a readable error."""
    try:
        report = estimate(explorer.controls["model"].value, **settings_of(explorer))
    except LessonkitError as exc:
        refusal = str(exc)
    else:
        refusal = None
    if refusal is not None:
        assert explorer.error is not None
        assert "Cannot show this combination" in explorer.readout.value
        assert refusal[:40] in explorer.readout.value.replace("&#x27;", "'")
        return
    assert explorer.error is None, explorer.error
    drawn = explorer.chart.heights()[0]
    for key in CATEGORIES:
        assert drawn[key] == pytest.approx(report.breakdown[key] / GiB)
    assert f"Peak per GPU: {report.total_bytes / GiB:,.1f} GiB" in explorer.readout.value
    fit = [g.name for g in list_gpus() if g.fits(report)]
    if fit:
        assert sorted(fitting_names(explorer.readout.value)) == sorted(fit)
        smallest = min(
            (g for g in list_gpus() if g.fits(report)), key=lambda g: (g.usable_bytes, g.name)
        )
        room = (smallest.usable_bytes - report.total_bytes) / GiB
        assert (
            f"Smallest that fits: {smallest.name}, {smallest.usable_text} usable, "
            f"+{room:,.1f} GiB free."
        ) in explorer.readout.value
        assert explorer.chart.note.get_text() == "" or report.total_bytes > max(
            g.usable_bytes for g in list_gpus()
        )
    elif report.settings["n_gpus"] > 1:  # never "single GPU" while several are selected
        n = report.settings["n_gpus"]
        assert f"even with {n} GPUs, the peak per GPU is above every GPU" in explorer.readout.value
        assert f"above every GPU even on {n} GPUs" in explorer.chart.note.get_text()
        assert "single GPU" not in explorer.readout.value + explorer.chart.note.get_text()
    else:
        assert "Does not fit on any single GPU" in explorer.readout.value
        assert "does not fit on any single GPU" in explorer.chart.note.get_text()


@pytest.fixture
def vram():
    return widgets.vram_explorer("7B")


def test_vram_explorer_starts_where_estimate_does(vram):
    assert settings_of(vram) == {
        k: v for k, v in widgets.SETUP_DEFAULTS.items() if k != "loss_chunks"
    }
    assert vram.controls["loss_chunks"].value == widgets.SETUP_DEFAULTS["loss_chunks"]
    check_vram_state(vram)
    assert "lessonkit-readout" in vram.readout._dom_classes
    assert vram.image.value == vram.png() and vram.image.format == "png"


def test_every_vram_control_at_its_ends_and_every_option(vram):
    figure, patches = vram.figure, list(vram.chart.containers["weights"].patches)
    for widget in vram.controls.values():
        start = widget.value
        for value in extremes(widget):
            before = vram.readout.value
            widget.value = value
            check_vram_state(vram)
            if value != start and vram.error is None:
                report = estimate(vram.controls["model"].value, **settings_of(vram))
                if f"{report.total_bytes / GiB:,.1f} GiB" not in before:
                    assert vram.readout.value != before
        widget.value = start
    assert vram.figure is figure  # one figure, updated in place
    assert vram.chart.containers["weights"].patches == patches


def count_estimates(monkeypatch) -> list:
    calls = []
    real = widgets._estimate

    def counted(model, **settings):
        calls.append(settings)
        return real(model, **settings)

    monkeypatch.setattr(widgets, "_estimate", counted)
    return calls


@pytest.mark.parametrize("make", [widgets.vram_explorer, widgets.gpu_matrix_explorer])
def test_the_method_control_carries_its_usual_precision(make, monkeypatch):
    explorer = make("7B")
    c = explorer.controls
    calls = count_estimates(monkeypatch)
    c["method"].value = "lora"
    # What people run: the base model loaded in bf16, adapters in fp32 (not fp32 under autocast).
    assert c["precision"].value == usual_precision("lora") == "bf16"
    lora = estimate("7B", method="lora", precision="bf16")
    assert explorer.report.total_bytes == lora.total_bytes
    autocast = estimate("7B", method="lora", precision="bf16-mixed")
    assert explorer.report.total_bytes < autocast.total_bytes / 2
    assert len(calls) == 1  # one redraw for the method and the precision it brings
    assert "precision <b>bf16</b> (bf16 base weights, fp32 adapters)" in explorer.readout.value
    c["precision"].value = "bf16-mixed"  # the student can still choose
    assert c["method"].value == "lora"
    assert explorer.report.total_bytes == autocast.total_bytes
    assert "precision <b>bf16-mixed</b> (fp32 base weights, bf16 autocast" in explorer.readout.value
    c["method"].value = "qlora"
    assert c["precision"].value == "bf16"
    assert "4-bit NF4 base weights" in explorer.readout.value
    c["method"].value = "full"
    assert c["precision"].value == usual_precision("full") == "bf16-mixed"
    assert explorer.report.total_bytes == estimate("7B").total_bytes
    assert "precision <b>bf16-mixed</b> (fp32 weights, bf16 autocast)" in explorer.readout.value
    assert len(calls) == 4


def test_a_starting_method_starts_with_its_usual_precision():
    assert widgets.vram_explorer(method="lora").controls["precision"].value == "bf16"
    assert widgets.vram_explorer(method="full").controls["precision"].value == "bf16-mixed"
    kept = widgets.vram_explorer(method="lora", precision="fp32")
    assert kept.controls["precision"].value == "fp32"
    assert "precision <b>fp32</b>" in kept.readout.value


def test_sliders_have_teaching_ranges(vram):
    c = vram.controls
    assert (c["batch_size"].min, c["batch_size"].max) == (1, 64)
    seqs = [v for _, v in c["seq_len"].options]
    assert (
        seqs[0] == 128
        and seqs[-1] == 32768
        and all(b == 2 * a for a, b in itertools.pairwise(seqs))
    )
    ranks = [v for _, v in c["lora_rank"].options]
    assert ranks[0] == 1 and ranks[-1] == 256
    c["method"].value = "full"
    assert c["lora_rank"].disabled
    c["method"].value = "lora"
    assert not c["lora_rank"].disabled


def test_a_70b_full_fine_tune_does_not_fit_and_qlora_does(vram):
    vram.controls["model"].value = "70B"
    vram.controls["method"].value = "full"
    assert "Does not fit on any single GPU" in vram.readout.value
    assert "does not fit on any single GPU" in vram.chart.note.get_text()
    vram.controls["method"].value = "qlora"
    report = estimate("70B", **settings_of(vram))
    assert sorted(fitting_names(vram.readout.value)) == sorted(
        g.name for g in list_gpus() if g.fits(report)
    )
    assert vram.chart.note.get_text() == ""


def test_a_failing_estimate_is_a_message_not_a_traceback(vram, monkeypatch):
    def broken(model, **settings):
        raise LessonkitError("that combination is not supported")

    monkeypatch.setattr(widgets, "_estimate", broken)
    vram.controls["batch_size"].value = 8
    assert "that combination is not supported" in vram.readout.value
    assert isinstance(vram.error, LessonkitError)
    assert_chart_cleared(vram)
    monkeypatch.undo()
    vram.controls["batch_size"].value = 9
    assert vram.error is None
    check_vram_state(vram)


def test_each_redraw_shows_one_png_of_the_current_chart(vram):
    from PIL import Image

    vram.controls["batch_size"].value = 16
    png = vram.image.value  # an Image widget: it shows where an Output widget stays blank
    assert png == vram.png() and vram.image.layout.display != "none"
    width, height = Image.open(io.BytesIO(png)).size
    assert (width, height) == tuple(
        int(v * widgets.CHART_DPI) for v in vram.figure.get_size_inches()
    )
    assert vram.output.layout.height == f"{height + 8}px"  # fixed height: nothing jumps


def test_a_redraw_paints_the_same_picture_as_a_full_draw(vram):
    import numpy as np
    from PIL import Image

    changes = [
        ("batch_size", 7),
        ("seq_len", 4096),
        ("method", "lora"),
        ("batch_size", 64),
        ("lora_rank", 256),
        ("model", "70B"),
        ("batch_size", 2),
        ("n_gpus", 8),
        ("zero_stage", 3),
        ("seq_len", 1024),
        ("model", "gpt2"),
    ]
    for name, value in changes:
        vram.controls[name].value = value
        assert vram.error is None, vram.error
        shown = np.asarray(Image.open(io.BytesIO(vram._png)).convert("RGB"))
        vram.figure.canvas.draw()
        full = np.asarray(vram.figure.canvas.buffer_rgba())[:, :, :3]
        assert shown.shape == full.shape and (shown == full).all(), (name, value)


def test_static_fallback_in_the_display_bundle(vram, monkeypatch):
    bundle = vram._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle and "image/png" not in bundle
    static = vram.static_bundle()
    assert base64.b64decode(static["image/png"]) == vram.png()
    assert vram.readout.value in static["text/html"]
    assert static["image/png"] in static["text/html"]  # the picture inside the HTML copy
    assert "class='lessonkit-static'" in static["text/html"]
    monkeypatch.setenv("LESSONKIT_STATIC", "1")
    assert widgets.static_mode()
    bundle = vram._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" not in bundle
    assert "image/png" in bundle and "Peak per GPU" in bundle["text/plain"]
    assert "<" not in bundle["text/plain"]


def displayed_outputs(explorer) -> list[dict]:
    """What display(explorer) sends to the front end, through IPython's display machinery
    (``_ipython_display_``, in ipywidgets 7 and 8): one bundle per output."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.display import display
    from IPython.utils.capture import capture_output

    InteractiveShell.instance()
    with capture_output() as captured:
        display(explorer)
    return [output.data for output in captured.outputs]


def test_display_sends_the_widget_and_a_static_copy_live_and_only_the_copy_static(
    vram, monkeypatch
):
    monkeypatch.delenv("LESSONKIT_STATIC", raising=False)
    widget, copy = displayed_outputs(vram)
    assert widget["application/vnd.jupyter.widget-view+json"]["model_id"] == vram.model_id
    assert "image/png" not in widget and widget["text/plain"] == ""
    assert base64.b64decode(copy["image/png"]) == vram.png()
    assert "Peak per GPU" in copy["text/html"] and "lessonkit-static" in copy["text/html"]
    # the live widget carries the rule that hides the copy beside it
    assert (
        ".lessonkit-static" in vram.static_rule.value and "display:none" in vram.static_rule.value
    )
    monkeypatch.setenv("LESSONKIT_STATIC", "1")
    (static,) = displayed_outputs(vram)
    assert "application/vnd.jupyter.widget-view+json" not in static
    assert "Peak per GPU" in static["text/plain"] and "image/png" in static


def test_the_static_copy_follows_every_change_so_a_saved_notebook_shows_the_last_state(
    vram, monkeypatch
):
    monkeypatch.delenv("LESSONKIT_STATIC", raising=False)
    updates = []

    class Handle:
        def update(self, bundle, raw):
            updates.append(bundle)

    vram._static_handle = Handle()
    vram.controls["batch_size"].value = 12
    assert updates and updates[-1] == vram.static_bundle()
    assert base64.b64decode(updates[-1]["image/png"]) == vram.png()
    vram.controls["method"].value = "qlora"
    vram.controls["n_gpus"].value = 8
    vram.controls["zero_stage"].value = 3  # refused: the copy says so, with no picture
    assert "Cannot show this combination" in updates[-1]["text/html"]
    assert "image/png" not in updates[-1] and NO_CHART in updates[-1]["text/html"]

    class Closed:
        def update(self, bundle, raw):
            raise OSError("the front end went away")

    vram._static_handle = Closed()
    vram.controls["zero_stage"].value = 2  # never raises; the widget goes on
    assert vram.error is None and vram._static_handle is None


def test_under_ipywidgets_7_greyed_out_savers_say_why_as_text(monkeypatch):
    from lessonkit.widgets import controls

    explorer = widgets.vram_explorer("7B")
    assert explorer.notes.value == "" or not controls.tooltips_shown()
    monkeypatch.setattr(controls, "tooltips_shown", lambda: False)  # as ipywidgets 7
    explorer.controls["batch_size"].value = 2
    notes = html.unescape(explorer.notes.value)
    assert "Activation offload: Activation offload moves the checkpoints" in notes
    assert explorer.notes.layout.display != "none"
    explorer.controls["gradient_checkpointing"].value = True
    assert "Activation offload" not in html.unescape(explorer.notes.value)
    explorer.controls["n_gpus"].value = 2
    assert "one GPU" in html.unescape(explorer.notes.value)
    explorer.controls["n_gpus"].value = 1
    assert explorer.notes.value == "" and explorer.notes.layout.display == "none"


# The widget models Colab's front end renders (ipywidgets 7) and JupyterLab's (ipywidgets 8).
CORE_MODULES = {"@jupyter-widgets/base", "@jupyter-widgets/controls"}  # no Output widget


def widget_tree(widget) -> list:
    """A widget and every widget it holds (children, layout, style), depth first."""
    import ipywidgets as W

    found, stack = [], [widget]
    while stack:
        current = stack.pop()
        if any(current is seen for seen in found):
            continue
        found.append(current)
        for name in current.keys:
            value = getattr(current, name, None)
            for item in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(item, W.Widget):
                    stack.append(item)
    return found


def test_the_explorers_use_only_core_widgets():
    import ipywidgets as W

    explorers = [
        widgets.vram_explorer(),
        widgets.gpu_matrix_explorer(),
        widgets.environment_explorer(),
        widgets.decision_flow_explorer(),
    ]
    for explorer in explorers:
        tree = widget_tree(explorer)
        assert len(tree) > 10 and explorer.output in tree and explorer.readout in tree
        for widget in tree:
            assert type(widget).__module__.startswith(("ipywidgets.", "lessonkit.")), type(widget)
            assert isinstance(widget, W.Widget)
            assert widget._model_module in CORE_MODULES, (type(widget), widget._model_module)
            if widget._view_name is not None:
                assert widget._view_module in CORE_MODULES, (type(widget), widget._view_module)


def test_css_classes_are_set_and_documented():
    explorers = [
        widgets.vram_explorer(),
        widgets.gpu_matrix_explorer(),
        widgets.environment_explorer(),
        widgets.decision_flow_explorer(),
    ]
    doc = widgets.__doc__
    for explorer in explorers:
        assert "lessonkit-explorer" in explorer._dom_classes
        kind = next(c for c in explorer._dom_classes if c != "lessonkit-explorer")
        assert kind in doc
        assert "lessonkit-chart" in explorer.output._dom_classes
        for name, widget in explorer.controls.items():
            (css,) = [c for c in widget._dom_classes if c.startswith("lessonkit-")]
            assert css.endswith("-" + widgets.CONTROL_NAMES[name][0]) and css in doc
    assert "lessonkit-slider-batch" in explorers[0].controls["batch_size"]._dom_classes


def test_bad_starting_values_are_clear_errors():
    with pytest.raises(LessonkitError, match="Sequence length 1000"):
        widgets.vram_explorer(seq_len=1000)
    with pytest.raises(LessonkitError, match="Unknown setting 'batchsize'"):
        widgets.vram_explorer(batchsize=4)
    with pytest.raises(LessonkitError, match="Batch size"):
        widgets.vram_explorer(batch_size=100)
    with pytest.raises(LessonkitError):
        widgets.vram_explorer("llama-9000")


def test_starting_values_and_fixed_settings_reach_the_estimate():
    explorer = widgets.vram_explorer("mistral-7b", method="qlora", batch_size=4, attention="eager")
    assert explorer.controls["method"].value == "qlora"
    expected = estimate("mistral-7b", **settings_of(explorer), attention="eager")
    assert explorer.report.total_bytes == expected.total_bytes
    assert expected.total_bytes != estimate("mistral-7b", **settings_of(explorer)).total_bytes


@pytest.mark.parametrize("gpus", [None, "guide"])
def test_readouts_give_device_memory_and_shortfall_in_gib(gpus):
    # A 70B full fine-tune fits nowhere: the readout names the largest card by its usable GiB.
    shown = None if gpus is None else list_gpus(in_guide=True)
    report = estimate("70B", method="full")
    text = widgets.fit_summary(report, shown)
    biggest = max(shown or list_gpus(), key=lambda g: g.usable_bytes)
    short = (report.total_bytes - biggest.usable_bytes) / GiB
    assert (
        f"(largest: {biggest.name}, {biggest.usable_text} usable, short by {short:,.1f} GiB)"
        in text
    )
    assert not re.search(r"\d GB usable", text)  # not "85 GB usable" for an 80 GB card


def test_gpu_matrix_readout_of_the_guides_four_has_no_decimal_gb_device_sizes():
    explorer = widgets.gpu_matrix_explorer("70B", method="full")
    a100 = get_gpu("A100 80GB")
    assert f"A100 80GB, {a100.usable_text} usable" in explorer.readout.value
    assert "85 GB" not in explorer.readout.value
    labels = [t.get_text() for t in explorer.drawn["labels"]]
    assert all(label.startswith("short by") and " GiB" in label for label in labels)


def test_without_a_catalog_the_readout_compares_with_full_card_sizes_in_gib():
    report = estimate("7B", method="lora", precision="bf16", batch_size=4)
    text = widgets.fit_summary(report, [])
    first = next(s for s in memory_charts.COMMON_GPU_SIZES_GB if report.total_bytes <= s * GiB)
    assert f"Fits in the full {first:g} GiB of a {first:g} GB card and larger" in text


def test_gpu_matrix_explorer_every_control():
    explorer = widgets.gpu_matrix_explorer()
    guide = list_gpus(in_guide=True)
    assert [g.name for g in explorer.drawn["gpus"]] == [
        g.name for g in sorted(guide, key=lambda g: (g.usable_bytes, g.name))
    ]
    for widget in explorer.controls.values():
        start = widget.value
        for value in extremes(widget):
            widget.value = value
            shown = guide if explorer.controls["gpu_set"].value == "Guide's four" else list_gpus()
            assert explorer.error is None, explorer.error
            report = estimate(explorer.controls["model"].value, **settings_of(explorer))
            assert explorer.report.total_bytes == report.total_bytes
            assert len(explorer.drawn["bars"].patches) == len(shown)
            assert explorer.drawn["fits"] == [g.fits(report) for g in explorer.drawn["gpus"]]
        widget.value = start
    fixed = widgets.gpu_matrix_explorer(gpus=["t4", "a100"])
    assert "gpu_set" not in fixed.controls and len(fixed.drawn["gpus"]) == 2


def test_environment_explorer_shows_each_environments_cheapest_fitting_setup():
    from lessonkit.hardware.environments import list_environments
    from lessonkit.planning.recommender import recommend

    explorer = widgets.environment_explorer()
    for widget in explorer.controls.values():
        start = widget.value
        for value in extremes(widget):
            widget.value = value
            c = {k: w.value for k, w in explorer.controls.items()}
            try:
                rec = recommend(
                    c["model"],
                    method=c["method"],
                    tokens=c["tokens"],
                    batch_size=c["batch_size"],
                    seq_len=c["seq_len"],
                )
            except LessonkitError as exc:  # shown, not raised
                refused: type | None = type(exc)
            else:
                refused = None
            if refused is not None:
                assert "Cannot show this combination" in explorer.readout.value
                assert type(explorer.error) is refused
                continue
            assert explorer.error is None, explorer.error
            for env, row in zip(list_environments(), explorer.rows, strict=True):
                mine = [o for o in rec.options if o.environment == env.key and o.fits]
                if not mine:
                    assert row["cost"] is None and row["note"] == rec.left_out[env.key]
                    continue
                ranked = [o for o in mine if not o.tight] or mine  # tight fits come last
                assert row["cost"] == pytest.approx(min(o.cost_usd for o in ranked))
                assert row["option"].gpu in row["gpu"]
            widths = [p.get_width() for p in explorer.drawn["bars"].patches]
            assert widths == [r["cost"] or 0.0 for r in explorer.rows]
        widget.value = start
    explorer.controls["tokens"].value = 1e7
    small = {r["name"]: r["cost"] for r in explorer.rows}
    explorer.controls["tokens"].value = 1e9
    for row in explorer.rows:
        if row["cost"] is not None and small[row["name"]]:
            # 100 times the tokens: nearly 100 times the cost; the fixed start-up is paid once.
            assert 50 * small[row["name"]] < row["cost"] < 100 * small[row["name"]]


def test_environment_explorer_includes_the_workstation_at_its_amortized_price():
    from lessonkit.hardware.environments import get_environment

    explorer = widgets.environment_explorer("7B", method="lora", tokens=1e7)
    row = next(r for r in explorer.rows if r["name"] == get_environment("local").name)
    option = row["option"]
    assert option is not None and "not possible" not in row["note"]
    env = get_environment("local")
    hourly = env.hourly_cost(env.offer(option.gpu)) * option.count
    assert hourly > env.offer(option.gpu).price_per_hour.typical * option.count  # card included
    assert row["cost"] == pytest.approx(option.hours * hourly)
    labels = [t.get_text() for t in explorer.drawn["labels"]]
    assert not any("not possible" in t for t in labels)
    # A run no card it offers can hold is left out for memory, and says so.
    explorer.controls["model"].value = "70B"
    explorer.controls["method"].value = "full"
    row = next(r for r in explorer.rows if r["name"] == env.name)
    assert row["cost"] is None and "enough memory" in row["note"]


def test_environment_rows_give_the_budget_as_the_reason_under_a_budget():
    from lessonkit.hardware.environments import get_environment
    from lessonkit.planning.recommender import recommend

    rows = {r["name"]: r for r in widgets.environment_rows(recommend("7B", budget="low"))}
    local = rows[get_environment("local").name]
    assert local["cost"] is None and "budget per hour" in local["note"]
    assert "memory" not in local["note"]


def expected_readout_lines(rec) -> list[str]:
    """For each method, what the readout must say: the recommendation's cheapest option."""
    lines = []
    for option in rec.best_per_method().values():
        lines.append(
            f"<b>{html.escape(option.setup)}</b> on {html.escape(option.name)}, peak "
            f"{option.peak_bytes / GiB:,.1f} GiB per GPU"
        )
    return lines


@pytest.mark.parametrize("size", ["7B", "13B", "70B"])
def test_decision_flow_readout_agrees_with_recommend(size):
    from lessonkit.planning.recommender import recommend

    explorer = widgets.decision_flow_explorer()
    explorer.controls["size"].value = size
    for budget in ("Low", "High"):
        explorer.controls["budget"].value = budget
        asked = budget.lower() if "budget" in explorer.path else None
        rec = recommend(size, budget=asked)
        shown = explorer.recommendation
        assert (shown.model, shown.budget) == (rec.model, rec.budget)
        assert [(o.environment, o.gpu, o.count, o.method, o.peak_bytes) for o in shown.options] == [
            (o.environment, o.gpu, o.count, o.method, o.peak_bytes) for o in rec.options
        ]
        for line in expected_readout_lines(rec):
            assert line in explorer.readout.value
        for method, option in rec.best_per_method().items():
            assert option.settings["precision"] == usual_precision(
                method, get_gpu(option.gpu).native_bf16
            )


def test_decision_flow_estimates_lora_in_bf16_not_fp32_under_autocast():
    explorer = widgets.decision_flow_explorer("70B")
    lora = explorer.recommendation.best_per_method()["lora"]
    autocast = estimate(
        "70B",
        method="lora",
        precision="bf16-mixed",
        **{k: v for k, v in lora.settings.items() if k not in ("method", "precision")},
        device="cuda",
    )
    assert lora.settings["precision"] == "bf16"
    assert lora.peak_bytes < autocast.total_bytes
    assert f"{autocast.total_bytes / GiB:,.1f} GiB" not in explorer.readout.value
    assert f"{lora.peak_bytes / GiB:,.1f} GiB per GPU" in explorer.readout.value


@pytest.mark.parametrize("size", widgets.MODEL_SIZES)
def test_decision_flow_explorer_follows_the_guide(size):
    explorer = widgets.decision_flow_explorer()
    explorer.controls["size"].value = size
    for budget in ("Low", "High"):
        explorer.controls["budget"].value = budget
        assert explorer.error is None, explorer.error
        path = charts.decision_path(size, budget)
        assert explorer.path == path
        for key, artist in explorer.drawn["nodes"].items():
            assert charts.is_highlighted(artist) == (key in path)
        answer = widgets.GUIDE_ANSWERS.get(path[-1])
        assert (answer or "no branch") in explorer.readout.value
        assert explorer.controls["budget"].disabled == ("budget" not in path)
        note = flow_notes(explorer.recommendation.model).get(path[-1])
        if note:  # the guide's answer checked against the estimates
            assert html.escape(note) in explorer.readout.value


def test_importing_widgets_is_cheap():
    code = (
        "import sys, lessonkit.widgets; "
        "print(any(m in sys.modules for m in ('ipywidgets', 'matplotlib', 'torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _moved(explorer) -> None:
    """Move every control of an explorer away from where it started."""
    for widget in explorer.controls.values():
        options = (
            [v for _, v in widget.options]
            if hasattr(widget, "options")
            and widget.options
            and isinstance(widget.options[0], tuple)
            else list(getattr(widget, "options", []))
        )
        if options:
            widget.value = next(v for v in reversed(options) if v != widget.value)
        elif isinstance(widget.value, bool):
            widget.value = not widget.value
        else:
            widget.value = widget.max if widget.value != widget.max else widget.min


@pytest.mark.parametrize(
    "make",
    [
        widgets.vram_explorer,
        widgets.gpu_matrix_explorer,
        widgets.environment_explorer,
        widgets.decision_flow_explorer,
    ],
)
def test_reset_puts_every_control_back_with_one_redraw(make):
    explorer = make()
    start = (
        {k: w.value for k, w in explorer.controls.items()},
        explorer.readout.value,
        explorer.png(),
    )
    assert "lessonkit-button-reset" in explorer.reset_button._dom_classes
    assert any(explorer.reset_button in getattr(box, "children", ()) for box in explorer.children)
    _moved(explorer)
    assert explorer.readout.value != start[1]
    assert {k: w.value for k, w in explorer.controls.items()} != start[0]
    redraws = []
    original = explorer.redraw
    explorer.redraw = lambda: (redraws.append(1), original())
    explorer.reset_button.click()
    assert len(redraws) == 1
    assert {k: w.value for k, w in explorer.controls.items()} == start[0]
    assert explorer.readout.value == start[1] and explorer.png() == start[2]
    assert explorer.error is None
    # Control states that follow others (greyed-out rank, budget) are back too.
    if "lora_rank" in explorer.controls:
        assert explorer.controls["lora_rank"].disabled == (start[0]["method"] == "full")


def test_reset_starts_from_the_notebooks_settings_not_the_defaults():
    explorer = widgets.vram_explorer("13B", method="qlora", batch_size=8)
    explorer.controls["batch_size"].value = 1
    explorer.controls["method"].value = "full"  # moves precision too
    explorer.reset()
    values = {k: w.value for k, w in explorer.controls.items()}
    assert values["model"] == "13B" and values["method"] == "qlora" and values["batch_size"] == 8
    assert values["precision"] == usual_precision("qlora")


# ----- explorers that explain themselves --------------------------------------------------
def assert_chart_cleared(explorer) -> None:
    """No picture of the previous settings: the output says there is no chart, and so does
    the display bundle."""
    assert explorer.image.layout.display == "none" and explorer.no_chart.value == NO_CHART
    assert explorer.no_chart.layout.display != "none"
    assert "image/png" not in explorer.static_bundle()


def test_an_invalid_combination_clears_the_chart_and_shows_the_message(vram):
    vram.controls["method"].value = "qlora"
    vram.controls["n_gpus"].value = 8
    vram.controls["zero_stage"].value = 3  # ZeRO-3 cannot shard 4-bit weights
    assert "Cannot show this combination" in vram.readout.value and "ZeRO-3" in vram.readout.value
    assert_chart_cleared(vram)
    vram.controls["zero_stage"].value = 2  # valid again: the chart is back
    assert vram.error is None and vram.image.value == vram.png()
    assert vram.image.layout.display != "none" and vram.no_chart.layout.display == "none"
    check_vram_state(vram)


def test_the_no_fit_hint_follows_the_current_settings(vram):
    from lessonkit.widgets import advice

    def first_fix() -> str:
        found = advice.fixes(vram.report, vram.chart.largest_bytes, limit=1)
        assert found, vram.readout.value
        return re.sub(r" [(][^)]*[)]", "", found[0].words)

    vram.controls["model"].value = "70B"
    vram.controls["method"].value = "full"
    note = vram.chart.note.get_text().replace("\n", " ")
    assert f"Fits with {first_fix()}" in note and "Try " not in note
    vram.controls["gradient_checkpointing"].value = True
    assert first_fix() in vram.chart.note.get_text().replace("\n", " ")
    assert "with gradient checkpointing" not in vram.chart.note.get_text()  # already on
    vram.controls["method"].value = "lora"
    vram.controls["batch_size"].value = 64
    vram.controls["seq_len"].value = 2048  # beyond the catalog's largest GPU (288 GB)
    note = vram.chart.note.get_text().replace("\n", " ")
    assert first_fix() in note and "QLoRA" not in note
    vram.controls["n_gpus"].value = 8
    vram.controls["zero_stage"].value = 3
    note = vram.chart.note.get_text()
    assert not note or "ZeRO-3" not in note


def test_ddp_at_zero_0_says_why_the_per_gpu_peak_rises(vram):
    vram.controls["method"].value = "full"
    vram.controls["n_gpus"].value = 8
    vram.controls["zero_stage"].value = 0
    one = estimate("7B", **{**settings_of(vram), "n_gpus": 1})
    rise = vram.report.total_bytes - one.total_bytes
    assert rise > GiB
    text = vram.readout.value
    assert "gradient buckets" in text and "ZeRO" in text
    assert f"rises by {rise / GiB:,.1f} GiB" in text
    vram.controls["zero_stage"].value = 3
    assert "gradient buckets" not in vram.readout.value


def test_lora_target_modules_are_in_the_readout(vram):
    vram.controls["method"].value = "lora"
    targets = ", ".join(vram.report.settings["lora_targets"])
    assert f"LoRA rank {vram.controls['lora_rank'].value} on {targets}" in vram.readout.value
    vram.controls["method"].value = "full"
    assert "LoRA rank" not in vram.readout.value


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_the_y_axis_lets_lora_and_qlora_bars_be_read(vram, method):
    vram.controls["method"].value = method
    peak = vram.report.total_bytes / GiB
    top = vram.chart.ax.get_ylim()[1]
    assert peak / top > 0.3  # the bar fills a good part of the axis
    nearest = min(s for s, _ in vram.chart.lines if s >= peak)
    assert top >= nearest  # the nearest GPU line it fits under is on the chart
    shown = [t.get_text() for t in vram.chart.gpu_texts if t.get_visible()]
    assert shown  # and labelled


def gpu_labels_struck_through(chart) -> list[str]:
    """Visible GPU labels that a GPU line crosses (display coordinates)."""
    chart.ax.figure.canvas.draw()
    renderer = chart.ax.figure.canvas.get_renderer()
    bottom, top = chart.ax.get_ylim()
    struck = []
    for text in chart.gpu_texts:
        if not text.get_visible():
            continue
        box = text.get_window_extent(renderer)
        for size, _ in chart.lines:
            if bottom <= size <= top:
                y = chart.ax.transData.transform((0, size))[1]
                if box.y0 + 1 < y < box.y1 - 1:
                    struck.append(f"{text.get_text()} by the {size:.1f} GiB line")
    return struck


def test_gpu_reference_labels_are_never_struck_through_by_lines(vram):
    settings = [
        {},
        {"method": "lora"},
        {"method": "qlora"},
        {"batch_size": 64},
        {"model": "70B"},
        {"method": "lora", "seq_len": 8192},
        {"model": "1B", "method": "full", "seq_len": 512},
        {"model": "gpt2"},
    ]
    for change in settings:
        for name, value in change.items():
            vram.controls[name].value = value
        assert vram.error is None
        assert not gpu_labels_struck_through(vram.chart), change
        assert any(t.get_visible() for t in vram.chart.gpu_texts), change


def test_the_environment_chart_has_a_legend_of_its_tier_colours():
    from matplotlib.colors import to_hex

    explorer = widgets.environment_explorer("7B", method="qlora", tokens=1e7)
    legend = explorer.drawn["legend"]
    names = [t.get_text() for t in legend.get_texts()]
    assert set(names) == {r["tier"] for r in explorer.rows if r["tier"]}
    for name, patch in zip(names, legend.get_patches(), strict=True):
        assert to_hex(patch.get_facecolor()) == to_hex(palette.TIER_COLORS[name])
    for row, bar in zip(explorer.rows, explorer.drawn["bars"].patches, strict=True):
        assert to_hex(bar.get_facecolor()) == to_hex(palette.TIER_COLORS[row["tier"]])


def test_the_gpu_matrix_redraws_in_place_with_the_same_pixels_as_a_full_draw():
    import numpy as np
    from PIL import Image

    explorer = widgets.gpu_matrix_explorer("7B", method="lora")
    bars = explorer.drawn["bars"]
    changes = [
        ("batch_size", 8),
        ("method", "qlora"),
        ("gpu_set", "All 22 GPUs"),
        ("batch_size", 2),
        ("model", "70B"),
        ("method", "full"),
        ("gpu_set", "Guide's four"),
        ("seq_len", 4096),
        ("seq_len", 1024),
        ("model", "gpt2"),
    ]
    for name, value in changes:
        control = explorer.controls[name]
        if name == "gpu_set":
            value = next(o for o in control.options if o.startswith(value.split()[0]))
        control.value = value
        assert explorer.error is None, explorer.error
        shown = np.asarray(Image.open(io.BytesIO(explorer._png)).convert("RGB"))
        explorer.figure.canvas.draw()
        full = np.asarray(explorer.figure.canvas.buffer_rgba())[:, :, :3]
        assert shown.shape == full.shape and (shown == full).all(), (name, value)
        report = estimate(explorer.controls["model"].value, **settings_of(explorer))
        assert explorer.drawn["fits"] == [g.fits(report) for g in explorer.drawn["gpus"]]
    assert bars is not explorer.drawn["bars"]  # another GPU set was drawn afresh
    bars = explorer.drawn["bars"]
    explorer.controls["batch_size"].value = 4  # same GPUs: the same bars, changed in place
    assert explorer.drawn["bars"] is bars


def test_the_lora_dropout_control_reaches_the_estimate():
    explorer = widgets.vram_explorer("7B", method="lora", lora_targets="all-linear")
    dropout = explorer.controls["lora_dropout"]
    assert not dropout.disabled and dropout.value == 0.0
    dropout.value = 0.1
    kw = dict(method="lora", precision="bf16", lora_targets="all-linear")
    assert explorer.report.total_bytes == estimate("7B", lora_dropout=0.1, **kw).total_bytes
    assert explorer.report.total_bytes > estimate("7B", **kw).total_bytes
    explorer.controls["method"].value = "full"
    assert dropout.disabled


# ----- the memory savers of today's recipes -----------------------------------------------
def shown_peak(explorer) -> float:
    """The peak the readout shows, in GiB."""
    return float(
        re.search(r"Peak per GPU: ([\d,.]+) GiB", explorer.readout.value).group(1).replace(",", "")
    )


def tooltip(widget) -> str:
    """The hover text: ``tooltip`` in ipywidgets 8, ``description_tooltip`` in 7 (Colab)."""
    return widget.tooltip if widget.has_trait("tooltip") else widget.description_tooltip


SAVER_CASES = [  # (explorer's starting values, saver control, value that saves memory)
    (
        dict(model="7B", method="lora", batch_size=8, gradient_checkpointing=True),
        "activation_offload",
        True,
    ),
    (dict(model="7B", method="full"), "optimizer_in_backward", True),
    (dict(model="llama-3.1-8b", method="lora", batch_size=8), "loss", "chunked"),
]


@pytest.mark.parametrize(("start", "name", "value"), SAVER_CASES, ids=[c[1] for c in SAVER_CASES])
def test_each_memory_saver_lowers_the_peak_the_readout_shows(start, name, value):
    start = dict(start)
    explorer = widgets.vram_explorer(start.pop("model"), **start)
    before, title = shown_peak(explorer), explorer.chart.ax.get_title()
    assert "memory savers" not in explorer.readout.value
    control = explorer.controls[name]
    assert not control.disabled
    control.value = value
    assert explorer.error is None, explorer.error
    expected = estimate(explorer.controls["model"].value, **settings_of(explorer))
    assert expected.settings[name] == value  # the control reached the estimate
    assert explorer.report.total_bytes == expected.total_bytes
    assert shown_peak(explorer) == round(expected.total_bytes / GiB, 1) < before
    words = ", ".join(widgets.saver_words(expected.settings))
    assert words and f"memory savers: {words}" in explorer.readout.value
    assert explorer.chart.ax.get_title() != title  # the chart's title names the saver too
    check_vram_state(explorer)
    explorer.reset()
    assert shown_peak(explorer) == before and control.value == widgets.SETUP_DEFAULTS[name]


def test_activation_offload_follows_gradient_checkpointing():
    explorer = widgets.vram_explorer("7B", method="lora", batch_size=8)
    c = explorer.controls
    offload, checkpointing = c["activation_offload"], c["gradient_checkpointing"]
    assert offload.disabled and not offload.value
    assert offload.description == "Activation offload (needs checkpointing)"
    assert "Gradient checkpointing" in tooltip(offload)
    checkpointing.value = True
    assert not offload.disabled and offload.description == "Activation offload"
    assert "CPU memory" in tooltip(offload)
    checkpointed = shown_peak(explorer)
    offload.value = True
    assert shown_peak(explorer) < checkpointed
    # Turning checkpointing off unticks the offload: no error, the plain run's numbers.
    checkpointing.value = False
    assert explorer.error is None and not offload.value and offload.disabled
    assert explorer.report.total_bytes == estimate("7B", **settings_of(explorer)).total_bytes
    assert explorer.report.settings["activation_offload"] is False
    check_vram_state(explorer)
    # Set from code while greyed out: it counts as off, and unticks itself.
    offload.value = True
    assert explorer.error is None and not offload.value
    assert explorer.report.settings["activation_offload"] is False
    checkpointing.value = True
    assert not offload.disabled and not offload.value  # back on, the learner ticks it again


def test_activation_offload_gives_way_to_zero_3():
    explorer = widgets.vram_explorer(
        "7B", method="lora", gradient_checkpointing=True, activation_offload=True
    )
    c = explorer.controls
    c["n_gpus"].value = 8
    assert c["activation_offload"].value and explorer.error is None  # ZeRO-0 to 2 are fine
    c["zero_stage"].value = 3
    assert explorer.error is None and not c["activation_offload"].value
    assert "ZeRO-3" in c["activation_offload"].description
    check_vram_state(explorer)


def test_activation_offload_and_the_chunked_loss_together_where_they_are_modelled():
    # full fine-tuning, and LoRA/QLoRA in pure bf16 or under bf16-mixed, take both savers as
    # torchtune's recipes do
    for kw in (
        dict(method="full"),
        dict(method="lora", precision="bf16-mixed"),
        dict(method="lora"),
        dict(method="qlora"),
    ):
        explorer = widgets.vram_explorer(
            "7B", gradient_checkpointing=True, activation_offload=True, **kw
        )
        c = explorer.controls
        c["loss"].value = "chunked"
        assert explorer.error is None and c["activation_offload"].value, kw
        assert not c["activation_offload"].disabled
        assert explorer.report.settings["loss"] == "chunked"
        check_vram_state(explorer)


def test_optimizer_in_backward_is_greyed_where_estimate_refuses_it():
    explorer = widgets.vram_explorer("7B", optimizer_in_backward=True)
    c = explorer.controls
    oib = c["optimizer_in_backward"]
    assert oib.value and not oib.disabled
    c["n_gpus"].value = 2
    assert explorer.error is None and not oib.value and oib.disabled
    assert oib.description == "Optimizer step in backward (one GPU only)"
    assert "one GPU" in tooltip(oib)
    check_vram_state(explorer)
    c["n_gpus"].value = 1
    assert not oib.disabled and not oib.value
    # Fixed settings that rule it out grey it out for good.
    for fixed, reason in (
        (dict(gradient_accumulation=4), "not with accumulation"),
        (dict(offload_optimizer=True, zero_stage=1), "not with optimizer offload"),
    ):
        explorer = widgets.vram_explorer("7B", **fixed)
        oib = explorer.controls["optimizer_in_backward"]
        assert oib.disabled and oib.description.endswith(f"({reason})")
        oib.value = True  # from code: still off, never an error
        assert explorer.error is None and not oib.value


def test_memory_saver_rules_agree_with_estimate():
    """A saver is greyed out exactly where estimate() refuses it (given that the rest of the
    setup is valid)."""
    import itertools

    from lessonkit.widgets.controls import saver_blocked

    grid = itertools.product(
        ("full", "lora", "qlora"),
        (False, True),
        ("standard", "chunked"),
        ((1, 0), (2, 0), (8, 2), (8, 3)),
        (1, 2),
        (False, True),
        ("current", "before-0.43.2"),
    )
    checked = {"activation_offload": [0, 0], "optimizer_in_backward": [0, 0]}
    for method, ckpt, loss, (gpus, zero), accumulation, offload_opt, bnb in grid:
        kw = dict(
            method=method,
            precision="bf16",
            gradient_checkpointing=ckpt,
            loss=loss,
            n_gpus=gpus,
            zero_stage=zero,
            gradient_accumulation=accumulation,
            offload_optimizer=offload_opt,
            bitsandbytes=bnb,
        )
        try:
            estimate("7B", **kw)
        except LessonkitError:
            continue  # the rest of the setup is refused already
        for name in checked:
            try:
                estimate("7B", **kw, **{name: True})
                refused = False
            except LessonkitError:
                refused = True
            assert (saver_blocked(name, kw) is not None) == refused, (name, kw)
            checked[name][refused] += 1
    assert all(allowed and refused for allowed, refused in checked.values()), checked


def test_memory_savers_as_starting_values():
    explorer = widgets.vram_explorer(
        "7B",
        method="lora",
        gradient_checkpointing=True,
        activation_offload=True,
        optimizer_in_backward=True,
    )
    c = explorer.controls
    assert c["activation_offload"].value and c["optimizer_in_backward"].value
    expected = estimate("7B", **settings_of(explorer))
    assert expected.settings["activation_offload"] and expected.settings["optimizer_in_backward"]
    assert explorer.report.total_bytes == expected.total_bytes
    explorer = widgets.vram_explorer("llama-3.1-8b", loss="chunked", loss_chunks=16)
    assert explorer.controls["loss"].value == "chunked"
    assert explorer.report.settings["loss_chunks"] == 16
    assert "chunked cross-entropy (16 chunks)" in explorer.readout.value
    # A fixed chunk count waits for the chunked loss: standard still shows, no error.
    explorer = widgets.vram_explorer("7B", loss_chunks=16)
    assert explorer.error is None and explorer.report.settings["loss"] == "standard"
    explorer.controls["loss"].value = "chunked"
    assert explorer.report.settings["loss_chunks"] == 16


def test_the_longest_chart_titles_stay_on_the_figure():
    from lessonkit.options import OPTIMIZERS

    longest = dict(
        model="70B",
        precision="fp16-mixed",
        optimizer=max(OPTIMIZERS, key=len),
        batch_size=64,
        seq_len=32768,
        gradient_checkpointing=True,
    )
    for kw in (
        dict(method="qlora", activation_offload=True, n_gpus=8, zero_stage=2),
        dict(method="full", optimizer_in_backward=True, loss="chunked"),
    ):
        explorer = widgets.vram_explorer(**longest, **kw)
        assert explorer.error is None
        title = explorer.chart.ax.title
        assert "offload" in title.get_text() or "chunked loss" in title.get_text()
        explorer.figure.canvas.draw()
        box = title.get_window_extent(explorer.figure.canvas.get_renderer())
        assert box.x0 >= 0 and box.x1 <= explorer.figure.bbox.width, (title.get_text(), box)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            dict(activation_offload=True),
            r"activation_offload=True cannot be a starting value here "
            r"\(needs checkpointing\).*gradient_checkpointing=True",
        ),
        (
            dict(activation_offload=True, gradient_checkpointing=True, zero_stage=3, n_gpus=2),
            "not with ZeRO-3",
        ),
        (dict(optimizer_in_backward=True, n_gpus=2), r"\(one GPU only\).*n_gpus=1"),
        (dict(optimizer_in_backward=True, gradient_accumulation=2), "gradient_accumulation=1"),
        (dict(activation_offload="yes"), "Activation offload must be True or False, got 'yes'"),
        (dict(optimizer_in_backward=1), "Optimizer step in backward must be True or False"),
        (dict(loss="fused"), "Loss 'fused' is not on the control; allowed: standard, chunked"),
        (dict(loss="chunked", loss_chunks=0), "Chunks 0 is not on the control; allowed: 1, 2, 4"),
        (dict(loss="chunked", loss_chunks=True), "Chunks True is not on the control"),
        (dict(loss="chunked", loss_chunks=3), "Chunks 3 is not on the control"),
    ],
)
def test_bad_memory_saver_starting_values_are_clear_errors(kw, message):
    with pytest.raises(LessonkitError, match=message):
        widgets.vram_explorer("7B", **kw)


def shown_and_full(explorer):
    """The picture the last redraw showed, and a full draw of the same figure (RGB arrays)."""
    import numpy as np
    from PIL import Image

    shown = np.asarray(Image.open(io.BytesIO(explorer._png)).convert("RGB"))
    explorer.figure.canvas.draw()
    full = np.asarray(explorer.figure.canvas.buffer_rgba())[:, :, :3].copy()
    return shown, full


def png_pixels(png: bytes):
    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def test_the_environment_explorer_redraws_in_place_with_the_same_pixels_as_a_new_chart():
    explorer = widgets.environment_explorer("7B", method="lora")
    bars = explorer.drawn["bars"]
    changes = [
        ("batch_size", 16),
        ("method", "qlora"),
        ("tokens", 1e9),
        ("model", "70B"),
        ("method", "full"),
        ("seq_len", 4096),
        ("seq_len", 512),
        ("model", "gpt2"),
        ("batch_size", 1),
        ("method", "lora"),
        ("model", "7B"),
        ("tokens", 1e7),
    ]
    possible = set()
    for name, value in changes:
        explorer.controls[name].value = value
        assert explorer.error is None, explorer.error
        shown, full = shown_and_full(explorer)
        assert shown.shape == full.shape and (shown == full).all(), (name, value)
        # The same settings drawn from scratch on a new figure: the same picture.
        c = {k: w.value for k, w in explorer.controls.items()}
        fresh = widgets.environment_explorer(c.pop("model"), **c)
        assert (png_pixels(fresh._png) == shown).all(), (name, value)
        assert explorer.drawn["bars"] is bars  # the same environments: changed in place
        possible.add(tuple(r["cost"] is not None for r in explorer.rows))
    assert len(possible) > 2  # environments became possible and impossible again


def test_the_decision_flow_redraws_in_place_with_the_same_pixels_as_a_new_chart():
    explorer = widgets.decision_flow_explorer("7B", "Low")
    nodes = explorer.drawn["nodes"]
    changes = [
        ("budget", "High"),
        ("size", "70B"),
        ("size", "13B"),
        ("size", "8B"),
        ("budget", "Low"),
        ("size", "70B"),
        ("size", "7B"),
        ("budget", "High"),
    ]
    paths = set()
    for name, value in changes:
        explorer.controls[name].value = value
        assert explorer.error is None, explorer.error
        shown, full = shown_and_full(explorer)
        assert (shown == full).all(), (name, value)
        fresh = widgets.decision_flow_explorer(
            explorer.controls["size"].value, explorer.controls["budget"].value
        )
        assert (png_pixels(fresh._png) == shown).all(), (name, value)
        assert explorer.drawn["nodes"] is nodes
        paths.add(tuple(explorer.path))
    assert len(paths) == 4


def test_going_back_to_an_earlier_setting_reuses_its_saved_picture_with_the_same_pixels(vram):
    from lessonkit.widgets.explorer import SAVED_BACKGROUNDS

    methods = ["full", "lora", "qlora"]
    changes = (
        [("method", m) for m in methods * 2]
        + [("model", m) for m in ("0.5B", "1B", "3B", "8B", "13B", "34B", "70B", "gpt2", "7B")]
        + [("method", m) for m in methods]
    )
    for name, value in changes:
        vram.controls[name].value = value
        assert vram.error is None, vram.error
        shown, full = shown_and_full(vram)
        assert (shown == full).all(), (name, value)
        assert len(vram._backgrounds) <= SAVED_BACKGROUNDS
    # Back to a method seen before: its picture of the axes is reused, not drawn again.
    drawn = []
    vram.figure.axes[0].draw = lambda renderer: drawn.append(renderer)
    vram.controls["method"].value = "lora"
    vram.controls["method"].value = "qlora"
    assert drawn == [] and vram.error is None


def test_the_environment_explorer_puts_back_saved_rows_with_the_same_pixels():
    explorer = widgets.environment_explorer("7B", method="lora")
    for value in (8, 4, 8, 12, 2, 8):
        explorer.controls["batch_size"].value = value
        assert explorer.error is None, explorer.error
        shown, full = shown_and_full(explorer)
        assert (shown == full).all(), value
    # Every row of batch 8 was painted before under the same axes: no label is drawn again.
    drawn = []
    for label in explorer.drawn["labels"]:
        label.draw = lambda renderer, label=label: drawn.append(label)
    explorer.controls["batch_size"].value = 4
    explorer.controls["batch_size"].value = 8
    assert drawn == [] and explorer.error is None
    for label in explorer.drawn["labels"]:
        del label.draw
    explorer.controls["tokens"].value = 1e6  # every row's time changes: drawn again
    shown, full = shown_and_full(explorer)
    assert (shown == full).all()
    assert "$" in explorer.drawn["labels"][0].get_text()


def test_the_vram_note_stays_in_the_saved_picture_when_nothing_live_overlaps_it():
    explorer = widgets.vram_explorer("7B", method="lora", batch_size=64)
    seen = set()
    for method in ["full", "lora", "qlora"] * 2 + ["full"]:
        explorer.controls["method"].value = method
        assert explorer.error is None, explorer.error
        shown, full = shown_and_full(explorer)
        assert (shown == full).all(), method
        note = explorer.chart.note
        seen.add((bool(note.get_text()), note in explorer.chart.live_artists()))
    assert (True, False) in seen  # a note, kept in the saved picture
    # A note the bars reach is drawn live, over them, as in a full draw.
    for size in ("70B", "34B", "13B"):
        explorer.controls["model"].value = size
        shown, full = shown_and_full(explorer)
        assert (shown == full).all(), size


def test_the_chunk_count_follows_the_loss_and_reaches_the_estimate():
    """Chunks is greyed out until the loss is chunked; more chunks, a smaller fp32 piece of
    the logits at a time (a 128k vocabulary makes it visible)."""
    explorer = widgets.vram_explorer("llama-3.1-8b", method="lora", batch_size=8)
    chunks, loss = explorer.controls["loss_chunks"], explorer.controls["loss"]
    assert chunks.disabled and explorer.report.settings["loss"] == "standard"
    assert "chunked cross-entropy" not in explorer.readout.value
    loss.value = "chunked"
    assert not chunks.disabled
    peaks = {}
    for n in (1, 8, 32):
        chunks.value = n
        assert explorer.error is None
        expected = estimate("llama-3.1-8b", **settings_of(explorer))
        assert expected.settings["loss_chunks"] == n
        assert explorer.report.total_bytes == expected.total_bytes
        assert f"chunked cross-entropy ({n} chunks)" in explorer.readout.value
        peaks[n] = explorer.report.total_bytes
    assert peaks[1] > peaks[8] > peaks[32]
    loss.value = "standard"  # the chosen count waits, greyed out, without an error
    assert chunks.disabled and explorer.error is None and chunks.value == 32
    assert explorer.report.settings["loss"] == "standard"


def test_a_fixed_no_sync_is_named_and_applies_where_estimate_takes_it():
    explorer = widgets.vram_explorer(
        "7B", no_sync=True, n_gpus=4, zero_stage=3, gradient_accumulation=2
    )
    kept = explorer.report
    assert kept.settings["no_sync"] and "no_sync" in explorer.readout.value
    assert "2 micro-batches with no_sync" in explorer.chart.ax.title.get_text()
    synced = estimate("7B", n_gpus=4, zero_stage=3, gradient_accumulation=2)
    assert kept.total_bytes > synced.total_bytes
    for change in (dict(n_gpus=1), dict(zero_stage=2)):  # where estimate refuses it
        for name, value in change.items():
            explorer.controls[name].value = value
        assert explorer.error is None and not explorer.report.settings["no_sync"]
        assert "no_sync" not in explorer.readout.value
        explorer.controls["n_gpus"].value, explorer.controls["zero_stage"].value = 4, 3
    assert explorer.report.total_bytes == kept.total_bytes
