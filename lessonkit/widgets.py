"""Live explorers for the notebooks, built with core ipywidgets on the charts in charts.py.

Each explorer returns an ``Explorer`` (an ipywidgets VBox) with ``.controls`` (name -> widget),
``.readout`` (an HTML widget), ``.output`` (the chart), ``.figure`` and ``.redraw()``.

Redrawing: one matplotlib Figure per explorer is reused; a change updates its artists (bar
heights, texts, limits), renders it to PNG and replaces the contents of one ``Output`` widget of
fixed height in a single step (what ``clear_output(wait=True)`` followed by ``display(fig)``
does), so the page neither flickers nor jumps. ipympl is not used (it does not work on Colab).
The memory calculator repaints only its bars and their labels over a saved picture of the rest
while the axes stay the same (same pixels as a full draw; ``benchmarks/redraw.py`` times it).
A control that moves another (a method brings its usual precision) redraws once.
A callback never raises: a failing estimate is shown as a message in the readout.

Where no widget frontend exists: displaying an explorer puts a PNG of its current chart in the
same output as the widget view. JupyterLab, Colab, Kaggle and VS Code show the live widget;
GitHub's viewer, nbconvert without widget state and an untrusted reopened notebook show the PNG.
With the environment variable ``LESSONKIT_STATIC=1`` (e.g. for papermill or nbval runs)
explorers display only the PNG and the readout text.

CSS classes, for browser tests and styling:
  - every explorer: ``lessonkit-explorer`` plus ``lessonkit-vram-explorer``,
    ``lessonkit-gpu-matrix-explorer``, ``lessonkit-environment-explorer`` or
    ``lessonkit-decision-flow-explorer``;
  - the text readout: ``lessonkit-readout``; the chart's Output: ``lessonkit-chart``;
  - each control: ``lessonkit-<kind>-<name>``, kind being slider, dropdown, toggle or checkbox:
    ``lessonkit-dropdown-model``, ``lessonkit-toggle-method``, ``lessonkit-dropdown-precision``,
    ``lessonkit-dropdown-optimizer``, ``lessonkit-slider-batch``, ``lessonkit-slider-seq``,
    ``lessonkit-slider-rank``, ``lessonkit-checkbox-checkpointing``, ``lessonkit-slider-gpus``,
    ``lessonkit-dropdown-zero``, ``lessonkit-toggle-gpu-set``, ``lessonkit-slider-tokens``,
    ``lessonkit-dropdown-size``, ``lessonkit-toggle-budget``.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
from typing import Any, Callable

from . import charts
from .errors import LessonkitError
from .fitting import method_label, usual_precision
from .options import METHODS, OPTIMIZERS, PRECISIONS, ZERO_STAGES
from .units import GB, GiB

MODEL_SIZES = ("0.5B", "1B", "3B", "7B", "8B", "13B", "34B", "70B")
SEQ_LENS = tuple(2**k for k in range(7, 16))          # 128 .. 32768
LORA_RANKS = tuple(2**k for k in range(0, 9))         # 1 .. 256
GPU_COUNTS = (1, 2, 4, 8)
TOKEN_COUNTS = (1e6, 1e7, 1e8, 1e9)
# Estimate keyword -> (CSS name, label) of its control.
CONTROL_NAMES = {
    "model": ("model", "Model"), "method": ("method", "Method"),
    "precision": ("precision", "Precision"), "optimizer": ("optimizer", "Optimizer"),
    "batch_size": ("batch", "Batch size"), "seq_len": ("seq", "Sequence length"),
    "lora_rank": ("rank", "LoRA rank"), "gradient_checkpointing": ("checkpointing",
                                                                  "Gradient checkpointing"),
    "n_gpus": ("gpus", "GPUs"), "zero_stage": ("zero", "ZeRO stage"),
    "gpu_set": ("gpu-set", "GPUs shown"), "tokens": ("tokens", "Training tokens"),
    "size": ("size", "Model size"), "budget": ("budget", "Budget"),
}
CHART_DPI = 100


def static_mode() -> bool:
    """True when explorers should display a plain picture only (LESSONKIT_STATIC=1)."""
    return os.environ.get("LESSONKIT_STATIC", "").strip().lower() in ("1", "true", "yes", "on")


def _estimate(model: Any, **settings: Any) -> Any:
    from .fitting import estimate_cached

    return estimate_cached(model, **settings)


def _error_html(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, LessonkitError) else f"{type(exc).__name__}: {exc}"
    return (f"<div style='color:#B22222'><b>Cannot show this combination.</b> "
            f"{html.escape(text)}</div>")


# ----- the explorer container --------------------------------------------------------------
_EXPLORER_CLASS: Any = None


def _explorer_class() -> Any:
    """The Explorer class (defined on first use, so importing this module needs no ipywidgets)."""
    global _EXPLORER_CLASS
    if _EXPLORER_CLASS is not None:
        return _EXPLORER_CLASS
    import ipywidgets as W

    class Explorer(W.VBox):
        """Controls, a text readout and a chart that redraws in place when a control changes."""

        def __init__(self, kind: str, controls: dict[str, Any], update: Callable[[Any], str],
                     figure: Any, layout_rows: list[list[str]],
                     static_key: Callable[[], Any] | None = None,
                     live: Callable[[], list[Any]] | None = None,
                     link: Callable[[Any], None] | None = None, **attributes: Any) -> None:
            for key, value in attributes.items():
                setattr(self, key, value)
            self.controls = controls
            self.figure = figure
            self._update = update
            self.readout = W.HTML(layout=W.Layout(min_height="3.2em"))
            self.readout.add_class("lessonkit-readout")
            width, height = (int(v * CHART_DPI) for v in figure.get_size_inches())
            self.output = W.Output(layout=W.Layout(height=f"{height + 8}px",
                                                   width=f"{width + 8}px", overflow="hidden"))
            self.output.add_class("lessonkit-chart")
            self.error: BaseException | None = None
            self._png = b""
            self._static_key = static_key if live is not None else None
            self._live = live
            self._link = link
            self._linking = False
            self._background: Any = None
            self._frame: Any = None
            self._background_key: Any = None
            boxes = [W.HBox([controls[n] for n in row if n in controls])
                     for row in layout_rows]
            super().__init__([*boxes, self.readout, self.output])
            self.add_class("lessonkit-explorer")
            self.add_class(f"lessonkit-{kind}-explorer")
            for control in controls.values():
                control.observe(self._on_change, names="value")
            self.redraw()

        def _on_change(self, change: Any) -> None:
            # A change that moves other controls (``link``) redraws once, after all of them.
            if self._linking:
                return
            if self._link is not None:
                self._linking = True
                try:
                    self._link(change)
                except Exception as exc:  # shown, never raised
                    self.error = exc
                    self.readout.value = _error_html(exc)
                    return
                finally:
                    self._linking = False
            self.redraw()

        def redraw(self) -> None:
            """Recompute, update the chart's artists and show the new picture; never raises."""
            try:
                readout = self._update(self)
                png = self.png()
            except Exception as exc:  # a callback must not raise in front of a class
                self.error = exc
                self.readout.value = _error_html(exc)
                return
            self.error = None
            self.readout.value = readout
            self._png = png
            data = {"image/png": base64.b64encode(png).decode("ascii"),
                    "text/plain": "<lessonkit chart>"}
            self.output.outputs = ({"output_type": "display_data", "data": data,
                                    "metadata": {}},)

        def png(self) -> bytes:
            """The figure as it is now, as PNG bytes."""
            canvas = self.figure.canvas
            key = self._static_key() if self._static_key is not None else None
            if key is None:
                canvas.draw()
            else:
                # Paint only the live artists over a saved picture of everything else. That
                # picture is taken again when the key says the axes changed (limits, labels),
                # over a saved picture of the figure without its axes (the legend), which is
                # taken again when the legend changes (key[0]).
                live = self._live()
                if self._background is None or key != self._background_key:
                    if self._frame is None or key[0] != self._background_key[0]:
                        for ax in self.figure.axes:
                            ax.set_visible(False)
                        try:
                            canvas.draw()
                        finally:
                            for ax in self.figure.axes:
                                ax.set_visible(True)
                        self._frame = canvas.copy_from_bbox(self.figure.bbox)
                    canvas.restore_region(self._frame)
                    renderer = canvas.get_renderer()
                    for artist in live:
                        artist.set_animated(True)  # left out of the axes' draw
                    try:
                        for ax in self.figure.axes:
                            ax.draw(renderer)
                    finally:
                        for artist in live:
                            artist.set_animated(False)
                    self._background = canvas.copy_from_bbox(self.figure.bbox)
                    self._background_key = key
                canvas.restore_region(self._background)
                renderer = canvas.get_renderer()
                for artist in live:
                    artist.draw(renderer)
            from PIL import Image

            width, height = canvas.get_width_height()
            image = Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw",
                                     "RGBA", 0, 1)
            if self.figure.get_facecolor()[3] == 1:  # opaque: RGB is the same picture, smaller
                image = image.convert("RGB")
            buffer = io.BytesIO()
            image.save(buffer, format="png", compress_level=1)
            return buffer.getvalue()

        def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
            bundle = super()._repr_mimebundle_(**kwargs) or {}
            bundle["image/png"] = base64.b64encode(self._png or self.png()).decode("ascii")
            if static_mode():
                bundle.pop("application/vnd.jupyter.widget-view+json", None)
                bundle["text/plain"] = _plain_text(self.readout.value)
            return bundle

    _EXPLORER_CLASS = Explorer
    return Explorer


