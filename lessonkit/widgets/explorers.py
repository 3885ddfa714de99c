"""Live explorers for the notebooks, built with core ipywidgets on the charts in charts/.

Each explorer returns an ``Explorer`` (widgets/explorer.py: an ipywidgets VBox) with
``.controls`` (name -> widget, built by widgets/controls.py), ``.readout`` (an HTML widget),
``.image`` (the chart, an Image widget of PNG bytes, in the box ``.output``), ``.figure`` and
``.redraw()``. A change redraws the chart in place as one PNG: every explorer changes the
artists of one reused figure and repaints only those a change can alter (bars, their labels,
the title; the cost chart's x axis and legend too) over a saved picture of the rest; the
decision flow keeps one picture per path through the flow. A control that moves another (a
method brings its usual precision; a change that rules out a memory saver switches it off)
redraws once. A callback never raises: a failing estimate is shown as a message in the readout.

The readout gives the peak per GPU, its phase and largest parts (and when a change moved it to
another phase), the setup, for a mixture of experts its total and active parameters (and that
QLoRA leaves the experts unquantized), the GPUs it fits on; where it fits none, the changes of
the kit's own search that make it fit the largest, each with its new peak (widgets/advice.py).
Batch sizes are per GPU; "single GPU" is said only while one GPU is selected.

Beside the live widget, a static copy of the readout and the chart (hidden while the widget
lives) is what a notebook opened without its kernel, GitHub's viewer or nbconvert shows; with
``LESSONKIT_STATIC=1`` (papermill or nbval runs) only that copy is displayed.
widgets/explorer.py says more.

CSS classes, for browser tests and styling:
  - every explorer: ``lessonkit-explorer`` plus ``lessonkit-vram-explorer``,
    ``lessonkit-gpu-matrix-explorer``, ``lessonkit-environment-explorer`` or
    ``lessonkit-decision-flow-explorer``;
  - the text readout: ``lessonkit-readout``; the box of the chart's Image: ``lessonkit-chart``;
    the button that puts every control back where it started: ``lessonkit-button-reset``; why
    memory savers are greyed out, as text where tooltips do not show (ipywidgets 7):
    ``lessonkit-notes``; the static copy for viewers without a kernel: ``lessonkit-static``;
  - each control: ``lessonkit-<kind>-<name>``, kind being slider, dropdown, toggle or checkbox:
    ``lessonkit-dropdown-model``, ``lessonkit-toggle-method``, ``lessonkit-dropdown-precision``,
    ``lessonkit-dropdown-optimizer``, ``lessonkit-slider-batch``, ``lessonkit-slider-seq``,
    ``lessonkit-slider-rank``, ``lessonkit-dropdown-dropout``,
    ``lessonkit-checkbox-checkpointing``, ``lessonkit-checkbox-activation-offload``,
    ``lessonkit-checkbox-optimizer-in-backward``, ``lessonkit-dropdown-loss``,
    ``lessonkit-dropdown-chunks``,
    ``lessonkit-slider-gpus``,
    ``lessonkit-dropdown-zero``, ``lessonkit-toggle-gpu-set``, ``lessonkit-slider-tokens``,
    ``lessonkit-dropdown-size``, ``lessonkit-toggle-budget``.
"""

from __future__ import annotations

import html
import math
import re
from typing import Any

from ..charts import memory_charts, planning_charts
from ..charts.fit_chart import gpu_fit_height
from ..hardware import gpu_records
from ..planning.fitting import method_label
from ..units import GiB, format_hours
from .controls import (
    CONTROL_NAMES,
    GPU_COUNTS,
    LORA_RANKS,
    MODEL_SIZES,
    SEQ_LENS,
    SETUP_DEFAULTS,
    TOKEN_COUNTS,
    build_controls,
    estimate_settings,
    precision_follows_method,
    savers_follow,
    show_reasons,
    split_defaults,
    sync_enabled,
)
from .explorer import CHART_DPI, explorer_class, new_figure, static_mode

