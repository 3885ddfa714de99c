"""How close estimate() is to a measured training step, next to the rules people use today.

Runs measure() (FakeTensorMode on CPU) and estimate(device="cpu") on the configurations of
tests/memory/test_accuracy.py plus 7B/8B shapes, and prints a Markdown table: measured tensor peak,
ours, and what these rules would have said, each with its error:

- accelerate: ``accelerate estimate-memory``'s "Training using Adam" column, the largest of
  model / gradients / optimizer / step sizes in accelerate/commands/estimate.py
  (``estimate_training_usage``): 4 x the model size in its dtype (fp32: 16 B/param, fp16/bf16:
  8 B/param), no activations.
- gpu_poor: RahulSChand/gpu_poor src/App.js (``getAllComputedData`` for training): model size
  (2 B/param; QLoRA a quarter), ``getGradOptMemory`` (full Adam 3 x 2 B/param, SGD 2 B/param;
  LoRA/QLoRA fixed per-layer terms), ``getActivationMemory`` x batch (x 0.15 with gradient
  checkpointing); its fixed 650 MiB CUDA overhead is left out here since the measured figure
  is tensors only. Llama-shaped parameter count (vocab x h x 2 + L(4h^2 + 3 h i)).
- EleutherAI: "Transformer Math 101" (blog.eleuther.ai/transformer-math): weights 2 B/param
  (4 in fp32), gradients 2 (4), AdamW 12 B/param (fp32 copy + 2 states; 8 in pure fp32;
  8-bit 6; SGD momentum 8), activations s*b*h*L*(34 + 5*a*s/h) bytes (2*s*b*h*L with
  recomputation); ZeRO-1/2/3 divide states / gradients / weights by the GPU count.
- guide: the lesson's own figures, "~120GB to 160GB" for full fine-tuning of a 7B model, as
  bytes per parameter: 120e9 / 7e9 = 17.1 to 160e9 / 7e9 = 22.9, shown at the midpoint
  (140e9 / 7e9 = 20 B/param) times the model's parameters.

Rows marked † use QLoRA or an 8-bit optimizer: with bitsandbytes installed (the dev extra),
measure() runs bitsandbytes itself on CPU under FakeTensorMode (Linear4bit quantized by
bitsandbytes, AdamW8bit / PagedAdamW8bit steps); without it, stand-ins written from its storage
layout (lessonkit/memory/standins.py), and the summary says which.

The published runs (tests/published_runs.json) follow the grid, from benchmarks/published_runs.py.

Rules that do not model a configuration (LoRA for accelerate and EleutherAI, several GPUs for
accelerate and gpu_poor) show "n/a". Usage: python benchmarks/accuracy.py [--quick] > docs/accuracy.md
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import lessonkit  # noqa: E402
from benchmarks import published_runs  # noqa: E402
from lessonkit.memory.real_bitsandbytes import bitsandbytes  # noqa: E402
from lessonkit.models.presets import resolve_model  # noqa: E402
from lessonkit.models.spec import ModelSpec  # noqa: E402
from tests.memory.test_accuracy import GRID, LARGE, SPECS  # noqa: E402

MiB, GiB = 2**20, 2**30


def _settings(kw: dict) -> dict:
    base = dict(
        method="full",
        precision="bf16-mixed",
        optimizer="adamw",
        batch_size=1,
        seq_len=512,
        gradient_checkpointing=False,
        n_gpus=1,
        zero_stage=0,
    )
    return base | kw


def accelerate_rule(spec: ModelSpec, kw: dict) -> float | None:
    s = _settings(kw)
    if s["method"] != "full" or s["n_gpus"] > 1:
        return None
    dtype_bytes = 4 if s["precision"] == "fp32" else 2
    return 4 * dtype_bytes * spec.n_params


def gpu_poor_rule(spec: ModelSpec, kw: dict) -> float | None:
    s = _settings(kw)
    if s["n_gpus"] > 1:
        return None
    h, i, layers, v, heads = (
        spec.hidden_size,
        spec.intermediate_size,
        spec.n_layers,
        spec.vocab_size,
        spec.n_heads,
    )
    n = v * h * 2 + layers * 4 * h * h + layers * 3 * i * h
    fb, length, batch = 2, s["seq_len"], s["batch_size"]
    model = n * fb
    if s["method"] == "qlora":
        model = model / 4 - n * 2 / 64 + 0.06 * model
    attn = (
        length * h * 3 * fb
        + length * h * 2 * fb
        + length**2 * heads * fb
        + length**2 * heads * 4
        + length**2 * heads * fb
        + 3 * length * h * fb
    )
    ffn = 2 * h * length * fb + 5 * fb * length * i + i * length * fb
    norm = length * 4 * 2 + length * h * fb * 6
    act = (attn + ffn + norm) * layers * batch
    if s["gradient_checkpointing"]:
        act *= 0.15
    adam = not s["optimizer"].startswith("sgd")
    if s["method"] == "full":
        grad_opt = n * (3 if adam else 1) * fb
    elif s["method"] == "lora":
        grad_opt = layers * 8 * h * 2 * 4 * (3 * 2 if adam else 2)
    else:
        common = (10 * h + 5 * h + 4 * i + 2 * i) * layers
        extra = 0.75 * common * 50 * (math.sqrt(length / 50) if length > 50 else 1.0)
        grad_opt = layers * 8 * h * 0.5 * 4 * (3 if adam else 1) + extra * batch
    return model + grad_opt + act


def eleuther_rule(spec: ModelSpec, kw: dict) -> float | None:
    s = _settings(kw)
    if s["method"] != "full":
        return None
    n, gpus, zero = spec.n_params, s["n_gpus"], s["zero_stage"]
    fp32 = s["precision"] == "fp32"
    weights = (4 if fp32 else 2) * n
    grads = (4 if fp32 else 2) * n
    states = {"adamw-8bit": 6, "paged-adamw-8bit": 6, "sgd": 4, "sgd-momentum": 8}.get(
        s["optimizer"], 12
    )
    if fp32:
        states -= 4  # no separate fp32 copy
    optimizer = states * n
    if zero >= 1:
        optimizer /= gpus
    if zero >= 2:
        grads /= gpus
    if zero >= 3:
        weights /= gpus
    sq, b, h, layers, a = (
        s["seq_len"],
        s["batch_size"],
        spec.hidden_size,
        spec.n_layers,
        spec.n_heads,
    )
    if s["gradient_checkpointing"]:
        act = 2 * sq * b * h * layers
    else:
        act = sq * b * h * layers * (34 + 5 * a * sq / h)
    return weights + grads + optimizer + act


GUIDE_GB_FOR_7B = (120e9, 160e9)  # "Total needed for training: ~120GB to 160GB!"
GUIDE_BYTES_PER_PARAM = [gb / 7e9 for gb in GUIDE_GB_FOR_7B]  # 17.1 .. 22.9
GUIDE_LABEL = (
    f"guide ~120-160 GB per 7B ({GUIDE_BYTES_PER_PARAM[0]:.0f}-"
    f"{GUIDE_BYTES_PER_PARAM[1]:.0f} B/param)"
)


def guide_rule(spec: ModelSpec, kw: dict) -> float | None:
    s = _settings(kw)
    if s["method"] != "full" or s["n_gpus"] > 1:
        return None
    return statistics.mean(GUIDE_BYTES_PER_PARAM) * spec.n_params


RULES = {
    "accelerate": accelerate_rule,
    "gpu_poor": gpu_poor_rule,
    "EleutherAI": eleuther_rule,
    GUIDE_LABEL: guide_rule,
}
STAND_IN = "†"


def uses_stand_ins(kw: dict) -> bool:
    """QLoRA's 4-bit layers and the 8-bit optimizers are CPU stand-ins in measure()."""
    return kw.get("method") == "qlora" or kw.get("optimizer", "").endswith("8bit")