def _plain_text(markup: str) -> str:
    import re

    return html.unescape(re.sub(r"<br\s*/?>", "\n", re.sub(r"<(?!br)[^>]+>", "", markup)))


def _figure(width: float, height: float, **adjust: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=CHART_DPI)
    FigureCanvasAgg(fig)
    fig.subplots_adjust(**adjust)
    return fig


# ----- controls ----------------------------------------------------------------------------
def _control(name: str, value: Any, continuous: bool) -> Any:
    import ipywidgets as W

    css, label = CONTROL_NAMES[name]
    style = {"description_width": "initial"}
    layout = W.Layout(width="auto")
    if name == "model":
        options = [(m, m) for m in MODEL_SIZES]
        from .models import preset_names
        options += [(p, p) for p in preset_names()]
        if value not in [v for _, v in options]:
            from .models import resolve_model
            options.insert(0, (resolve_model(value).name, value))
        widget, kind = W.Dropdown(options=options, value=value, description=label,
                                  style=style), "dropdown"
    elif name == "method":
        widget, kind = W.ToggleButtons(options=list(METHODS), value=value, description=label,
                                       style={**style, "button_width": "5.5em"}), "toggle"
    elif name in ("precision", "optimizer", "zero_stage"):
        options = {"precision": PRECISIONS, "optimizer": OPTIMIZERS, "zero_stage": ZERO_STAGES}
        widget, kind = W.Dropdown(options=list(options[name]), value=value, description=label,
                                  style=style, layout=layout), "dropdown"
    elif name == "batch_size":
        widget, kind = W.IntSlider(value=value, min=1, max=64, description=label, style=style,
                                   continuous_update=continuous), "slider"
    elif name in ("seq_len", "lora_rank", "n_gpus", "tokens"):
        options = {"seq_len": SEQ_LENS, "lora_rank": LORA_RANKS, "n_gpus": GPU_COUNTS,
                   "tokens": TOKEN_COUNTS}[name]
        pairs = [(f"{v / 1e6:g}M" if name == "tokens" else str(v), v) for v in options]
        widget, kind = W.SelectionSlider(options=pairs, value=value, description=label,
                                         style=style, continuous_update=continuous), "slider"
    elif name == "gradient_checkpointing":
        widget, kind = W.Checkbox(value=bool(value), description=label, indent=False,
                                  layout=layout), "checkbox"
    elif name == "gpu_set":
        widget, kind = W.ToggleButtons(options=["Guide's four", "All"], value=value,
                                       description=label, style=style), "toggle"
    elif name == "size":
        widget, kind = W.Dropdown(options=list(MODEL_SIZES), value=value, description=label,
                                  style=style, layout=layout), "dropdown"
    else:  # budget
        widget, kind = W.ToggleButtons(options=["Low", "High"], value=value, description=label,
                                       style=style), "toggle"
    widget.add_class(f"lessonkit-{kind}-{css}")
    return widget


