"""Loading the checkpoint (memory/loading.py): estimate_loading() against transformers' own
from_pretrained followed under the tracker on CPU, with bitsandbytes quantizing for QLoRA; the
caching allocator's replay; and the loading moment in the report and its timeline."""

from __future__ import annotations

import pytest

import lessonkit
from lessonkit.memory.caching_allocator import replay
from lessonkit.memory.loading import estimate_loading, natural_key, replay_loading
from lessonkit.memory.settings import validate_run
from lessonkit.models.presets import resolve_model
from lessonkit.models.spec import DEFAULT_LORA_TARGETS
from lessonkit.units import GiB

MiB = 2**20


def run_settings(spec, **kw):
    base = dict(
        method="qlora",
        precision=None,
        optimizer="adamw",
        batch_size=1,
        seq_len=512,
        gradient_checkpointing=False,
        lora_rank=16,
        lora_targets=DEFAULT_LORA_TARGETS,
        n_gpus=1,
        zero_stage=0,
        attention="sdpa",
        offload_optimizer=False,
        double_quant=True,
        lora_dtype="fp32",
        gradient_accumulation=1,
        device="cuda",
    )
    return validate_run(spec, **(base | kw))


# ----- the caching allocator's rules ----------------------------------------------------------
def test_the_allocator_rounds_and_pools_as_pytorch_does():
    small = replay([("a", 100)])  # a small request: one 2 MiB small-pool segment, 512 B used
    assert (small.allocated, small.reserved) == (512, 2 * MiB)
    mid = replay([("a", 3 * MiB)])  # 1-10 MiB: a 20 MiB segment
    assert mid.reserved == 20 * MiB
    large = replay([("a", 11 * MiB + 1)])  # larger: rounded up to 2 MiB
    assert large.reserved == 12 * MiB


def test_a_freed_block_is_reused_and_stays_reserved():
    # the warm-up pattern: one big block freed, then smaller tensors carved out of it
    events = [("warmup", 100 * MiB), ("warmup", 0)]
    events += [(f"t{i}", 30 * MiB) for i in range(3)]
    allocator = replay(events)
    assert allocator.reserved == 100 * MiB and allocator.allocated == 90 * MiB
    allocator.malloc("more", 30 * MiB)  # no free block holds it: a new segment
    assert allocator.reserved == 130 * MiB
    allocator.free("t1")
    allocator.free("t0")  # merged with its free neighbour: 60 MiB in one block
    allocator.malloc("big", 55 * MiB)
    assert allocator.reserved == 130 * MiB and allocator.peak_reserved == 130 * MiB


# ----- the loading order --------------------------------------------------------------------
def test_tensors_load_in_transformers_natural_order():
    import transformers.core_model_loading as loading

    names = ["model.layers.10.mlp.up_proj.weight", "lm_head.weight", "model.layers.2.x", "model.a"]
    assert sorted(names, key=natural_key) == sorted(names, key=loading.dot_natural_key)


# ----- estimate against transformers' from_pretrained on CPU ---------------------------------
SMALL = {
    "llama": dict(
        family="llama", n_layers=2, hidden_size=256, n_heads=4, n_kv_heads=4,
        intermediate_size=688, vocab_size=4096,
    ),
    "qwen": dict(
        family="qwen2", n_layers=2, hidden_size=256, n_heads=8, n_kv_heads=2,
        intermediate_size=704, vocab_size=4096, attention_bias="qkv",
    ),
    "wide": dict(
        family="llama", n_layers=4, hidden_size=512, n_heads=8, n_kv_heads=8,
        intermediate_size=1408, vocab_size=1000,
    ),
}  # fmt: skip
CASES = [
    ("llama", dict()),
    ("llama", dict(double_quant=False)),
    ("qwen", dict()),
    ("wide", dict()),
    ("llama", dict(method="lora")),
    ("llama", dict(method="full", precision="bf16-mixed")),
]


@pytest.mark.parametrize(("family", "kw"), CASES, ids=lambda x: str(x))
def test_loading_estimate_against_from_pretrained(family, kw):
    pytest.importorskip("transformers")
    if kw.get("method", "qlora") == "qlora":
        pytest.importorskip("bitsandbytes")
    from lessonkit.memory.loading_measure import measure_loading
    from lessonkit.models.spec import ModelSpec

    spec = ModelSpec(name=f"small-{family}", **SMALL[family])
    s = run_settings(spec, **kw)
    step = lessonkit.estimate(spec, device="cuda", **{"method": "qlora", **kw})
    estimated = step.loading
    measured = measure_loading(spec, s)
    # the warm-up block is transformers' own get_total_byte_count, to the byte
    assert estimated.warmup_bytes == measured.warmup_bytes
    # the peak allocated while loading, and the weights once loaded: within 0.1% (the small
    # code tables bitsandbytes makes on the first quantization), as the caching allocator's
    # reserve after loading
    for name in ("peak_allocated_bytes", "weight_bytes"):
        error = getattr(estimated, name) / getattr(measured, name) - 1
        assert abs(error) <= 0.001, (name, getattr(estimated, name), getattr(measured, name))
    assert estimated.reserved_bytes == measured.reserved_bytes
    assert estimated.peak_tensor == "" or estimated.peak_tensor.endswith(".weight")


