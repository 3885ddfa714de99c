"""LitGPT's published runs reproduced with LitGPT's own model: prints each run's tensor peak.

tests/published_runs.json compares the estimate with runs LitGPT published, and explains the gap
of two of its sources by running the code that produced them. This script is that run. For each
LoRA/QLoRA row of those sources it builds litgpt's own GPT with LoRA (litgpt/lora.py), on the
CPU under FakeTensorMode (shapes and dtypes only: no data, no GPU, seconds per step), runs the
part of LitGPT's training loop that sets the peak, follows every tensor storage with lessonkit's
tracker (lessonkit/memory/tracking.py) and prints the peak next to the published figure and the
estimate:

- litgpt-config-hub-2024 (one A10G): LitGPT 0.4.9's fit() (litgpt/finetune/lora.py): two
  micro-batches of gradient accumulation, `logits` (and through it the autograd graph) held
  until the next forward returns. QLoRA rows replace every nn.Linear, the head included, as
  Lightning's BitsandbytesPrecision does, by a layer with the memory behaviour of bitsandbytes
  0.42.0's Linear4bit (the version litgpt 0.4.5-0.4.12 pin; it cannot run without CUDA, and
  later versions free the layer's input, so it is emulated below). With --explain, QLoRA rows
  also print the steps from one fresh step with a bf16 head to the reproduced peak.
- litgpt-config-hub-2024-09 (one A10G): the same for the Llama 3.2 rows, whose models litgpt
  0.4.9 predates: built from the Llama 3.2 configs of litgpt's commit 00af8b0d (LITGPT_CONFIGS).
- litgpt-2023-multi-gpu (2 or 4 A100s): lit-gpt's October 2023 finetune/lora.py under Lightning
  2.1.0's FSDPStrategy: PyTorch's FSDP1 with the arguments Lightning passes (use_orig_params=True
  among them), on a fake process group (rank 0), through the checkpoint load, the validation
  sanity check and five micro-batches (accumulation cycles of 3, no_sync while accumulating),
  every micro-batch of the longest Alpaca example's length, then again with the later ones of
  256 tokens. How many of the previous micro-batch's unsharded block gradients are still held
  when the last backward makes its new ones varies from run to run (by whole blocks, with the
  same program and settings), so each configuration runs --repeats times and prints the range.
  With --extra, also without no_sync and 13B on 2 GPUs.

Needs litgpt 0.4.9, which is NOT a dependency of lessonkit. In lessonkit's measuring environment
(`pip install -e ".[measure]"`, which brings torch and transformers) add:
    pip install --no-deps litgpt==0.4.9 lightning==2.4.0 lightning-utilities==0.15.3 torchmetrics==1.9.0
Figures were checked with torch 2.13.0 (CPU build).

Usage: python benchmarks/reproduce_litgpt.py [--source hub|hub-llama-3.2|fsdp] [--model NAME]
           [--micro-batch N] [--explain] [--extra] [--repeats N]
  e.g. `--source hub --explain` (about 35 s on 2 CPU cores: 3 s a run) or
  `--source fsdp --model llama-2-7b --micro-batch 1 --repeats 1` (about 40 s: 15-25 s a run);
  everything, `--explain --extra`, about 11 min.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import json
import math
import sys
import time
from pathlib import Path
from typing import ClassVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from lessonkit.memory.tracking import Tracker, storage_keys  # noqa: E402
from tests.memory.test_published_runs import estimated_gb  # noqa: E402

LITGPT = "0.4.9"
INSTALL = (
    "pip install --no-deps litgpt==0.4.9 lightning==2.4.0 lightning-utilities==0.15.3 "
    "torchmetrics==1.9.0"
)
SOURCES = {
    "hub": "litgpt-config-hub-2024",
    "hub-llama-3.2": "litgpt-config-hub-2024-09",
    "fsdp": "litgpt-2023-multi-gpu",
}
LITGPT_NAMES = {
    "llama-2-7b": "Llama-2-7b-hf",
    "llama-2-13b": "Llama-2-13b-hf",
    "mistral-7b": "Mistral-7B-v0.1",
    "llama-3.1-8b": "Llama-3.1-8B",
}
# rows whose model is a config dict (LitGPT's untied lm_head) named by its Hub id
LITGPT_HUB_NAMES = {"google/gemma-2b": "Gemma-2b", "google/gemma-2-2b": "Gemma-2-2b"}
# Llama 3.2, which litgpt 0.4.9 predates: litgpt/config.py at commit 00af8b0d (Lightning-AI/litgpt
# #1750), an untied lm_head; the rows' models are config dicts named by their Hub id
LITGPT_CONFIGS = {
    f"meta-llama/Llama-3.2-{size}": dict(
        name=f"Llama-3.2-{size}",
        block_size=8192,
        vocab_size=128000,
        padded_vocab_size=128256,
        n_layer=layers,
        n_embd=width,
        n_head=heads,
        n_query_groups=8,
        rotary_percentage=1.0,
        parallel_residual=False,
        bias=False,
        norm_class_name="RMSNorm",
        mlp_class_name="LLaMAMLP",
        intermediate_size=8192,
        rope_base=500000,
    )
    for size, layers, width, heads in (("1B", 16, 2048, 32), ("3B", 28, 3072, 24))
}
ALPACA_LONGEST = 1304  # the 2023 tables' model.max_seq_length: the longest Llama 2 Alpaca example
LATER_LENGTH = 256  # a later micro-batch: random Alpaca samples, mostly far shorter
FSDP_CYCLE, FSDP_MICRO_BATCHES = 3, 5  # two accumulation cycles: no_sync before and after a step


def require_litgpt() -> None:
    """Exit with one line saying how to install litgpt when it is missing or another version."""
    try:
        import litgpt.lora
        import litgpt.utils  # noqa: F401

        version = importlib.metadata.version("litgpt")
    except ImportError as exc:
        raise SystemExit(
            f"reproduce_litgpt.py needs litgpt {LITGPT} (not a dependency of "
            f"lessonkit; missing {exc.name}): {INSTALL}"
        ) from None
    if version != LITGPT:
        raise SystemExit(f"reproduce_litgpt.py needs litgpt {LITGPT}, found {version}: {INSTALL}")


# ----- bitsandbytes 0.42.0's 4-bit layer, its memory behaviour on any device ------------------


class MatMul4bit(torch.autograd.Function):
    """bitsandbytes 0.42.0 autograd/_functions.py MatMul4Bit, by what it allocates and keeps.

    forward: F.dequantize_4bit allocates the whole weight in quant_state.dtype (functional.py:
    torch.empty(quant_state.shape, dtype=quant_state.dtype)), fp16 here, then `.to(A.dtype)`
    copies it to bf16 for F.linear; the fp16 copy, a temporary of that one expression
    (`linear(A, dequantize_4bit(B, state).to(A.dtype).t(), bias)`), is freed before F.linear
    allocates its output, as here. The input is kept as `ctx.tensors = (A, B)`, a ctx attribute
    and not save_for_backward, so backward does not free it: it lives as long as the graph
    (0.43.2 and later keep `(None, B)`). backward dequantizes again, to fp16 then
    grad_output's dtype, for grad_A; no gradient for the frozen weight.
    """

    kept: ClassVar[set[int]] = set()  # storages of the inputs kept so far, for the breakdown

    @staticmethod
    def forward(ctx, x: torch.Tensor, packed: torch.Tensor, layer: Linear4bit) -> torch.Tensor:
        ctx.layer = layer
        ctx.tensors = (x, packed) if any(ctx.needs_input_grad[:2]) else (None, None)
        if ctx.tensors[0] is not None:
            MatMul4bit.kept.update(storage_keys([x]))
        return F.linear(x, layer.dequantized().to(x.dtype))

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> tuple:
        return grad_output @ ctx.layer.dequantized().to(grad_output.dtype), None, None


class Linear4bit(nn.Module):
    """An NF4 layer as Lightning's _NF4Linear (bnb.nn.Linear4bit, compress_statistics=False)
    holds it after quantizing: packed uint8 weight ((n + 1) // 2, 1) and fp32 absmax per block of
    64 (bitsandbytes 0.42.0 functional.py quantize_4bit) and the 16-value code; compute dtype bf16
    (BitsandbytesPrecision.convert_module sets it to the precision's dtype)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        n = in_features * out_features
        self.weight = nn.Parameter(
            torch.empty((n + 1) // 2, 1, dtype=torch.uint8), requires_grad=False
        )
        self.register_buffer("absmax", torch.empty(math.ceil(n / 64), dtype=torch.float32))
        self.register_buffer("code", torch.empty(16, dtype=torch.float32))

    def dequantized(self) -> torch.Tensor:
        # Lightning 2.3.3/2.4.0 _Linear4bit.quantize quantizes `weight.to(dtype=torch.half)`, so
        # quant_state.dtype, the dtype dequantize_4bit returns, is fp16
        return torch.empty(self.out_features, self.in_features, dtype=torch.float16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # bitsandbytes 0.42.0 nn/modules.py Linear4bit.forward: input to the compute dtype,
        # matmul_4bit (MatMul4Bit in training: the gemv path needs a single token without grad),
        # output back to the input's dtype
        dtype = x.dtype
        return MatMul4bit.apply(x.to(torch.bfloat16), self.weight, self).to(dtype)


def quantize_every_linear(module: nn.Module) -> None:
    """Lightning 2.3.3/2.4.0 lightning/fabric/plugins/precision/bitsandbytes.py _convert_layers:
    every nn.Linear child, at any depth and the lm_head's included (no ignore_modules in
    LitGPT), becomes the 4-bit layer; LoRA's own A and B are parameters, not Linear modules."""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, Linear4bit(child.in_features, child.out_features))
        else:
            quantize_every_linear(child)


# ----- running and reading the tracker -------------------------------------------------------


def litgpt_model(settings: dict, bf16_head: bool = False) -> nn.Module:
    """litgpt's GPT with LoRA as the row sets it (query and value), created as
    fabric.init_module does (meta device, bf16), 4-bit layers for QLoRA."""
    from litgpt.lora import GPT, Config, mark_only_lora_as_trainable

    model = settings["model"]
    targets = set(settings["lora_targets"])
    lora_settings = dict(
        lora_r=settings["lora_rank"],
        lora_alpha=16,
        lora_dropout=settings["lora_dropout"],
        lora_query="q_proj" in targets,
        lora_key="k_proj" in targets,
        lora_value="v_proj" in targets,
        lora_projection="o_proj" in targets,
        lora_mlp=bool(targets & {"gate_proj", "up_proj", "down_proj"}),
        lora_head="lm_head" in targets,
    )
    if isinstance(model, dict) and model["name_or_path"] in LITGPT_CONFIGS:
        config = Config(**LITGPT_CONFIGS[model["name_or_path"]], **lora_settings)
    elif isinstance(model, dict):
        config = Config.from_name(LITGPT_HUB_NAMES[model["name_or_path"]], **lora_settings)
    else:
        config = Config.from_name(LITGPT_NAMES[model], **lora_settings)
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            model = GPT(config)
    finally:
        torch.set_default_dtype(torch.float32)
    if settings["method"] == "qlora":
        head = model.lm_head.linear
        quantize_every_linear(model)
        if bf16_head:
            model.lm_head.linear = head
    mark_only_lora_as_trainable(model)
    return model


def forward(model: nn.Module, ids: torch.Tensor) -> list[torch.Tensor]:
    """Fabric's forward with bf16-true: bf16 default dtype inside (forward_context), outputs
    converted to the default dtype, fp32, after it (convert_output); lm_head in 128-token chunks."""
    torch.set_default_dtype(torch.bfloat16)
    try:
        out = model(ids, lm_head_chunk_size=128)
    finally:
        torch.set_default_dtype(torch.float32)
    return [o.float() for o in out]


def peak_of(tracker: Tracker) -> tuple[int, int]:
    """(bytes, event number) of the tracker's peak."""
    _, at = tracker.peaks()
    return sum(delta for delta, _ in tracker.events[: at + 1]), at


def phase_peaks(tracker: Tracker) -> dict[str, int]:
    levels: dict[str, int] = {}
    for phase, level in tracker.peaks()[0]:
        levels[phase] = max(levels.get(phase, 0), level)
    return levels


def gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f}"


# ----- litgpt-config-hub-2024: one GPU, LitGPT 0.4.9's fit() -----------------------------------


def single_gpu_run(settings: dict, micro_batches: int = 2, bf16_head: bool = False) -> dict:
    """Micro-batches of LitGPT 0.4.9's fit() without an optimizer step (the row accumulates 4
    or 8). Returns the peak, the phase peaks and, at the peak, what the earlier micro-batch
    left: the kept inputs of the 4-bit layers, fp32 logits, the rest (LoRA gradients)."""
    from litgpt.utils import chunked_cross_entropy
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = litgpt_model(settings, bf16_head)
    vocab = model.config.padded_vocab_size
    batch, length = settings["batch_size"], settings["seq_len"]
    MatMul4bit.kept.clear()
    tracker = Tracker()
    with FakeTensorMode(allow_non_fake_inputs=True):
        model.to_empty(device="cpu")
        model.max_seq_length = length  # fit(): min(longest example, train.max_seq_length)
        model.train()
        for t in [*model.parameters(), *model.buffers()]:
            tracker.add(t)
        tracker.weight_keys = set(tracker.live)
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=2e-4)
        for p in trainable:  # create the two states, as the first step does
            p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad()
        # the two states; the step counters live on the host (capturable=False)
        states = [
            s
            for state in optimizer.state.values()
            for s in state.values()
            if isinstance(s, torch.Tensor) and s.dim()
        ]
        if settings["method"] == "qlora":
            # PagedAdamW: bitsandbytes 0.42.0 optim/optimizer.py get_state_buffer pages the
            # state of every tensor of 1e5 elements or more (cudaMallocManaged, outside
            # torch.cuda.max_memory_allocated)
            tracker.ignored |= storage_keys(s for s in states if s.numel() >= 1e5)
        for s in states:
            tracker.add(s)
        ids = torch.randint(0, vocab, (batch, length))
        targets = torch.randint(0, vocab, (batch, length))
        tracker.add(ids)
        tracker.add(targets)
        starts = []
        with tracker:
            for i in range(1, micro_batches + 1):
                starts.append(len(tracker.events))
                tracker.set_phase(f"forward{i}")
                logits = forward(model, ids)  # the previous logits die only now
                logits[-1] = logits[-1][..., :-1, :]
                tracker.set_phase(f"backward{i}")
                loss = chunked_cross_entropy(logits, targets[..., 1:])
                (loss / settings["gradient_accumulation"]).backward()
                loss = loss.detach()  # running_loss.update(loss.detach()); .item() follows
        peak, at = peak_of(tracker)
        carried = {"inputs": 0, "logits": 0, "other": 0}
        for r in tracker.alive_at(at):
            if r.key in tracker.weight_keys or not starts[0] <= r.born < starts[-1]:
                continue
            if r.key in MatMul4bit.kept:
                carried["inputs"] += r.nbytes
            elif r.shape[-1:] == (vocab,) and r.nbytes == 4 * math.prod(r.shape):
                carried["logits"] += r.nbytes
            else:
                carried["other"] += r.nbytes
    return {
        "peak": peak,
        "phase": tracker.phases[tracker.events[at][1]],
        "levels": phase_peaks(tracker),
        "carried": carried,
    }


def hub_row(row: dict, explain: bool) -> None:
    settings = row["settings"]
    start = time.perf_counter()
    run = single_gpu_run(settings)
    print(
        f"{row['label']}: reproduced {gb(run['peak'])} GB (in {run['phase']}), "
        f"published {row['published_gb']:.2f}, estimated {estimated_gb(row):.2f} "
        f"[{time.perf_counter() - start:.0f} s]"
    )
    if not (explain and settings["method"] == "qlora"):
        return
    bf16_head = single_gpu_run(settings, micro_batches=1, bf16_head=True)["peak"]
    fresh = single_gpu_run(settings, micro_batches=1)
    carried = run["carried"]
    print(
        f"  one fresh step, bf16 head: {gb(bf16_head)} GB; with the 4-bit head: "
        f"{gb(fresh['peak'])} GB (the forward's end {gb(fresh['levels']['forward1'])}, "
        f"the backward's peak {gb(fresh['levels']['backward1'])})"
    )
    print(
        f"  the previous micro-batch, live at the peak: {gb(sum(carried.values()))} GB "
        f"(4-bit layers' kept inputs {gb(carried['inputs'])}, fp32 logits "
        f"{gb(carried['logits'])}, the rest, its LoRA gradients, {gb(carried['other'])})"
    )


# ----- litgpt-2023-multi-gpu: FSDP1 as Lightning 2.1.0 sets it up -----------------------------


def fsdp_run(settings: dict, later_length: int = 0, no_sync: bool = True) -> dict:
    """Rank 0's tensor peak over the checkpoint load, the validation and the micro-batches."""
    import torch.distributed as dist
    from litgpt.lora import Block
    from litgpt.utils import chunked_cross_entropy
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )
    from torch.distributed.fsdp import (
        CPUOffload,
        FullStateDictConfig,
        MixedPrecision,
        ShardingStrategy,
        StateDictType,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=settings["n_gpus"], store=FakeStore())
    try:
        model = litgpt_model(settings)
        vocab = model.config.padded_vocab_size
        checkpoint = {k: v.shape for k, v in model.state_dict().items() if "lora_" not in k}

        def materialize(module: nn.Module) -> None:  # FSDP1 _materialize_meta_module
            module.to_empty(device="cpu", recurse=False)
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()

        def micro_batch(length: int) -> tuple[torch.Tensor, torch.Tensor]:
            ids = torch.randint(0, vocab, (settings["batch_size"], length))
            return ids, ids.clone()

        tracker = Tracker()
        with FakeTensorMode(allow_non_fake_inputs=True):
            with tracker:
                tracker.set_phase("wrap")
                # Lightning 2.1.0 lightning/fabric/strategies/fsdp.py, as lit-gpt's
                # finetune/lora.py (commit cc190152) configures it: FSDPStrategy(auto_wrap_policy=
                # {Block}, activation_checkpointing_policy={Block}, state_dict_type="full",
                # limit_all_gathers=True, cpu_offload=False), precision bf16-true; the strategy
                # sets use_orig_params=True (torch >= 2.0), FULL_SHARD and bf16 mixed precision,
                # then wraps each Block in a non-reentrant checkpoint_wrapper
                model = FSDP(
                    model,
                    cpu_offload=CPUOffload(offload_params=False),
                    mixed_precision=MixedPrecision(torch.bfloat16, torch.bfloat16, torch.bfloat16),
                    sharding_strategy=ShardingStrategy.FULL_SHARD,
                    device_id=torch.device("cpu"),
                    auto_wrap_policy=ModuleWrapPolicy({Block}),
                    limit_all_gathers=True,
                    use_orig_params=True,
                    param_init_fn=materialize,
                )
                apply_activation_checkpointing(
                    model,
                    auto_wrap_policy=ModuleWrapPolicy({Block}),
                    checkpoint_wrapper_fn=functools.partial(
                        checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT
                    ),
                )
                trainable = [p for p in model.parameters() if p.requires_grad]
                # foreach: PyTorch's default for CUDA tensors
                optimizer = torch.optim.AdamW(trainable, lr=3e-4, weight_decay=0.01, foreach=True)
            # fabric.load_raw: the full state dict (offload_to_cpu=True, rank0_only=False) of
            # lit_model.pth, loaded lazily into host memory (not counted)
            full = {k: torch.empty(shape, dtype=torch.bfloat16) for k, shape in checkpoint.items()}
            tracker.ignored |= storage_keys(full.values())
            with tracker:
                tracker.set_phase("load")
                with FSDP.state_dict_type(
                    model,
                    StateDictType.FULL_STATE_DICT,
                    FullStateDictConfig(offload_to_cpu=True, rank0_only=False),
                ):
                    model.load_state_dict(full, strict=False)
            del full
            with tracker:
                tracker.set_phase("validate")  # fit()'s sanity check: 2 validation batches
                model.eval()
                with torch.no_grad():
                    for _ in range(2):
                        ids, targets = micro_batch(ALPACA_LONGEST)
                        logits = forward_whole(model, ids)
                        chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:], chunk_size=0)
                        del logits
                model.train()
                for i in range(FSDP_MICRO_BATCHES):
                    accumulating = (i + 1) % FSDP_CYCLE != 0
                    ids, targets = micro_batch(
                        ALPACA_LONGEST if i == 0 or not later_length else later_length
                    )
                    sync = model.no_sync() if accumulating and no_sync else contextlib.nullcontext()
                    with sync:  # fabric.no_backward_sync(model, enabled=is_accumulating)
                        tracker.set_phase(f"forward{i + 1}")
                        logits = forward(model, ids)
                        logits[-1] = logits[-1][..., :-1, :]
                        loss = chunked_cross_entropy(logits, targets[..., 1:])
                        tracker.set_phase(f"backward{i + 1}")
                        (loss / FSDP_CYCLE).backward()
                    if not accumulating:
                        tracker.set_phase(f"step{i + 1}")
                        optimizer.step()
                        optimizer.zero_grad()
                    loss = loss.detach()
                tracker.set_phase("end")
            peak, at = peak_of(tracker)
            born: dict[str, int] = {}
            for r in tracker.alive_at(at):
                born[r.phase] = born.get(r.phase, 0) + r.nbytes
    finally:
        dist.destroy_process_group()
    return {
        "peak": peak,
        "phase": tracker.phases[tracker.events[at][1]],
        "levels": phase_peaks(tracker),
        "born": born,
    }