_ALLOWED = {  # allowed values of each control, for clear errors on bad defaults
    "method": METHODS, "precision": PRECISIONS, "optimizer": OPTIMIZERS,
    "zero_stage": ZERO_STAGES, "seq_len": SEQ_LENS, "lora_rank": LORA_RANKS,
    "n_gpus": GPU_COUNTS, "tokens": TOKEN_COUNTS, "size": MODEL_SIZES,
    "budget": ("Low", "High"), "gpu_set": ("Guide's four", "All"),
}
SETUP_DEFAULTS = {  # estimate()'s own defaults, so an explorer starts where estimate() does
    "method": "full", "precision": "bf16-mixed", "optimizer": "adamw", "batch_size": 1,
    "seq_len": 512, "lora_rank": 16, "gradient_checkpointing": False, "n_gpus": 1,
    "zero_stage": 0,
}


def _controls(names: list[str], values: dict[str, Any], continuous: bool) -> dict[str, Any]:
    controls = {}
    for name in names:
        value = values[name]
        allowed = _ALLOWED.get(name)
        if allowed is not None and value not in allowed:
            raise LessonkitError(f"{CONTROL_NAMES[name][1]} {value!r} is not on the control; "
                                 f"allowed: {', '.join(map(str, allowed))}.")
        if name == "batch_size" and not (isinstance(value, int) and 1 <= value <= 64):
            raise LessonkitError(f"Batch size must be a whole number from 1 to 64, got {value!r}.")
        controls[name] = _control(name, value, continuous)
    return controls


