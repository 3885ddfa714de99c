"""The memory timeline: measured, estimated and from a CUDA snapshot, and its chart."""

from __future__ import annotations

import itertools

import pytest

import lessonkit as lk
from lessonkit import charts
from lessonkit.charts import palette
from lessonkit.memory.cuda_snapshot import BEFORE, timeline_from_snapshot
from lessonkit.memory.timeline import Timeline, keep_extremes
from lessonkit.units import GiB

MEASURED = [
    dict(),
    dict(gradient_checkpointing=True),
    dict(method="lora", precision="bf16"),
    dict(gradient_accumulation=2),
    dict(method="qlora", precision="bf16"),
]


@pytest.fixture(scope="module")
def measured():
    from lessonkit.memory.measuring import run_step, validate

    spec = lk.resolve_model("gpt2")
    out = []
    for kw in MEASURED:
        settings = validate(
            spec,
            **{
                **dict(
                    method="full",
                    precision="bf16-mixed",
                    optimizer="adamw",
                    batch_size=1,
                    seq_len=128,
                    gradient_checkpointing=False,
                    lora_rank=8,
                    lora_targets=("c_attn",),
                    n_gpus=1,
                    zero_stage=0,
                    attention="sdpa",
                    offload_optimizer=False,
                    double_quant=True,
                    lora_dtype="fp32",
                    gradient_accumulation=1,
                    device="cpu",
                ),
                **kw,
            },
        )
        out.append((kw, *run_step(spec, settings, fake=True)))
    return out


def test_measured_peak_is_the_reports_peak_with_the_same_parts(measured):
    for kw, report, _ in measured:
        timeline = report.timeline
        assert timeline.source == "measure"
        assert timeline.peak_bytes == report.tensor_bytes == report.total_bytes, kw
        assert timeline.peak_phase == report.peak_phase, kw
        at_peak = timeline.at(timeline.peak_index)
        assert {k: v for k, v in at_peak.items() if v} == {
            k: v for k, v in report.breakdown.items() if v
        }, kw
        for phase, level in report.phase_peaks.items():  # each phase's own highest moment
            moments = zip(timeline.totals, timeline.phases, strict=True)
            assert max(t for t, p in moments if p == phase) == level


def test_measured_categories_sum_to_the_live_total_at_every_event(measured):
    """Before thinning: at every event the categories add up to the tracker's own running
    total of allocations and frees (nothing lost or counted twice by the categorisation)."""
    for kw, report, tracker in measured:
        groups = {"weights": set(), "gradients": set(), "optimizer": set()}
        moments = list(tracker.moments(groups, report.model.vocab_size))
        totals, running = [], 0
        for delta, phase_idx in tracker.events:
            running += delta
            if tracker.phases[phase_idx] not in ("setup", "end"):
                totals.append(running)
        assert [sum(m.values()) for _, m in moments] == totals, kw
        assert all(v >= 0 for _, m in moments for v in m.values()), kw


def test_thinning_keeps_the_shape_and_the_exact_peak():
    totals = [(i * 7919) % 1000 for i in range(20000)] + [5000] + [3] * 10
    keep = keep_extremes(totals, 500)
    assert len(keep) <= 520 and keep == sorted(set(keep))
    assert max(totals[i] for i in keep) == 5000 and min(totals[i] for i in keep) == 0
    assert keep[0] == 0 and keep[-1] == len(totals) - 1


GRID = list(
    itertools.product(
        ["gpt2", "llama-2-7b", "qwen2.5-0.5b"],
        ["full", "lora", "qlora"],
        [False, True],
        [(1, 128), (8, 1024)],
        ["adamw", "adamw-fused"],
    )
)


@pytest.mark.parametrize(("model", "method", "ckpt", "shape", "optimizer"), GRID)
def test_estimated_peak_is_the_reports_peak(model, method, ckpt, shape, optimizer):
    report = lk.estimate(
        model,
        method=method,
        precision="bf16-mixed" if method == "full" else "bf16",
        gradient_checkpointing=ckpt,
        batch_size=shape[0],
        seq_len=shape[1],
        optimizer=optimizer,
    )
    timeline = report.timeline
    assert timeline.peak_bytes == report.tensor_bytes
    assert timeline.peak_phase == report.peak_phase
    for phase, level in report.phase_peaks.items():
        assert (
            max(t for t, p in zip(timeline.totals, timeline.phases, strict=True) if p == phase)
            == level
        )
    assert all(v >= 0 for values in timeline.series.values() for v in values)
    spans = ["loading", "forward", "backward", "optimizer"]
    assert [p for p, _, _ in timeline.phase_spans()] == spans
    # loading comes first, at its own peak, and the step's peak leaves it out
    assert timeline.totals[0] == report.loading.peak_allocated_bytes
    assert timeline.totals[1] == report.loading.weight_bytes


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_estimated_peak_under_zero(zero):
    report = lk.estimate("llama-2-7b", n_gpus=8, zero_stage=zero, batch_size=2, seq_len=1024)
    assert report.timeline.peak_bytes == report.tensor_bytes