def test_the_loaded_weights_are_the_steps_weights():
    """What loading leaves is the step's weights without the adapters peft adds afterwards."""
    for method in ("full", "lora", "qlora"):
        report = lessonkit.estimate("llama-2-7b", method=method)
        estimated = report.settings["estimated"]
        adapters = 0 if method == "full" else 4 * estimated["trainable_parameters"]
        assert report.loading.weight_bytes + adapters == estimated["weight_bytes"], method


@pytest.mark.parametrize("model", ["llama-2-7b", "llama-3.1-8b"])
def test_loading_a_7b_shape_with_bitsandbytes_own_quantization(model):
    """At full size, the same order replayed on fake tensors with bitsandbytes'
    quantize_4bit (its fake kernels allocate what its CUDA kernels do)."""
    pytest.importorskip("bitsandbytes")
    spec = resolve_model(model)
    s = run_settings(spec)
    estimated, replayed = estimate_loading(spec, s), replay_loading(spec, s)
    assert estimated.peak_allocated_bytes == replayed.peak_allocated_bytes
    assert estimated.weight_bytes == replayed.weight_bytes
    assert estimated.reserved_bytes == replayed.reserved_bytes


def test_qlora_loading_of_llama_2_7b():
    """The 16-bit copy of the last MLP weight being quantized is loading's peak, above the
    warm-up block (which counts 0.5 bytes per 4-bit parameter, without the absmax)."""
    report = lessonkit.estimate("llama-2-7b", method="qlora")
    load = report.loading
    up_proj = 2 * 11008 * 4096
    assert load.peak_tensor == "model.layers.31.mlp.up_proj.weight"
    assert load.peak_moment["temporaries"] >= up_proj
    assert load.warmup_bytes < load.weight_bytes < load.peak_allocated_bytes
    assert load.peak_allocated_bytes - load.weight_bytes < 2 * up_proj
    assert 3.6 * GiB < load.peak_allocated_bytes < 3.7 * GiB
    assert load.peak_allocated_bytes <= load.reserved_bytes < load.peak_allocated_bytes + 0.2 * GiB


# ----- in the report -------------------------------------------------------------------------
def test_reserved_over_the_run_is_the_higher_of_loading_and_the_step():
    import dataclasses

    for kw in (dict(method="qlora", seq_len=16), dict(method="qlora", batch_size=8), {}):
        report = lessonkit.estimate("llama-2-7b", **kw)
        expected = max(report.loading.reserved_bytes, report.reserved_bytes)
        assert report.run_reserved_bytes == expected
        assert report.to_dict()["run_reserved_bytes"] == expected
        # transformers' loader leaves less reserved than the step needs: the step sets it
        assert "the step's reserve" in str(report)
    short = lessonkit.estimate("llama-2-7b", method="qlora", seq_len=16)
    text = str(short)
    assert "Loading (before step)" in text
    assert f"{short.loading.peak_allocated_bytes / GiB:.2f} GiB" in text
    assert f"{short.loading.reserved_bytes / GiB:.2f} GiB stays reserved" in text
    # a loader that reserves more than the step (torchtune's 9.13 GB, say) sets the figure
    bigger = dataclasses.replace(short.loading, reserved_bytes=2 * short.reserved_bytes)
    loaded_first = dataclasses.replace(short, loading_source=bigger)
    assert loaded_first.run_reserved_bytes == 2 * short.reserved_bytes
    assert "loading's reserve" in str(loaded_first)
    assert short.to_dict()["loading"]["peak_tensor"] == short.loading.peak_tensor
    html = short._repr_html_()
    assert f"{short.loading.reserved_bytes / GiB:.2f} GiB stays reserved" in html


def test_no_loading_moment_under_zero_3():
    report = lessonkit.estimate("llama-2-7b", n_gpus=8, zero_stage=3)
    assert report.loading is None and report.run_reserved_bytes == report.reserved_bytes
    assert "Loading (before step)" not in str(report)
    assert "loading" not in report.timeline.phases