def _split_defaults(names: list[str], model: Any, defaults: dict[str, Any]
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Values for the controls, and the fixed estimate settings passed through unchanged."""
    import inspect

    from .vram import estimate

    known = set(inspect.signature(estimate).parameters) - {"model"}
    values = {**SETUP_DEFAULTS, "model": model}
    fixed = {}
    for key, value in defaults.items():
        if key in names:
            values[key] = value
        elif key in known:
            fixed[key] = value
        else:
            raise LessonkitError(f"Unknown setting {key!r}; the explorer takes "
                                 f"{', '.join(sorted(set(names) | known))}.")
    if "precision" in names and "precision" not in defaults and values["method"] in METHODS:
        values["precision"] = usual_precision(values["method"])
    return values, fixed


def _precision_follows_method(controls: dict[str, Any]) -> Callable[[Any], None]:
    """A link: choosing a method moves precision to that method's usual one (the student can
    change it afterwards)."""
    def link(change: Any) -> None:
        if change["owner"] is controls["method"] and "precision" in controls:
            controls["precision"].value = usual_precision(change["new"])
    return link


def _settings(controls: dict[str, Any], fixed: dict[str, Any]) -> dict[str, Any]:
    settings = {k: w.value for k, w in controls.items() if k in SETUP_DEFAULTS}
    if "lora_targets" not in fixed and "model" in controls:
        from .models import resolve_model

        # GPT-2 names its attention projection c_attn (peft's default target for it).
        if resolve_model(controls["model"].value).family == "gpt2":
            settings["lora_targets"] = ("c_attn",)
    return {**settings, **fixed}


def _sync_enabled(controls: dict[str, Any]) -> None:
    if "lora_rank" in controls:
        controls["lora_rank"].disabled = controls["method"].value == "full"
    if "zero_stage" in controls and "n_gpus" in controls:
        controls["zero_stage"].disabled = controls["n_gpus"].value == 1


def peak_html(report: Any) -> str:
    total = report.total_bytes
    return (f"<b>Peak per GPU: {total / GB:,.1f} GB</b> ({total / GiB:,.1f} GiB, during the "
            f"{html.escape(str(report.peak_phase))})")


# What each precision keeps in which dtype; LoRA and QLoRA name their frozen base weights.
PRECISION_WORDS = {
    "fp32": "everything in fp32", "bf16-mixed": "fp32 weights, bf16 autocast",
    "fp16-mixed": "fp32 weights, fp16 autocast", "bf16": "bf16 weights",
    "bf16-master": "bf16 weights, fp32 master copy",
}


def precision_words(settings: dict[str, Any]) -> str:
    """E.g. 'bf16 base weights, fp32 adapters' for LoRA in precision 'bf16'."""
    precision, method = settings.get("precision", ""), settings.get("method", "")
    words = PRECISION_WORDS.get(precision, str(precision))
    if method == "qlora":
        compute = {"fp32": "fp32", "fp16-mixed": "fp16"}.get(precision, "bf16")
        words = f"4-bit NF4 base weights, {compute} compute"
    elif method == "lora":
        words = words.replace("fp32 weights", "fp32 base weights").replace(
            "bf16 weights", "bf16 base weights").replace("everything", "base weights")
    if method in ("lora", "qlora"):
        words += f", {settings.get('lora_dtype', 'fp32')} adapters"
    return words


def setup_html(report: Any) -> str:
    """HTML: method, precision (in words) and optimizer of the estimate shown."""
    s = report.settings
    return (f"{html.escape(str(s.get('method')))}, precision "
            f"<b>{html.escape(str(s.get('precision')))}</b> "
            f"({html.escape(precision_words(s))}), {html.escape(str(s.get('optimizer')))}")


def fit_summary(report: Any, gpus: list[Any] | None = None) -> str:
    """HTML: the peak per GPU, the setup, and the catalog GPUs it fits on (smallest first)."""
    where = "in the catalog" if gpus is None else "shown"
    gpus = charts.catalog_gpus() if gpus is None else gpus
    head = f"{peak_html(report)}<br>Setup: {setup_html(report)}"
    if not gpus:
        sizes = [s for s in charts.COMMON_GPU_SIZES_GB if report.fits(s * GB)]
        fits = f"Fits in {sizes[0]:g} GB and larger" if sizes else \
            "<b>Does not fit on any single GPU size shown</b>"
        return f"{head}.<br>{fits}."
    ordered = sorted(gpus, key=lambda g: (charts.gpu_usable_bytes(g), charts.gpu_label(g)))
    fit = [g for g in ordered if charts.gpu_fits(g, report)]
    if not fit:
        biggest = ordered[-1]
        return (f"{head}.<br><b style='color:#B22222'>Does not fit on any single GPU</b> {where} "
                f"(largest: {html.escape(charts.gpu_label(biggest))}, "
                f"{charts.gpu_usable_bytes(biggest) / GB:.0f} GB usable).")
    names = ", ".join(html.escape(charts.gpu_label(g)) for g in fit)
    return f"{head}.<br>Fits on {len(fit)} of {len(gpus)} GPUs: {names}."


# ----- the explorers -----------------------------------------------------------------------
VRAM_CONTROLS = ["model", "method", "precision", "optimizer", "batch_size", "seq_len",
                 "lora_rank", "gradient_checkpointing", "n_gpus", "zero_stage"]


def vram_explorer(model: Any = "7B", *, continuous_update: bool = False, **defaults: Any) -> Any:
    """Sliders and menus for a training setup driving a live stacked bar of its peak memory.

    ``defaults`` set the controls' starting values (e.g. ``method="full"``, ``batch_size=4``);
    other ``estimate`` keywords (e.g. ``attention="eager"``) are passed through unchanged.
    Precision starts at, and follows, the method's usual one (``fitting.usual_precision``:
    bf16-mixed for full fine-tuning, bf16 for LoRA and QLoRA) unless chosen afterwards.
    """
    values, fixed = _split_defaults(VRAM_CONTROLS, model, defaults)
    controls = _controls(VRAM_CONTROLS, values, continuous_update)
    figure = _figure(7.5, 3.6, left=0.1, right=0.77, bottom=0.2, top=0.9)
    chart = charts.BreakdownChart(figure.add_subplot())

    def update(explorer: Any) -> str:
        _sync_enabled(controls)
        report = _estimate(controls["model"].value, **_settings(controls, fixed))
        explorer.chart.update(report)
        explorer.report = report
        return fit_summary(report)

    return _explorer_class()(
        "vram", controls, update, figure,
        [["model", "method"], ["precision", "optimizer"], ["batch_size", "seq_len"],
         ["lora_rank", "gradient_checkpointing"], ["n_gpus", "zero_stage"]],
        static_key=chart.static_key, live=chart.live_artists,
        link=_precision_follows_method(controls),
        chart=chart, report=None)


SETUP_CONTROLS = ["model", "method", "precision", "optimizer", "batch_size", "seq_len",
                  "lora_rank", "gradient_checkpointing"]


def gpu_matrix_explorer(model: Any = "7B", gpus: list[Any] | None = None, *,
                        continuous_update: bool = False, **defaults: Any) -> Any:
    """Choose a setup and see which GPUs of the catalog fit it (``charts.draw_gpu_fit``).

    ``gpus`` (names or records) fixes the GPUs shown; otherwise a toggle switches between the
    guide's four GPUs and the whole catalog.
    """
    from .gpus import get_gpu, list_gpus

    fixed_gpus = None if gpus is None else [get_gpu(g) for g in gpus]
    names = SETUP_CONTROLS + ([] if fixed_gpus is not None else ["gpu_set"])
    values, fixed = _split_defaults(names, model, {"gpu_set": "Guide's four", **defaults}
                                    if fixed_gpus is None else defaults)
    controls = _controls(names, values, continuous_update)
    figure = _figure(7.5, 4.6, left=0.26, right=0.97, bottom=0.12, top=0.86)
    ax = figure.add_subplot()

    def update(explorer: Any) -> str:
        _sync_enabled(controls)
        report = _estimate(controls["model"].value, **_settings(controls, fixed))
        shown = fixed_gpus if fixed_gpus is not None else list_gpus(
            in_guide=True if controls["gpu_set"].value == "Guide's four" else None)
        ax.clear()
        explorer.drawn = charts.draw_gpu_fit(ax, report, shown)
        explorer.report = report
        return fit_summary(report, shown)

    return _explorer_class()(
        "gpu-matrix", controls, update, figure,
        [["model", "method"], ["precision", "optimizer"], ["batch_size", "seq_len"],
         ["lora_rank", "gradient_checkpointing"], ["gpu_set"]],
        link=_precision_follows_method(controls), report=None, drawn=None)


def environment_rows(recommendation: Any) -> list[dict[str, Any]]:
    """One row per environment: its cheapest setup that fits in ``recommend``'s ranking."""
    from .environments import list_environments

    best: dict[str, Any] = {}
    for option in recommendation.options:  # ranked cheapest first
        if option.fits:
            best.setdefault(option.environment, option)
    rows = []
    for env in list_environments():
        option = best.get(env.key)
        if option is None:
            note = recommendation.left_out.get(env.key, "no GPU setup it offers fits this run")
            rows.append({"name": env.name, "cost": None, "hours": None, "tier": env.tier_name,
                         "gpu": "", "note": note, "option": None})
            continue
        gpu = option.gpu if option.count == 1 else f"{option.count}x {option.gpu}"
        rows.append({"name": env.name, "cost": option.cost_usd, "hours": option.hours,
                     "tier": option.tier, "gpu": gpu, "note": option.note, "option": option})
    return rows