def forward_whole(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """validate(): one forward without chunks, output converted to fp32 as convert_output does."""
    torch.set_default_dtype(torch.bfloat16)
    try:
        out = model(ids)
    finally:
        torch.set_default_dtype(torch.float32)
    return out.float()


def fsdp_line(label: str, settings: dict, repeats: int, **options: object) -> None:
    """One FSDP configuration, run `repeats` times: how many of the previous micro-batch's
    unsharded block gradients are still held when the last backward makes its new ones varies
    from run to run (by whole blocks), so the peak is given as a range."""
    start = time.perf_counter()
    runs = [fsdp_run(settings, **options) for _ in range(repeats)]
    peaks = sorted(run["peak"] for run in runs)
    top = max(runs, key=lambda run: run["peak"])
    levels = top["levels"]
    kept = sorted(run["born"].get(f"backward{FSDP_MICRO_BATCHES - 1}", 0) for run in runs)
    print(
        f"  {label}: {gb(peaks[0])}-{gb(peaks[-1])} GB over {repeats} runs "
        f"({', '.join(gb(p) for p in peaks)}), in {top['phase']} "
        f"[{(time.perf_counter() - start) / repeats:.0f} s a run]; load {gb(levels['load'])}, "
        f"validate {gb(levels['validate'])}; at the peak the previous micro-batch's "
        f"gradients {gb(kept[0])}-{gb(kept[-1])}; live at the highest peak, by phase made: "
        + ", ".join(f"{phase} {gb(n)}" for phase, n in top["born"].items() if n >= 5e6)
    )


def fsdp_row(row: dict, repeats: int) -> None:
    settings = row["settings"]
    print(f"{row['label']}: published {row['published_gb']:.2f}, estimated {estimated_gb(row):.2f}")
    fsdp_line(f"every micro-batch {ALPACA_LONGEST} tokens", settings, repeats)
    fsdp_line(
        f"the first {ALPACA_LONGEST}, the later {LATER_LENGTH}",
        settings,
        repeats,
        later_length=LATER_LENGTH,
    )


def fsdp_extra(rows: list[dict], repeats: int) -> None:
    print("Without no_sync (every micro-batch synchronised):")
    for row in rows:
        if row["settings"]["batch_size"] == 1:
            fsdp_line(row["label"], row["settings"], repeats, no_sync=False)
    print(f"llama-2-13b on 2 GPUs (the tables: OOM), the later micro-batches {LATER_LENGTH}:")
    for row in rows:
        if row["settings"]["model"] == "llama-2-13b":
            fsdp_line(
                row["label"].replace("4 x A100", "2 x A100"),
                dict(row["settings"], n_gpus=2),
                repeats,
                later_length=LATER_LENGTH,
            )


def litgpt_name(model: str | dict) -> str | None:
    """The row's model as --model names it, or None where litgpt is not set up for it."""
    if isinstance(model, dict):
        hub_id = model.get("name_or_path", "")
        known = hub_id in LITGPT_CONFIGS or hub_id in LITGPT_HUB_NAMES
        return hub_id.split("/")[-1].lower() if known else None
    return model if model in LITGPT_NAMES else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--source",
        choices=sorted(SOURCES),
        action="append",
        help="hub: litgpt-config-hub-2024, hub-llama-3.2: litgpt-config-hub-2024-09, "
        "fsdp: litgpt-2023-multi-gpu (default: all)",
    )
    parser.add_argument(
        "--model",
        choices=sorted(
            [
                *LITGPT_NAMES,
                *(n.split("/")[-1].lower() for n in [*LITGPT_CONFIGS, *LITGPT_HUB_NAMES]),
            ]
        ),
        action="append",
        help="only the rows of this model (repeatable)",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="QLoRA rows: the steps from one fresh step to the reproduced peak",
    )
    parser.add_argument(
        "--extra", action="store_true", help="FSDP rows: also without no_sync, and 13B on 2 GPUs"
    )
    parser.add_argument(
        "--micro-batch",
        type=int,
        action="append",
        help="only the rows of this micro-batch size (repeatable)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs of each FSDP configuration (its peak varies between runs)",
    )
    args = parser.parse_args(argv)
    require_litgpt()
    data = json.loads((ROOT / "tests" / "published_runs.json").read_text())
    for short in args.source or sorted(SOURCES):
        rows = [
            r
            for r in data["rows"]
            if r["source"] == SOURCES[short]
            and r["settings"]["method"] in ("lora", "qlora")
            and litgpt_name(r["settings"]["model"]) is not None
            and (not args.model or litgpt_name(r["settings"]["model"]) in args.model)
            and (not args.micro_batch or r["settings"]["batch_size"] in args.micro_batch)
        ]
        print(f"## {SOURCES[short]} (torch {torch.__version__}, litgpt {LITGPT}); GB = 1e9 bytes")
        for row in rows:
            if short.startswith("hub"):
                hub_row(row, args.explain)
            else:
                fsdp_row(row, args.repeats)
        if short == "fsdp" and args.extra and rows:
            fsdp_extra(rows, args.repeats)


if __name__ == "__main__":
    main()