__all__ = [
    "CHART_DPI",
    "CONTROL_NAMES",
    "GPU_COUNTS",
    "GUIDE_ANSWERS",
    "LORA_RANKS",
    "MODEL_SIZES",
    "PRECISION_WORDS",
    "SEQ_LENS",
    "SETUP_CONTROLS",
    "SETUP_DEFAULTS",
    "TOKEN_COUNTS",
    "VRAM_CONTROLS",
    "decision_flow_explorer",
    "decision_readout",
    "environment_explorer",
    "environment_rows",
    "experts_html",
    "fit_summary",
    "gpu_matrix_explorer",
    "peak_html",
    "precision_words",
    "saver_words",
    "setup_html",
    "static_mode",
    "vram_explorer",
]


def _estimate(model: Any, **settings: Any) -> Any:
    from ..planning.fitting import estimate_cached

    return estimate_cached(model, **settings)


def peak_html(report: Any) -> str:
    total = report.total_bytes
    from ..memory.report import phase_words

    return (
        f"<b>Peak per GPU: {total / GiB:,.1f} GiB</b> (during the "
        f"{html.escape(phase_words(str(report.peak_phase)))})"
    )


# What each precision keeps in which dtype; LoRA and QLoRA name their frozen base weights.
PRECISION_WORDS = {
    "fp32": "everything in fp32",
    "bf16-mixed": "fp32 weights, bf16 autocast",
    "fp16-mixed": "fp32 weights, fp16 autocast",
    "bf16": "bf16 weights",
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
        words = (
            words.replace("fp32 weights", "fp32 base weights")
            .replace("bf16 weights", "bf16 base weights")
            .replace("everything", "base weights")
        )
    if method in ("lora", "qlora"):
        words += f", {settings.get('lora_dtype', 'fp32')} adapters"
    return words


def setup_html(report: Any) -> str:
    """HTML: method, precision (in words) and optimizer of the estimate shown; for LoRA and
    QLoRA the adapters' rank and target modules."""
    s = report.settings
    text = (
        f"{html.escape(str(s.get('method')))}, precision "
        f"<b>{html.escape(str(s.get('precision')))}</b> "
        f"({html.escape(precision_words(s))}), {html.escape(str(s.get('optimizer')))}"
    )
    if s.get("method") in ("lora", "qlora") and s.get("lora_targets"):
        targets = ", ".join(str(t) for t in s["lora_targets"])
        text += f"; LoRA rank {s.get('lora_rank')} on {html.escape(targets)}"
    savers = saver_words(s)
    if savers:
        text += f"; memory savers: {html.escape(', '.join(savers))}"
    if s.get("no_sync"):
        text += (
            f"; no_sync: gradients reduced on the last of {s['gradient_accumulation']} "
            "micro-batches only"
        )
    return text


def experts_html(report: Any) -> str:
    """For a mixture of experts, a line saying that memory holds every parameter while a token
    computes with its active ones; "" for a dense model."""
    spec = report.model
    if not spec.n_experts:
        return ""
    text = (
        f".<br>Mixture of experts: all {spec.n_experts} experts of each layer are in memory "
        f"({spec.n_params / 1e9:.2f}B parameters in total), a token computes with "
        f"{spec.experts_per_token} of them ({spec.active_params / 1e9:.2f}B active parameters)"
    )
    if report.settings.get("method") == "qlora":
        # transformers' bitsandbytes integration swaps nn.Linear only; experts are 3D tensors
        text += "; QLoRA leaves the experts unquantized (bitsandbytes quantizes linear layers only)"
    return text


def saver_words(settings: dict[str, Any]) -> list[str]:
    """The memory savers of today's recipes that ``settings`` turn on, in words."""
    words = []
    if settings.get("activation_offload"):
        words.append("activation offload to CPU")
    if settings.get("optimizer_in_backward"):
        words.append("optimizer step in backward")
    if settings.get("loss") == "chunked":
        words.append(f"chunked cross-entropy ({settings.get('loss_chunks')} chunks)")
    return words


def ddp_note(report: Any) -> str:
    """HTML: why several GPUs at ZeRO-0 raise the per-GPU peak ('' otherwise)."""
    s = report.settings
    if s.get("n_gpus", 1) <= 1 or s.get("zero_stage", 0) != 0:
        return ""
    # one GPU has nothing to reduce: no_sync (several GPUs only) is left out of the baseline
    one = _estimate(
        report.model,
        **{**_plain_settings(s), "n_gpus": 1, "zero_stage": 0, "no_sync": False},
    )
    rise = report.total_bytes - one.total_bytes
    change = (
        f"the per-GPU peak rises by {rise / GiB:,.1f} GiB over one GPU"
        if rise >= 0.05 * GiB
        else "the per-GPU peak stays that of one GPU (the trainable part is small)"
    )
    return (
        f"<br>{s['n_gpus']} GPUs at ZeRO-0 (plain DDP): every GPU keeps the whole model, "
        f"its gradients and optimizer states, plus DDP's gradient buckets (as large as the "
        f"gradients), so {change}. ZeRO-1/2/3 (or FSDP) shard the states, gradients and "
        f"weights over the GPUs."
    )


def _plain_settings(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if k != "estimated"}


def fit_summary(report: Any, gpus: list[Any] | None = None, previous: Any = None) -> str:
    """HTML: the peak per GPU (GiB) and its phase (and that it moved there, given the report
    shown before), the setup, the catalog GPUs it fits on (smallest first) and the smallest
    one's headroom; device memory and headroom in GiB; where it fits none, the kit's changes
    that make it fit the largest, each with its new peak; with several GPUs at ZeRO-0, why the
    per-GPU peak does not fall."""
    return _fit_lines(report, gpus, previous) + ddp_note(report)


def _nowhere(report: Any, where: str) -> str:
    """'Does not fit on any single GPU shown', or with several GPUs selected, that the peak
    per GPU is above every GPU (never 'single GPU' then)."""
    n = report.settings.get("n_gpus", 1)
    if n > 1:
        return f"Does not fit: even with {n} GPUs, the peak per GPU is above every GPU {where}"
    return f"Does not fit on any single GPU {where}"


def _fit_lines(report: Any, gpus: list[Any] | None, previous: Any = None) -> str:
    from .advice import fix_advice, phase_html

    where = "in the catalog" if gpus is None else "shown"
    gpus = gpu_records.catalog_gpus() if gpus is None else gpus
    head = (
        f"{peak_html(report)}. {phase_html(report, previous)}<br>Setup: {setup_html(report)}"
        f"{experts_html(report)}"
    )
    if not gpus:  # no catalog: compare with the cards' full sizes (GiB), an upper bound
        sizes = [s for s in memory_charts.COMMON_GPU_SIZES_GB if report.fits(s * GiB)]
        fits = (
            (
                f"Fits in the full {sizes[0]:g} GiB of a {sizes[0]:g} GB card and larger "
                f"(usable memory is a little less)"
            )
            if sizes
            else f"<b>{_nowhere(report, 'size shown')}</b>"
        )
        return f"{head}.<br>{fits}."
    ordered = sorted(
        gpus, key=lambda g: (gpu_records.gpu_usable_bytes(g), gpu_records.gpu_label(g))
    )
    fit = [g for g in ordered if gpu_records.gpu_fits(g, report)]
    if not fit:
        biggest = ordered[-1]
        runnable = [g for g in ordered if gpu_records.field(g, "current_wheels", default=True)]
        target = runnable[-1] if runnable else biggest
        return (
            f"{head}.<br><b style='color:#B22222'>{_nowhere(report, where)}</b> "
            f"(largest: {html.escape(gpu_records.gpu_label(biggest))}, "
            f"{html.escape(gpu_records.usable_text(biggest))} usable, "
            f"{html.escape(gpu_records.headroom_text(biggest, report))})."
            + fix_advice(
                report, gpu_records.gpu_usable_bytes(target), gpu_records.gpu_label(target)
            )
        )
    names = ", ".join(html.escape(gpu_records.gpu_label(g)) for g in fit)
    return (
        f"{head}.<br>Fits on {len(fit)} of {len(gpus)} GPUs: {names}.<br>Smallest that "
        f"fits: {html.escape(gpu_records.gpu_label(fit[0]))}, "
        f"{html.escape(gpu_records.usable_text(fit[0]))} usable, "
        f"{html.escape(gpu_records.headroom_text(fit[0], report))}."
    )


def chart_note(report: Any, largest_bytes: float, largest: str) -> str:
    """The chart's note where the peak is above every GPU: that, and the first change of the
    kit's search that makes it fit the largest (never 'single GPU' with several selected)."""
    import textwrap

    from .advice import fixes

    n = report.settings.get("n_gpus", 1)
    head = (
        f"above every GPU even on {n} GPUs (largest: {largest.split(',')[0]})."
        if n > 1
        else f"does not fit on any single GPU (largest: {largest})."  # as the chart says it
    )
    found = fixes(report, largest_bytes, limit=1)
    # No figure that moves with every batch here: the note stays in the saved picture while
    # the slider moves (the readout gives each change's peak).
    advice = (
        f"Fits with {re.sub(r' [(][^)]*[)]', '', found[0].words)} (peaks in the readout)."
        if found
        else "No change tried makes it fit: a smaller model."
    )
    return f"{head}\n{textwrap.fill(advice, 62)}"


AXIS_STEP = 1.5  # above every GPU, the y axis grows in steps of 1.5x


def steady_axis(chart: Any, report: Any) -> None:
    """Above every GPU line, round the y axis' top up to a step of AXIS_STEP, so that most
    slider moves keep the axis (and the explorer repaints only the bars over a saved picture)."""
    lines = [size for size, _ in chart.lines]
    top = chart.ax.get_ylim()[1]
    if not lines or report.total_bytes / GiB <= max(lines):
        return
    base = max(lines) * 1.4  # the top for a peak at the largest GPU
    steps = max(0, math.ceil(math.log(top / base, AXIS_STEP) - 1e-9))
    steady = base * AXIS_STEP**steps
    if steady != top:
        chart.ax.set_ylim(0, steady)
        chart._thin_gpu_labels(steady)


# ----- the explorers -----------------------------------------------------------------------
VRAM_CONTROLS = [
    "model",
    "method",
    "precision",
    "optimizer",
    "optimizer_in_backward",
    "batch_size",
    "seq_len",
    "lora_rank",
    "lora_dropout",
    "gradient_checkpointing",
    "activation_offload",
    "loss",
    "loss_chunks",
    "n_gpus",
    "zero_stage",
]


def vram_explorer(model: Any = "7B", *, continuous_update: bool = False, **defaults: Any) -> Any:
    """Sliders and menus for a training setup driving a live stacked bar of its peak memory.

    ``defaults`` set the controls' starting values (e.g. ``method="full"``, ``batch_size=4``);
    other ``estimate`` keywords (e.g. ``attention="eager"``) are passed through unchanged.
    Precision starts at, and follows, the method's usual one (``fitting.usual_precision``:
    bf16-mixed for full fine-tuning, bf16 for LoRA and QLoRA) unless chosen afterwards.
    The memory savers (``activation_offload``, ``optimizer_in_backward``, ``loss`` with its
    ``loss_chunks``, greyed out unless the loss is chunked) are
    greyed out, with the reason, where ``estimate`` rules them out (activation offload needs
    gradient checkpointing; the optimizer step in backward needs one GPU); one that a change
    rules out switches itself off.
    """
    values, fixed = split_defaults(VRAM_CONTROLS, model, defaults)
    controls = build_controls(VRAM_CONTROLS, values, continuous_update)
    figure = new_figure(7.5, 3.6, left=0.1, right=0.77, bottom=0.2, top=0.9)
    chart = memory_charts.BreakdownChart(figure.add_subplot())
    precision, savers = precision_follows_method(controls), savers_follow(controls, fixed)

    def update(explorer: Any) -> str:
        settings = estimate_settings(controls, fixed)
        sync_enabled(controls, settings)
        show_reasons(explorer.notes, controls, settings)
        report = _estimate(controls["model"].value, **settings)
        explorer.chart.update(report)
        previous, explorer.report = explorer.report, report
        readout = fit_summary(report, previous=previous)
        if explorer.chart.note.get_text():  # above every GPU: the search's first change
            chart = explorer.chart
            chart.note.set_text(chart_note(report, chart.largest_bytes, chart.largest_name))
            steady_axis(chart, report)
        return readout

    return explorer_class()(
        "vram",
        controls,
        update,
        figure,
        [
            ["model", "method"],
            ["precision", "optimizer", "optimizer_in_backward"],
            ["batch_size", "seq_len"],
            ["lora_rank", "lora_dropout"],
            ["gradient_checkpointing", "activation_offload"],
            ["loss", "loss_chunks"],
            ["n_gpus", "zero_stage"],
        ],
        static_key=chart.static_key,
        live=chart.live_artists,
        link=lambda change: (precision(change), savers(change)),
        chart=chart,
        report=None,
    )


SETUP_CONTROLS = [
    "model",
    "method",
    "precision",
    "optimizer",
    "batch_size",
    "seq_len",
    "lora_rank",
    "gradient_checkpointing",
]


def gpu_matrix_explorer(
    model: Any = "7B",
    gpus: list[Any] | None = None,
    *,
    continuous_update: bool = False,
    **defaults: Any,
) -> Any:
    """Choose a setup and see which GPUs of the catalog fit it (``charts.draw_gpu_fit``).

    ``gpus`` (names or records) fixes the GPUs shown; otherwise a toggle switches between the
    guide's four GPUs and the whole catalog.
    """
    from ..hardware.gpus import get_gpu, list_gpus

    fixed_gpus = None if gpus is None else [get_gpu(g) for g in gpus]
    names = SETUP_CONTROLS + ([] if fixed_gpus is not None else ["gpu_set"])
    values, fixed = split_defaults(
        names, model, {"gpu_set": "Guide's four", **defaults} if fixed_gpus is None else defaults
    )
    controls = build_controls(names, values, continuous_update)
    # Tall enough for the most rows it can show, each name at 9 pt, with the "needs" band.
    most_rows = len(fixed_gpus) if fixed_gpus is not None else len(list_gpus())
    height = max(4.6, gpu_fit_height(most_rows))
    figure = new_figure(
        7.5, height, left=0.26, right=0.97, bottom=0.55 / height, top=1 - 0.64 / height
    )
    ax = figure.add_subplot()

    def update(explorer: Any) -> str:
        sync_enabled(controls)
        report = _estimate(controls["model"].value, **estimate_settings(controls, fixed))
        shown = (
            fixed_gpus
            if fixed_gpus is not None
            else list_gpus(in_guide=True if controls["gpu_set"].value == "Guide's four" else None)
        )
        names = sorted(g.name for g in shown)
        if explorer.drawn is not None and explorer.shown_names == names:
            memory_charts.update_gpu_fit(ax, explorer.drawn, report, settings=False)  # in place
        else:
            ax.clear()
            explorer.drawn = memory_charts.draw_gpu_fit(ax, report, shown, settings=False)
            explorer.shown_names = names
        explorer.report = report
        return fit_summary(report, shown)

    def static_key() -> tuple[Any, ...]:
        return (0, tuple(explorer_names()), tuple(ax.get_xlim()), ax.get_title())

    def explorer_names() -> list[str]:
        return [g.name for g in (holder[0].drawn or {}).get("gpus", [])] if holder else []

    def live() -> list[Any]:
        return memory_charts.gpu_fit_live_artists(ax, holder[0].drawn)

    holder: list[Any] = []

    explorer = explorer_class()(
        "gpu-matrix",
        controls,
        update,
        figure,
        [
            ["model", "method"],
            ["precision", "optimizer"],
            ["batch_size", "seq_len"],
            ["lora_rank", "gradient_checkpointing"],
            ["gpu_set"],
        ],
        link=precision_follows_method(controls),
        report=None,
        drawn=None,
        shown_names=None,
    )
    holder.append(explorer)
    explorer._static_key, explorer._live = static_key, live
    return explorer


def environment_rows(recommendation: Any) -> list[dict[str, Any]]:
    """One row per environment: its first setup in ``recommend``'s ranking (comfortable fits
    before tight ones, then cheapest)."""
    from ..hardware.environments import list_environments

    best: dict[str, Any] = {}
    for option in recommendation.options:  # ranked: comfortable first, then cheapest
        if option.fits:
            best.setdefault(option.environment, option)
    rows = []
    for env in list_environments():
        option = best.get(env.key)
        if option is None:
            note = recommendation.left_out.get(env.key, "no GPU setup it offers fits this run")
            rows.append(
                {
                    "name": env.name,
                    "cost": None,
                    "hours": None,
                    "tier": env.tier_name,
                    "gpu": "",
                    "note": note,
                    "option": None,
                }
            )
            continue
        gpu = option_gpu(option)
        rows.append(
            {
                "name": env.name,
                "cost": option.cost_usd,
                "hours": option.hours,
                "tier": option.tier,
                "gpu": gpu,
                "note": option.note,
                "option": option,
            }
        )
    return rows


def option_gpu(option: Any) -> str:
    """'H100 80GB' for one GPU, '8x H100 80GB' for several."""
    return str(option.gpu) if option.count == 1 else f"{option.count}x {option.gpu}"


def environment_explorer(
    model: Any = "7B",
    *,
    method: str = "lora",
    tokens: float = 1e7,
    batch_size: int = 4,
    seq_len: int = 512,
    continuous_update: bool = False,
) -> Any:
    """Compare the cost and time of one run across the catalog's environments.

    Each environment shows the cheapest GPU setup that ``lessonkit.recommend`` finds for it;
    ``tokens`` is the number of training tokens (examples x tokens per example x epochs).
    """
    from ..planning.recommender import recommend

    names = ["model", "method", "batch_size", "seq_len", "tokens"]
    values = {
        "model": model,
        "method": method,
        "tokens": tokens,
        "batch_size": batch_size,
        "seq_len": seq_len,
    }
    controls = build_controls(names, values, continuous_update)
    figure = new_figure(7.5, 4.2, left=0.27, right=0.97, bottom=0.12, top=0.88)
    ax = figure.add_subplot()

    def update(explorer: Any) -> str:
        c = {k: w.value for k, w in controls.items()}
        rec = recommend(
            c["model"],
            method=c["method"],
            tokens=c["tokens"],
            batch_size=c["batch_size"],
            seq_len=c["seq_len"],
        )
        rows = environment_rows(rec)
        names = [r["name"] for r in rows]
        if explorer.drawn is not None and explorer.drawn["names"] == names:
            planning_charts.update_environment_costs(
                ax, explorer.drawn, rows
            )  # same bars, in place
        else:
            ax.clear()
            explorer.drawn = planning_charts.draw_environment_costs(ax, rows)
        # The run's size is in the readout: a title that changes only with the model and
        # method stays in the saved picture while the sliders move.
        title = f"{rec.model.name}, {c['method']}: cheapest setup that fits in each environment"
        if ax.get_title() != title:
            ax.set_title(title, fontsize=9)
        explorer.recommendation, explorer.rows = rec, rows
        run = (
            f"{c['tokens'] / 1e6:g}M training tokens at batch {c['batch_size']} x {c['seq_len']}. "
        )
        possible = [r for r in rows if r["cost"] is not None]
        if not possible:
            return (
                f"{run}<b style='color:#B22222'>No environment offers a GPU setup that fits "
                "this run.</b>"
            )
        cheapest = min(possible, key=lambda r: (r["cost"], r["hours"]))
        # the quickest of every offer, not of each environment's cheapest row
        quickest = rec.fastest()
        if quickest is not None and quickest.hours is not None:
            name, gpu, hours = quickest.name, option_gpu(quickest), quickest.hours
            price: float | None = quickest.cost_usd
        else:
            row = min(possible, key=lambda r: r["hours"])
            name, gpu, hours, price = row["name"], row["gpu"], row["hours"], row["cost"]
        cost = "" if price is None else f" (${price:,.2f})"
        return (
            f"{run}Cheapest run: {html.escape(cheapest['name'])} on "
            f"{html.escape(cheapest['gpu'])}, ${cheapest['cost']:,.2f} "
            f"({format_hours(cheapest['hours'])}). Fastest: {html.escape(name)} on "
            f"{html.escape(gpu)}, {format_hours(hours)}"
            f"{cost}.<br><small>Time assumes {rec.mfu:.0%} of each GPU's "
            f"dense bf16 TFLOPS; prices are typical on-demand rates per GPU-hour.</small>"
        )

    explorer = explorer_class()(
        "environment",
        controls,
        update,
        figure,
        [["model", "method"], ["batch_size", "seq_len"], ["tokens"]],
        recommendation=None,
        rows=None,
        drawn=None,
    )
    explorer._static_key = lambda: (
        0,
        planning_charts.environment_costs_static_key(ax, explorer.drawn),
    )
    explorer._live = lambda: planning_charts.environment_costs_live_artists(ax, explorer.drawn)
    explorer._rows = lambda: planning_charts.environment_costs_rows(ax, explorer.drawn)
    return explorer


GUIDE_ANSWERS = {
    "colab_lambda": "Google Colab (A100) or Lambda Labs",
    "rtx4090": "a local RTX 4090 workstation",
    "cluster": "a multi-GPU cluster (8x A100s)",
}


def decision_flow_explorer(size: str = "7B", budget: str = "Low") -> Any:
    """Pick a model size and budget: the guide's flow with the path taken, that path checked
    against the numbers, and ``lessonkit.recommend``'s cheapest setup per method for the same
    size and budget (no budget limit where the flow does not ask for one)."""
    controls = build_controls(["size", "budget"], {"size": size, "budget": budget}, False)
    figure = new_figure(7.5, 4.2, left=0.0, right=1.0, bottom=0.0, top=1.0)
    ax = figure.add_subplot()
    answers: dict[tuple[str, str | None], Any] = {}  # (size, budget asked) -> recommendation

    def recommendation(size: str, asked: str | None) -> Any:
        if (size, asked) not in answers:
            answers[size, asked] = _recommend(size, budget=asked)
        return answers[size, asked]

    def update(explorer: Any) -> str:
        size, budget = controls["size"].value, controls["budget"].value
        path = planning_charts.decision_path(size, budget)
        controls["budget"].disabled = "budget" not in path
        if explorer.drawn is None:
            explorer.drawn = planning_charts.draw_decision_flow(ax, path)
        else:
            planning_charts.update_decision_flow(ax, explorer.drawn, path)  # same boxes, in place
        explorer.path = path
        asked = budget.lower() if "budget" in path else None
        rec = recommendation(size, asked)
        explorer.recommendation = rec
        return decision_readout(path, rec)

    # The picture depends on the path alone: one saved picture per path, nothing live.
    explorer = explorer_class()(
        "decision-flow",
        controls,
        update,
        figure,
        [["size", "budget"]],
        path=None,
        drawn=None,
        recommendation=None,
    )
    explorer._static_key = lambda: (0, tuple(explorer.path or ()))
    explorer._live = list
    # Few answers: all of them now (a fraction of a second), so no control change waits for one.
    for other in MODEL_SIZES:
        for level in ("Low", "High"):
            path = planning_charts.decision_path(other, level)
            recommendation(other, level.lower() if "budget" in path else None)
    return explorer


def _recommend(model: Any, **kwargs: Any) -> Any:
    from ..planning.recommender import recommend

    return recommend(model, **kwargs)


def decision_readout(path: list[str], rec: Any) -> str:
    """HTML: the guide's answer for ``path``, that answer checked, and the recommendation's
    cheapest setup per method."""
    from ..hardware.gpus import get_gpu
    from ..planning.fitting import METHOD_WORDS, needs_text
    from ..planning.verdicts import flow_notes

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
    lines.append(
        f"<code>lessonkit.recommend</code> for {esc(spec.name)} ({budget}): per method, "
        f"the setup that fits with the cheapest work (dollars per million training "
        f"tokens, not the lowest price per hour):"
    )
    best = rec.best_per_method()
    for method in ("qlora", "lora", "full"):
        option = best.get(method)
        if option is None:
            why = needs_text(spec, method)
            if capped:
                why = f"nothing within ${rec.budget:.2f}/h; {why}"
            lines.append(f"{esc(METHOD_WORDS[method])}: {esc(why)}")
            continue
        price = (
            "free"
            if option.price_per_hour == 0
            else f"${option.price_per_hour:,.2f}/h, "
            f"${option.usd_per_million_tokens:,.2f} per million tokens"
        )
        if option.purchase_usd:
            low, high = (v * option.count for v in option.purchase_usd)
            cards = "cards" if option.count > 1 else "card"
            price += f" (buying the {cards}: ${low:,.0f}-{high:,.0f}, spread over its hours)"
        label = method_label(method, get_gpu(option.gpu).native_bf16)
        s = option.settings
        run = f"batch {s['batch_size']} x {s['seq_len']}" + (
            " with checkpointing" if s["gradient_checkpointing"] else ""
        )
        caveat = get_gpu(option.gpu).caveat
        lines.append(
            f"{esc(label)}: <b>{esc(option.setup)}</b> on {esc(option.name)}, peak "
            f"{option.peak_bytes / GiB:,.1f} GiB per "
            f"GPU at {run}, {esc(price)}"
            + (f" <small>(note: {esc(caveat)})</small>" if caveat else "")
        )
    return "<br>".join(lines)