def environment_explorer(model: Any = "7B", *, method: str = "lora", tokens: float = 1e7,
                         batch_size: int = 4, seq_len: int = 512,
                         continuous_update: bool = False) -> Any:
    """Compare the cost and time of one run across the catalog's environments.

    Each environment shows the cheapest GPU setup that ``lessonkit.recommend`` finds for it;
    ``tokens`` is the number of training tokens (examples x tokens per example x epochs).
    """
    from .recommender import recommend

    names = ["model", "method", "batch_size", "seq_len", "tokens"]
    values = {"model": model, "method": method, "tokens": tokens, "batch_size": batch_size,
              "seq_len": seq_len}
    controls = _controls(names, values, continuous_update)
    figure = _figure(7.5, 4.2, left=0.27, right=0.97, bottom=0.12, top=0.88)
    ax = figure.add_subplot()

    def update(explorer: Any) -> str:
        c = {k: w.value for k, w in controls.items()}
        rec = recommend(c["model"], method=c["method"], tokens=c["tokens"],
                        batch_size=c["batch_size"], seq_len=c["seq_len"])
        rows = environment_rows(rec)
        ax.clear()
        explorer.drawn = charts.draw_environment_costs(ax, rows)
        ax.set_title(f"{rec.model.name}, {c['method']}: {c['tokens'] / 1e6:g}M training tokens "
                     f"(batch {c['batch_size']} x {c['seq_len']})\ncheapest setup that fits "
                     f"in each environment", fontsize=9)
        explorer.recommendation, explorer.rows = rec, rows
        possible = [r for r in rows if r["cost"] is not None]
        if not possible:
            return ("<b style='color:#B22222'>No environment offers a GPU setup that fits "
                    "this run.</b>")
        cheapest = min(possible, key=lambda r: (r["cost"], r["hours"]))
        fastest = min(possible, key=lambda r: r["hours"])
        return (f"Cheapest: {html.escape(cheapest['name'])} on "
                f"{html.escape(cheapest['gpu'])}, ${cheapest['cost']:,.2f} "
                f"({cheapest['hours']:,.1f} h). Fastest: {html.escape(fastest['name'])} on "
                f"{html.escape(fastest['gpu'])}, {fastest['hours']:,.1f} h "
                f"(${fastest['cost']:,.2f}).<br><small>Time assumes {rec.mfu:.0%} of each GPU's "
                f"dense bf16 TFLOPS; prices are typical on-demand rates per GPU-hour.</small>")

    return _explorer_class()(
        "environment", controls, update, figure,
        [["model", "method"], ["batch_size", "seq_len"], ["tokens"]],
        recommendation=None, rows=None, drawn=None)