def describe(kw: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in kw.items())


def _a100() -> tuple[str, int]:
    """The 80 GB A100 of the guide's table: its name and the memory PyTorch sees on it."""
    gpu = lessonkit.get_gpu("A100 80GB")
    return gpu.name, gpu.usable_bytes


def guide_case() -> None:
    """The lesson's case: a 7B model, full fine-tuning in 16-bit, next to '~120-160 GB'."""
    name, usable = _a100()
    low, high = (gb / GiB for gb in GUIDE_GB_FOR_7B)
    print("## The guide's case: 7B, full fine-tuning, 16-bit\n")
    print(
        'The guide says: "Total needed for training: ~120GB to 160GB" (decimal GB: '
        f"{low:.1f}-{high:.1f} GiB) and its table puts full SFT of a 7B model on one 80 GB A100, "
        f"{usable / GiB:.2f} GiB as PyTorch sees it. On one GPU (llama-2-7b shape, batch 1 x "
        "512, CUDA context and allocator margin included; GiB, 2**30 bytes):\n"
    )
    print(
        f"| precision / optimizer | weights + gradients + states | peak per GPU | fits an {name} |"
    )
    print("|---|---|---|---|")
    for precision, optimizer in [
        ("bf16-mixed", "adamw"),
        ("bf16-mixed", "adamw-fused"),
        ("bf16-mixed", "adamw-8bit"),
        ("bf16", "adamw"),
    ]:
        r = lessonkit.estimate("llama-2-7b", precision=precision, optimizer=optimizer)
        est = r.settings["estimated"]
        static = est["weight_bytes"] + est["gradient_bytes"] + est["optimizer_bytes"]
        print(
            f"| {precision} / {optimizer} | {static / GiB:.1f} GiB "
            f"({static / r.model.n_params:.1f} B/param) | {r.total_bytes / GiB:.1f} GiB "
            f"(peak in the {r.peak_phase}) | {'yes' if r.fits(usable) else 'no'} |"
        )
    spec = resolve_model("llama-2-7b")
    peak = lessonkit.estimate(spec, precision="bf16-mixed", optimizer="adamw").total_bytes / GiB
    where = "inside" if low <= peak <= high else "outside"
    print(
        "\nWhy: mixed-precision AdamW keeps fp32 weights, fp32 gradients and two fp32 states, "
        f"16 bytes per parameter = {16 * spec.n_params / GiB:.1f} GiB for "
        f"{spec.n_params / 1e9:.2f}B parameters before any activation; PyTorch's default "
        "(foreach) AdamW step adds one more parameter-sized temporary, so the peak "
        f"({peak:.1f} GiB) lands {where} the guide's range ({low:.1f}-{high:.1f} GiB). One 80 GB "
        "A100 cannot hold it "
        "without sharding (ZeRO / FSDP over several GPUs), optimizer offload or 8-bit states; "
        "pure bf16 training (8 B/param) fits but loses precision in the updates.\n"
    )