def _local_maxima(values):
    return sum(
        1 for a, b, c in zip(values, values[1:], values[2:], strict=False) if b > a and b > c
    )


def test_checkpointing_turns_the_backward_into_a_saw_tooth():
    shape = dict(method="lora", precision="bf16", batch_size=4, seq_len=1024)
    layers = lk.get_preset("llama-2-7b").n_layers
    plain = lk.estimate("llama-2-7b", **shape).timeline
    ckpt = lk.estimate("llama-2-7b", gradient_checkpointing=True, **shape).timeline

    def backward(t: Timeline) -> list[int]:
        return [v for v, p in zip(t.totals, t.phases, strict=True) if p == "backward"]

    assert _local_maxima(backward(ckpt)) >= layers  # one tooth per recomputed layer
    # without checkpointing the backward starts high (all saved activations) and falls
    assert (
        backward(plain)[1] > backward(plain)[-1] + (backward(plain)[1] - min(backward(plain))) * 0.9
    )
    assert max(backward(ckpt)) < max(backward(plain))
    assert ckpt.labels and "layer" in ckpt.labels[len(ckpt) // 2]


def test_an_estimate_makes_its_timeline_only_when_asked():
    report = lk.estimate("7B")
    assert callable(report.timeline_source)
    first = report.timeline
    assert isinstance(first, Timeline) and report.timeline is first


# ----- the CUDA snapshot reader, on a snapshot-shaped dict ------------------------------------
def frames(*pairs):
    return [{"filename": f, "line": 1, "name": n} for f, n in pairs]


FORWARD = frames(("/x/transformers/models/llama/modeling_llama.py", "forward"))
BACKWARD = frames(
    ("/x/torch/autograd/graph.py", "_engine_run_backward"), ("/x/torch/_tensor.py", "backward")
)
OPTIM = frames(
    ("/x/torch/optim/adamw.py", "_multi_tensor_adamw"), ("/x/torch/optim/optimizer.py", "step")
)


def snapshot():
    """Weights (400 B) and states (200 B) allocated before the trace; then a step: two saved
    activations, a gradient, an activation gradient, a new state, an optimizer temporary."""
    trace = [
        {"action": "alloc", "addr": 1000, "size": 100, "stream": 0, "frames": FORWARD},
        {"action": "alloc", "addr": 1100, "size": 50, "stream": 0, "frames": FORWARD},
        {"action": "segment_alloc", "addr": 5000, "size": 2048, "stream": 0, "frames": []},
        {"action": "alloc", "addr": 1200, "size": 30, "stream": 0, "frames": BACKWARD},
        {"action": "alloc", "addr": 1300, "size": 80, "stream": 0, "frames": BACKWARD},
        {"action": "free_requested", "addr": 1000, "size": 100, "stream": 0, "frames": BACKWARD},
        {"action": "free_completed", "addr": 1000, "size": 100, "stream": 0, "frames": BACKWARD},
        {"action": "free_completed", "addr": 1100, "size": 50, "stream": 0, "frames": BACKWARD},
        {"action": "free_completed", "addr": 1300, "size": 80, "stream": 0, "frames": BACKWARD},
        {"action": "alloc", "addr": 1400, "size": 60, "stream": 0, "frames": OPTIM},
        {"action": "alloc", "addr": 1500, "size": 20, "stream": 0, "frames": OPTIM},
        {"action": "free_completed", "addr": 1400, "size": 60, "stream": 0, "frames": OPTIM},
        {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "frames": []},
    ]
    blocks = [
        {"address": 0, "size": 400, "requested_size": 400, "state": "active_allocated"},
        {"address": 400, "size": 200, "requested_size": 200, "state": "active_allocated"},
        {"address": 1200, "size": 30, "requested_size": 30, "state": "active_allocated"},
        {"address": 1500, "size": 20, "requested_size": 20, "state": "active_allocated"},
        {"address": 1600, "size": 500, "requested_size": 0, "state": "inactive"},
    ]
    return {
        "segments": [
            {
                "device": 0,
                "address": 0,
                "total_size": 4096,
                "stream": 0,
                "segment_type": "large",
                "allocated_size": 650,
                "active_size": 650,
                "blocks": blocks,
            }
        ],
        "device_traces": [trace],
    }


def test_snapshot_reader_follows_the_trace():
    t = timeline_from_snapshot(snapshot())
    assert t.source == "snapshot" and len(t) == 10  # one moment per alloc and free_completed
    assert t.series[BEFORE] == [600] * 10  # 650 allocated at the end, 50 of it by the trace
    assert t.phases == ["forward"] * 2 + ["backward"] * 5 + ["optimizer"] * 3
    assert t.totals == [700, 750, 780, 860, 760, 710, 630, 690, 710, 650]
    assert t.peak_bytes == 860 and t.peak_phase == "backward"
    # what outlives the trace: a gradient, an optimizer state; the rest is transient
    end = t.at(len(t) - 1)
    assert end["gradients"] == 30 and end["optimizer"] == 20 and end.get("temporaries", 0) == 0
    assert max(t.series["temporaries"]) == 60
    assert end[BEFORE] + end["gradients"] + end["optimizer"] == 650  # what the blocks hold


def test_snapshot_reader_takes_a_classifier_and_rejects_what_is_no_snapshot():
    t = timeline_from_snapshot(snapshot(), classify=lambda entry, survives: ("forward", "logits"))
    assert set(t.phases) == {"forward"} and max(t.series["logits"]) == 260
    for bad in ({}, {"device_traces": []}, [], {"device_traces": [[{"action": "snapshot"}]]}):
        with pytest.raises(lk.LessonkitError):
            timeline_from_snapshot(bad)
    with pytest.raises(lk.LessonkitError):
        timeline_from_snapshot(snapshot(), device=3)


@pytest.mark.gpu
def test_snapshot_of_a_real_cuda_step():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(64, 1024, device="cuda")
    model(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        model(x).square().mean().backward()
        optimizer.step()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    t = timeline_from_snapshot(snap, device=torch.cuda.current_device())
    assert abs(t.peak_bytes - torch.cuda.max_memory_allocated()) <= 0.02 * t.peak_bytes
    assert {"forward", "backward", "optimizer"} <= set(t.phases)
    charts.memory_timeline(t)


# ----- the chart ----------------------------------------------------------------------------
@pytest.fixture
def ax():
    from lessonkit.widgets.explorer import new_figure

    return new_figure(8, 3.5).add_subplot()


def test_chart_stacks_the_categories_to_the_total_and_marks_the_peak(ax):
    report = lk.estimate(
        "llama-2-7b",
        method="lora",
        precision="bf16",
        batch_size=4,
        seq_len=1024,
        gradient_checkpointing=True,
    )
    chart = charts.memory_timeline(report, ax, gpu=lk.get_gpu("RTX 4090"))
    t = report.timeline.step_only()  # the chart draws the step; loading is the report's text
    assert [c.get_facecolor()[0][:3] for c in chart.stacks] == [
        pytest.approx(
            tuple(int(palette.CATEGORY_COLORS[c][i : i + 2], 16) / 255 for i in (1, 3, 5))
        )
        for c in t.categories
    ]
    top = max(v[1] for v in chart.stacks[-1].get_paths()[0].vertices)
    assert top == pytest.approx(t.peak_bytes / GiB)
    assert chart.peak_line.get_xdata()[0] == t.peak_index
    for i in (0, t.peak_index, len(t) - 1):
        assert sum(chart.heights(i).values()) == pytest.approx(t.totals[i] / GiB)
    texts = " ".join(x.get_text() for x in ax.texts)
    assert "per GPU with the CUDA context" in texts and "RTX 4090" in texts
    assert f"peak {t.peak_bytes / GiB:,.2f} GiB" in " ".join(a.get_text() for a in ax.texts)


def test_chart_draws_a_measurement_and_a_snapshot_and_refuses_the_rest(ax):
    measured = lk.measure("gpt2", batch_size=1, seq_len=128)
    chart = charts.memory_timeline(measured, ax)
    assert "measured" in ax.get_title()
    chart.update(timeline_from_snapshot(snapshot()))
    assert "CUDA snapshot" in ax.get_title()
    assert "Allocated before the trace" in [t.get_text() for t in ax.get_legend().get_texts()][-1]
    for bad in (None, "7B", 3, Timeline([], {})):
        with pytest.raises(lk.LessonkitError):
            chart.update(bad)


def test_timeline_explorer_toggles_checkpointing():
    pytest.importorskip("ipywidgets")
    from lessonkit.widgets.timeline import timeline_explorer

    explorer = timeline_explorer("7B", method="lora", batch_size=4, seq_len=1024)
    before = explorer.report.timeline
    assert explorer.error is None and "Peak of tensors" in explorer.readout.value
    explorer.controls["gradient_checkpointing"].value = True
    after = explorer.report.timeline
    assert explorer.error is None and after.peak_bytes < before.peak_bytes
    assert explorer.chart.timeline.totals == after.step_only().totals  # the step is drawn
    explorer.controls["model"].value = "70B"
    assert explorer.error is None  # never raises; a big model draws too