GUIDE_ANSWERS = {
    "colab_lambda": "Google Colab (A100) or Lambda Labs",
    "rtx4090": "a local RTX 4090 workstation",
    "cluster": "a multi-GPU cluster (8x A100s)",
}


def decision_flow_explorer(size: str = "7B", budget: str = "Low") -> Any:
    """Pick a model size and budget: the guide's flow with the path taken, that path checked
    against the numbers, and ``lessonkit.recommend``'s cheapest setup per method for the same
    size and budget (no budget limit where the flow does not ask for one)."""
    controls = _controls(["size", "budget"], {"size": size, "budget": budget}, False)
    figure = _figure(7.5, 4.2, left=0.0, right=1.0, bottom=0.0, top=1.0)
    ax = figure.add_subplot()

    def update(explorer: Any) -> str:
        size, budget = controls["size"].value, controls["budget"].value
        path = charts.decision_path(size, budget)
        controls["budget"].disabled = "budget" not in path
        ax.clear()
        explorer.drawn = charts.draw_decision_flow(ax, path)
        explorer.path = path
        asked = budget.lower() if "budget" in path else None
        rec = _recommend(size, budget=asked)
        explorer.recommendation = rec
        return decision_readout(path, rec)

    return _explorer_class()("decision-flow", controls, update, figure, [["size", "budget"]],
                             path=None, drawn=None, recommendation=None)