def zero3_case() -> None:
    """Full fine-tuning of a 70B model with ZeRO-3 in bf16 mixed precision, per GPU."""
    name, usable = _a100()
    print("## ZeRO-3 with mixed precision: full fine-tuning of Llama-2-70B\n")
    print(
        "`zero_stage=3` with `bf16-mixed` is FSDP's mixed precision (FSDP2 "
        "`MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)`, as "
        "accelerate/Trainer and DeepSpeed ZeRO-3 with bf16 run it): fp32 shards of the "
        "weights, gradients and AdamW states, each layer gathered in bf16 and freed after use. "
        "Autocast over an fp32 FSDP model would instead keep a bf16 copy of every layer's "
        "weights until its backward, about 2 bytes per parameter on every GPU whatever their "
        "number. Batch 1 x 512, foreach AdamW, CUDA context and allocator margin included "
        "(GiB):\n"
    )
    print(f"| GPUs | weights + gradients + states per GPU | peak per GPU | fits an {name} |")
    print("|---|---|---|---|")
    for n in (8, 16, 32, 64):
        r = lessonkit.estimate("llama-2-70b", n_gpus=n, zero_stage=3)
        est = r.settings["estimated"]
        static = est["weight_bytes"] + est["gradient_bytes"] + est["optimizer_bytes"]
        print(
            f"| {n} | {static / GiB:.1f} GiB | {r.total_bytes / GiB:.1f} GiB (peak in the "
            f"{r.peak_phase}) | {'yes' if r.fits(usable) else 'no'} |"
        )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="leave out the 7B/8B shapes")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")

    cases = [(SPECS[f], kw) for f, kw in GRID]
    if not args.quick:
        cases += [(resolve_model(name), kw) for name, kw in LARGE]
    rows, errors, rule_errors = [], [], {name: [] for name in RULES}
    measure_times = []
    for spec, kw in cases:
        start = time.perf_counter()
        measured = lessonkit.measure(spec, device="cpu", **kw)
        measure_times.append(time.perf_counter() - start)
        ours = lessonkit.estimate(spec, device="cpu", **kw)
        m = measured.tensor_bytes
        err = (ours.tensor_bytes - m) / m
        errors.append(abs(err))
        marker = f" {STAND_IN}" if uses_stand_ins(kw) else ""
        cells = [
            spec.name,
            describe(kw) + marker,
            f"{m / MiB:,.1f}",
            f"{ours.tensor_bytes / MiB:,.1f}",
            f"{err:+.2%}",
        ]
        for name, rule in RULES.items():
            value = rule(spec, kw)
            if value is None:
                cells.append("n/a")
            else:
                rule_err = (value - m) / m
                rule_errors[name].append(abs(rule_err))
                cells.append(f"{value / MiB:,.0f} ({rule_err:+.0%})")
        rows.append(cells)

    spec = resolve_model("llama-2-7b")
    n_calls = 2000
    start = time.perf_counter()
    for _ in range(n_calls):
        lessonkit.estimate(spec, batch_size=4, seq_len=1024)
    per_call = (time.perf_counter() - start) / n_calls

    print("# Accuracy of the VRAM calculator\n")
    print(
        "Generated by `python benchmarks/accuracy.py`; the same configurations are asserted by "
        "`tests/memory/test_accuracy.py`.\n"
    )
    print(
        "*Measured* is the peak of live tensors in one steady-state training step, followed "
        "storage by storage under FakeTensorMode on CPU (`lessonkit.measure`); *ours* is "
        '`lessonkit.estimate(..., device="cpu")`. Both leave out the CUDA context and the '
        "allocator margin (on a GPU the estimate adds them from "
        "`lessonkit/data/cuda_constants.json`). Sizes in MiB. The rules' columns show what "
        "each rule would have said and its error against the measurement. The guide gives no "
        'bytes-per-parameter rule, only "~120GB to 160GB" for a 7B model: its column takes '
        f"that as {GUIDE_BYTES_PER_PARAM[0]:.1f}-{GUIDE_BYTES_PER_PARAM[1]:.1f} bytes per "
        f"parameter (120e9 / 7e9 to 160e9 / 7e9) at the midpoint, "
        f"{statistics.mean(GUIDE_BYTES_PER_PARAM):.0f} B/param.\n"
    )
    print(
        "Memory savers that recipes turn on are measured with the code that implements them: "
        "`activation_offload` with the two hooks of `torch.autograd.graph.save_on_cpu` (on "
        "CPU, where save_on_cpu copies nothing, the hooks make the host copies and the "
        "tracker keeps them off the device's figure) and a no-op pair around lm_head and the "
        "chunked loss, which torchtune's and TRL's offloading keep on the device; "
        "`optimizer_in_backward` with one "
        "optimizer per parameter stepped by `register_post_accumulate_grad_hook`, as "
        "torchtune's `optimizer_in_bwd`; `loss=\"chunked\"` with the lines of torchtune's "
        "`CEWithChunkedOutputLoss` (torchtune/modules/loss/ce_chunked_output_loss.py) and "
        "its recipes' chunked model output (torchtune itself is not installed: it needs "
        "torchao). `no_sync` (gradients reduced on the last micro-batch only, what the "
        "Trainer does under FSDP) with FSDP2's own `set_requires_gradient_sync(False)` on "
        "the simulated ranks.\n"
    )
    stand_in_rows = sum(uses_stand_ins(kw) for _, kw in cases)
    print(f"- configurations: {len(rows)}")
    print(
        f"- ours: median |error| {statistics.median(errors):.2%}, "
        f"worst {max(errors):.2%} (targets: median within 2%, every one within 5%)"
    )
    bnb = bitsandbytes()
    if bnb is not None:
        print(
            f"- {STAND_IN} {stand_in_rows} configurations use QLoRA or an 8-bit optimizer: "
            f"measured with bitsandbytes {bnb.__version__} itself on CPU under "
            "FakeTensorMode (its Linear4bit, AdamW8bit and PagedAdamW8bit; paged states fall "
            "back to ordinary ones on CPU); no row uses a stand-in"
        )
    else:
        print(
            f"- {STAND_IN} {stand_in_rows} configurations use QLoRA or an 8-bit optimizer: "
            "bitsandbytes is not installed here, so `measure` runs stand-ins written from its "
            "storage layout (`lessonkit/memory/standins.py`) for all of them; install it (the dev "
            "extra) to measure bitsandbytes itself"
        )
    for name, errs in rule_errors.items():
        if errs:
            print(
                f"- {name}: median |error| {statistics.median(errs):.0%}, worst "
                f"{max(errs):.0%} over the {len(errs)} configurations it models"
            )
    print(
        f"- time per `estimate` call (llama-2-7b, batch 4 x 1024): {per_call * 1e6:.0f} us; "
        f"per `measure` call: median {statistics.median(measure_times):.2f} s, "
        f"longest {max(measure_times):.1f} s\n"
    )
    guide_case()
    zero3_case()
    header = ["model", "settings", "measured", "ours", "error", *RULES]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    print()
    published_runs.main()


if __name__ == "__main__":
    main()