def _recommend(model: Any, **kwargs: Any) -> Any:
    from .recommender import recommend

    return recommend(model, **kwargs)


def decision_readout(path: list[str], rec: Any) -> str:
    """HTML: the guide's answer for ``path``, that answer checked, and the recommendation's
    cheapest setup per method."""
    from .fitting import METHOD_WORDS, needs_text
    from .gpus import get_gpu
    from .verdicts import flow_notes

    end = path[-1]
    esc = html.escape
    spec = rec.model
    if end in GUIDE_ANSWERS:
        lines = [f"The guide's flow says: <b>{GUIDE_ANSWERS[end]}</b>."]
        note = flow_notes(spec).get(end)
        if note:
            lines.append(f"Checked against the estimates: {esc(note)}")
    else:
        lines = [f"The guide's flow has no branch for {esc(spec.name)} models."]
    capped = rec.budget is not None and rec.budget != math.inf
    budget = f"budget at most ${rec.budget:.2f}/h" if capped else "no budget limit"
    lines.append(f"<code>lessonkit.recommend</code> for {esc(spec.name)} ({budget}), the "
                 f"cheapest setup that fits per method:")
    best = rec.best_per_method()
    for method in ("qlora", "lora", "full"):
        option = best.get(method)
        if option is None:
            why = needs_text(spec, method)
            if capped:
                why = f"nothing within ${rec.budget:.2f}/h; {why}"
            lines.append(f"{esc(METHOD_WORDS[method])}: {esc(why)}")
            continue
        price = "free" if option.price_per_hour == 0 else f"${option.price_per_hour:,.2f}/h"
        if option.purchase_usd:
            low, high = (v * option.count for v in option.purchase_usd)
            cards = "cards" if option.count > 1 else "card"
            price += f" (buying the {cards}: ${low:,.0f}-{high:,.0f}, spread over its hours)"
        label = method_label(method, get_gpu(option.gpu).native_bf16)
        s = option.settings
        run = f"batch {s['batch_size']} x {s['seq_len']}" + (
            " with checkpointing" if s["gradient_checkpointing"] else "")
        lines.append(f"{esc(label)}: <b>{esc(option.setup)}</b> on {esc(option.name)}, peak "
                     f"{option.peak_bytes / GB:,.1f} GB per GPU at {run}, {esc(price)}")
    return "<br>".join(lines)
