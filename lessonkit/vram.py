"""estimate(): the GPU memory of one fine-tuning step, phase by phase, in microseconds.

Pure arithmetic (no torch): the weights, gradients and optimizer states are counted tensor by
tensor; the activations are what each operator of the model saves for backward
(activations.py); the peak is the highest of three moments of a steady-state step:

- forward: weights + optimizer states (+ gradients from earlier micro-batches) + every saved
  activation + the logits, their fp32 copy and the log-softmax at the loss;
- backward: at its start the log-softmax's gradient joins the saved activations; then, layer
  by layer, activations are freed while gradients appear; at its end every gradient exists;
- optimizer: weights + gradients + states + the step's own temporaries.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from . import activations as acts
from . import optimizers as opt
from .errors import LessonkitError, choose, positive_int
from .models import ModelSpec, resolve_model
from .options import ATTENTION, DTYPE_BYTES, LORA_DTYPES, METHODS, OPTIMIZERS, PRECISIONS, ZERO_STAGES
from .report import MemoryReport
from .units import GB

DEVICES = ("cuda", "cpu")
MAX_BATCH = 4096
MAX_SEQ = 1_048_576
MAX_RANK = 65536
MAX_GPUS = 1024
MAX_ACCUMULATION = 4096
GPT2_DROPOUT = 0.1  # transformers' GPT2Config default for resid/embd/attn dropout
NF4_BLOCK, NF4_NESTED_BLOCK = 64, 256


@lru_cache(maxsize=1)
def cuda_constants() -> dict[str, Any]:
    """The CUDA context size and allocator margin (lessonkit/data/cuda_constants.json)."""
    text = resources.files("lessonkit").joinpath("data/cuda_constants.json").read_text()
    return json.loads(text)


@dataclass(frozen=True)
class _Settings:
    method: str
    precision: str
    optimizer: str
    batch_size: int
    seq_len: int
    gradient_checkpointing: bool
    lora_rank: int
    lora_targets: tuple[str, ...] | str
    n_gpus: int
    zero_stage: int
    attention: str
    offload_optimizer: bool
    double_quant: bool
    lora_dtype: str
    gradient_accumulation: int
    device: str


def _flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise LessonkitError(f"{what} must be True or False, got {value!r}.")
    return value


def _validate(spec: ModelSpec, kw: dict[str, Any]) -> _Settings:
    zero = kw["zero_stage"]
    if isinstance(zero, bool) or zero not in ZERO_STAGES:
        raise LessonkitError(f"zero_stage must be one of 0, 1, 2, 3, got {zero!r}.")
    targets = kw["lora_targets"]
    if isinstance(targets, list):
        targets = tuple(targets)
    if not (targets == "all-linear" or (isinstance(targets, tuple) and targets
                                        and all(isinstance(t, str) for t in targets))):
        raise LessonkitError(f"lora_targets must be a list of module names (e.g. "
                             f"['q_proj', 'v_proj']) or 'all-linear', got {targets!r}.")
    max_seq = spec.max_positions or MAX_SEQ
    s = _Settings(
        method=choose(kw["method"], METHODS, "method"),
        precision=choose(kw["precision"], PRECISIONS, "precision"),
        optimizer=choose(kw["optimizer"], OPTIMIZERS, "optimizer"),
        batch_size=positive_int(kw["batch_size"], "batch_size", maximum=MAX_BATCH),
        seq_len=positive_int(kw["seq_len"], f"seq_len (for {spec.name})", maximum=max_seq),
        gradient_checkpointing=_flag(kw["gradient_checkpointing"], "gradient_checkpointing"),
        lora_rank=positive_int(kw["lora_rank"], "lora_rank", maximum=MAX_RANK),
        lora_targets=targets,
        n_gpus=positive_int(kw["n_gpus"], "n_gpus", maximum=MAX_GPUS),
        zero_stage=zero,
        attention=choose(kw["attention"], ATTENTION, "attention"),
        offload_optimizer=_flag(kw["offload_optimizer"], "offload_optimizer"),
        double_quant=_flag(kw["double_quant"], "double_quant"),
        lora_dtype=choose(kw["lora_dtype"], LORA_DTYPES, "lora_dtype"),
        gradient_accumulation=positive_int(kw["gradient_accumulation"], "gradient_accumulation",
                                           maximum=MAX_ACCUMULATION),
        device=choose(kw["device"], DEVICES, "device"),
    )
    if s.method != "full":
        spec.lora_shapes(s.lora_targets)  # raises, naming the targets this model has
        if s.lora_rank > spec.hidden_size:
            raise LessonkitError(f"lora_rank must be at most the hidden size of {spec.name} "
                                 f"({spec.hidden_size}), got {s.lora_rank}.")
    if s.method == "qlora" and s.precision in ("fp32", "bf16-master"):
        raise LessonkitError(
            f"QLoRA computes in 16 bits on 4-bit weights; precision {s.precision!r} makes no "
            "sense with it. Use 'bf16-mixed' (or 'fp16-mixed' on GPUs without bf16) or 'bf16'.")
    if s.offload_optimizer and s.zero_stage == 0:
        raise LessonkitError("offload_optimizer needs ZeRO (zero_stage 1, 2 or 3): plain data "
                             "parallelism keeps the optimizer states on the GPU.")
    if s.method == "qlora" and s.zero_stage == 3:
        raise LessonkitError("ZeRO-3 cannot shard 4-bit QLoRA weights in this calculator; use "
                             "zero_stage 0, 1 or 2 with QLoRA.")
    return s


# ----- parameter tensors -------------------------------------------------------------------
def _layer_tensors(spec: ModelSpec) -> list[tuple[str, tuple[int, ...]]]:
    """(kind, shape) of the parameter tensors of one decoder layer."""
    h, inter = spec.hidden_size, spec.intermediate_size
    out: list[tuple[str, tuple[int, ...]]] = []
    norm = [("norm", (h,))] * (2 if spec.norm == "layernorm" else 1)
    if spec.family == "gpt2":
        out += norm + [("linear", (h, 3 * h)), ("bias", (3 * h,)), ("linear", (h, h)),
                       ("bias", (h,))] + norm
        out += [("linear", (h, inter)), ("bias", (inter,)), ("linear", (inter, h)),
                ("bias", (h,))]
        return out
    for name, (n_in, n_out) in spec.linear_shapes().items():
        out.append(("linear", (n_out, n_in)))
    if spec.attention_bias in ("qkv", "all"):
        out += [("bias", (spec.q_size,)), ("bias", (spec.kv_size,)), ("bias", (spec.kv_size,))]
    if spec.attention_bias == "all":
        out.append(("bias", (h,)))
    if spec.mlp_bias:
        out += [("bias", (inter,))] * (2 if spec.gated_mlp else 1) + [("bias", (h,))]
    out += norm * spec.norms_per_layer
    return out


def _outer_tensors(spec: ModelSpec) -> list[tuple[str, tuple[int, ...]]]:
    h = spec.hidden_size
    out = [("embed", (spec.vocab_size, h))]
    if spec.max_positions:
        out.append(("embed", (spec.max_positions, h)))
    out += [("norm", (h,))] * (2 if spec.norm == "layernorm" else 1)
    if not spec.tie_embeddings:
        out.append(("head", (spec.vocab_size, h)))
    return out


def _nf4_bytes(numel: int, double_quant: bool) -> int:
    blocks = math.ceil(numel / NF4_BLOCK)
    constants = blocks + 4 * math.ceil(blocks / NF4_NESTED_BLOCK) if double_quant else 4 * blocks
    return (numel + 1) // 2 + constants


def _buffer_bytes(spec: ModelSpec) -> int:
    if spec.family == "gpt2":
        return 0
    return 2 * 4 * (spec.head_dim // 2)  # rotary inv_freq and original_inv_freq, fp32


# ----- the estimate --------------------------------------------------------------------------
def estimate(model: Any, *, method: str = "full", precision: str = "bf16-mixed",
             optimizer: str = "adamw", batch_size: int = 1, seq_len: int = 512,
             gradient_checkpointing: bool = False, lora_rank: int = 16,
             lora_targets: tuple[str, ...] | str = ("q_proj", "v_proj"), n_gpus: int = 1,
             zero_stage: int = 0, attention: str = "sdpa", offload_optimizer: bool = False,
             double_quant: bool = True, lora_dtype: str = "fp32", gradient_accumulation: int = 1,
             device: str = "cuda") -> MemoryReport:
    """Estimate the peak GPU memory per GPU of one training step of ``model``.

    ``model`` is a preset name ("llama-2-7b"), a size ("7B", 7e9), a ModelSpec or a Hugging
    Face config dict. Returns a MemoryReport with the breakdown at the peak, the peak of each
    phase and the assumptions made, in words.
    """
    spec = resolve_model(model)
    s = _validate(spec, dict(
        method=method, precision=precision, optimizer=optimizer, batch_size=batch_size,
        seq_len=seq_len, gradient_checkpointing=gradient_checkpointing, lora_rank=lora_rank,
        lora_targets=lora_targets, n_gpus=n_gpus, zero_stage=zero_stage, attention=attention,
        offload_optimizer=offload_optimizer, double_quant=double_quant, lora_dtype=lora_dtype,
        gradient_accumulation=gradient_accumulation, device=device))
    return _Step(spec, s).report()


class _Step:
    """The arithmetic of one step; each attribute is bytes on one GPU."""

    def __init__(self, spec: ModelSpec, s: _Settings) -> None:
        self.spec, self.s = spec, s
        full, lora, qlora = s.method == "full", s.method != "full", s.method == "qlora"
        self.p = 2 if s.precision in ("bf16", "bf16-master") else 4
        self.c = 4 if s.precision == "fp32" else 2
        self.mixed = s.precision.endswith("-mixed")
        self.ad = DTYPE_BYTES[s.lora_dtype]
        master = s.precision == "bf16-master"
        n, zero = s.n_gpus, s.zero_stage
        layers = spec.n_layers

        def local(shape: tuple[int, ...], stage: int) -> tuple[int, ...]:
            """One rank's piece: ZeRO-1/2 take a flat slice, ZeRO-3 (FSDP) rows of dim 0."""
            if n == 1 or stage == 0:
                return shape
            if stage == 3:
                return (math.ceil(shape[0] / n),) + shape[1:]
            return (math.ceil(math.prod(shape) / n),)

        # weights on this GPU, and (shape, count) of the trainable tensors
        weights = _buffer_bytes(spec)
        trainable: list[tuple[tuple[int, ...], int]] = []
        for kind, shape in _layer_tensors(spec):
            if qlora and kind == "linear":
                weights += _nf4_bytes(math.prod(shape), s.double_quant) * layers
                continue
            weights += self.p * math.prod(local(shape, 3 if zero == 3 else 0)) * layers
            if full:
                trainable.append((shape, layers))
        for kind, shape in _outer_tensors(spec):
            weights += self.p * math.prod(local(shape, 3 if zero == 3 else 0))
            if full:
                trainable.append((shape, 1))
        if lora:
            for n_in, n_out in spec.lora_shapes(s.lora_targets):
                for shape in ((s.lora_rank, n_in), (n_out, s.lora_rank)):
                    weights += self.ad * math.prod(local(shape, 3 if zero == 3 else 0)) * layers
                    trainable.append((shape, layers))
        self.weights = weights
        grad_dtype = self.ad if lora else self.p
        self.trainable_params = sum(math.prod(sh) * count for sh, count in trainable)
        grads_full = grad_dtype * self.trainable_params
        # gradients: sharded from ZeRO-2; DDP (several GPUs, ZeRO-0) adds its flat buckets
        g_stage = zero if zero >= 2 else 0
        self.gradients = sum(grad_dtype * math.prod(local(sh, g_stage)) * count
                             for sh, count in trainable)
        self.buckets = grads_full if n > 1 and zero == 0 else 0  # allocated up front
        self.gradients += self.buckets
        self.head_grads = (self.p * spec.vocab_size * spec.hidden_size / (n if zero >= 2 else 1)
                           if full and not spec.tie_embeddings else 0)
        # optimizer states: sharded from ZeRO-1
        shards = [(math.prod(local(sh, zero)), local(sh, zero), count) for sh, count in trainable]
        state = opt.state_bytes(s.optimizer, shards, grad_dtype, master)
        if s.optimizer == "adamw-fused":
            state += 4 * sum(count for _, count in trainable)  # step counters on the GPU
        self.offload_bytes = state if s.offload_optimizer else 0
        self.optimizer = 0 if s.offload_optimizer else state
        self.step_temps = 0 if s.offload_optimizer else opt.step_temporaries(
            s.optimizer, shards, grad_dtype, master)
        self.gather = 0
        if zero == 3 and n > 1:
            # FSDP keeps the root's parameters (embeddings, final norm, lm_head) gathered for
            # the whole forward and backward, and gathers one decoder layer at a time
            layer = sum(math.prod(sh) for _, sh in _layer_tensors(spec))
            if lora:
                layer += sum(s.lora_rank * (a + b) for a, b in spec.lora_shapes(s.lora_targets))
            outer = sum(math.prod(sh) for _, sh in _outer_tensors(spec))
            self.gather = self.p * (outer + layer)

        # activations
        targets = (frozenset(k.split(".")[-1] for k in spec.linear_shapes())
                   if s.lora_targets == "all-linear" else frozenset(s.lora_targets))
        dropout = GPT2_DROPOUT if spec.family == "gpt2" else 0.0
        self.ctx = acts.Ctx(batch=s.batch_size, seq=s.seq_len, p=self.p, c=self.c,
                            mixed=self.mixed, full=full,
                            targets=targets if lora else frozenset(), ad=self.ad,
                            rank=s.lora_rank, qlora=qlora, attention=s.attention,
                            dropout=dropout, cpu=s.device == "cpu")
        self._activations()

    def _activations(self) -> None:
        spec, s, ctx = self.spec, self.s, self.ctx
        t, h, v = ctx.tokens, spec.hidden_size, spec.vocab_size
        p, c = self.p, self.c
        full = ctx.full
        ckpt = s.gradient_checkpointing
        layer = acts.gpt2_layer if spec.family == "gpt2" else acts.llama_layer
        first_grad = full or ckpt  # checkpointing with LoRA makes the inputs require grad
        first = layer(spec, ctx, 0, first_grad)
        other = layer(spec, ctx, 1, True)
        rope = sum(b for k, b in other.items.items() if k.startswith("rope."))
        self.layer_saved = other.activations - rope
        self.layer_copies = other.weight_copies
        self.first_saved = first.activations - rope
        self.first_copies = first.weight_copies
        self.rope = rope
        # the head: final norm, lm_head, log-softmax (fp32) and the targets
        head = acts.Saved()
        if spec.family == "gpt2":
            acts._layernorm(head, ctx, "final", "final.x", True, h)
            # the embeddings' dropout and the position ids
            head.add("embed.drop", acts._dropout_mask(ctx, t * h, p))
            head.add("position_ids", 8 * s.seq_len)
        else:
            acts._rmsnorm(head, ctx, "final", "final.x", True, h)
        acts._linear(head, ctx, "lm_head", "final.out", p, True, h, v, False)
        self.head_saved = head.activations + 8 * t  # plus the shifted labels
        self.head_copies = head.weight_copies
        self.logsoftmax = 4 * t * v
        self.inputs = 8 * t  # input_ids (the labels are the same tensor)
        copies = self.first_copies + (spec.n_layers - 1) * self.layer_copies
        if ckpt:
            # each layer keeps only its input; autocast still caches the copies of trained
            # weights until the forward ends, and nothing is saved for backward
            self.fw_layers = spec.n_layers * p * t * h + self.rope
            self.fw_copies, self.bw_copies = (copies if full else 0), 0
        else:
            self.fw_layers = (self.first_saved + (spec.n_layers - 1) * self.layer_saved
                              + self.rope)
            self.fw_copies = self.bw_copies = copies  # saved until each layer's backward

    def phases(self) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
        spec, s, ctx = self.spec, self.s, self.ctx
        t, h, v, p, c = ctx.tokens, spec.hidden_size, spec.vocab_size, self.p, self.c
        static = {"weights": self.weights, "optimizer": self.optimizer}
        grads_fw = self.gradients if s.gradient_accumulation > 1 else self.buckets
        logits_fw = c * t * v + (4 * t * v if c != 4 else 0) + self.logsoftmax
        last_hidden = p * t * h
        fw = dict(static, gradients=grads_fw,
                  activations=self.inputs + self.fw_layers + self.head_saved + last_hidden
                  + 8 * s.batch_size * (s.seq_len + 1),
                  logits=logits_fw, temporaries=self.head_copies + self.fw_copies + self.gather)
        bw_start = dict(static, gradients=grads_fw,
                        activations=self.inputs + self.fw_layers + self.head_saved,
                        logits=self.logsoftmax + 8 * t * v,
                        temporaries=self.head_copies + self.bw_copies + self.gather)
        # backward of the last layer: every activation still saved (with checkpointing, that
        # layer's recomputed ones too), the head's gradients, and the gradients flowing back
        inter = spec.intermediate_size
        flowing = 2 * p * t * h + c * t * h + 3 * c * t * inter
        recompute = (self.layer_saved + self.layer_copies) if s.gradient_checkpointing else 0
        # QLoRA dequantizes one layer's weight at a time into a 16-bit temporary
        dequantized = (c * max(a * b for a, b in spec.linear_shapes().values())
                       if ctx.qlora else 0)
        bw_layer = dict(static, gradients=grads_fw + self.head_grads,
                        activations=self.inputs + self.fw_layers + recompute + flowing,
                        temporaries=self.bw_copies + self.gather + dequantized)
        # end: every gradient; tied embeddings add the embedding's gradient to lm_head's
        tied = 2 * p * v * h if ctx.full and spec.tie_embeddings else 0
        bw_end = dict(static, gradients=self.gradients,
                      activations=self.inputs + 2 * p * t * h + tied,
                      temporaries=self.gather)
        step = dict(static, gradients=self.gradients, activations=self.inputs,
                    temporaries=self.step_temps)
        bw = max((bw_start, bw_layer, bw_end), key=lambda d: sum(d.values()))
        by_phase = {"forward": fw, "backward": bw, "optimizer": step}
        return {k: sum(d.values()) for k, d in by_phase.items()}, by_phase

    def assumptions(self) -> list[str]:
        spec, s = self.spec, self.s
        notes = []
        if spec.note:
            notes.append(spec.note)
        notes.append({
            "fp32": "fp32 weights, gradients, optimizer states and compute.",
            "bf16-mixed": "fp32 weights under bf16 autocast: fp32 gradients and states, plus "
                          "autocast's bf16 copy of each weight, kept until its backward.",
            "fp16-mixed": "fp32 weights under fp16 autocast: fp32 gradients and states, plus "
                          "autocast's fp16 copy of each weight (loss scaling adds nothing).",
            "bf16": "Pure bf16: weights, gradients and optimizer states all in bf16.",
            "bf16-master": "bf16 weights and gradients; the optimizer keeps fp32 master weights "
                           "and fp32 states (4 + 4 + 4 bytes per parameter) and makes fp32 "
                           "copies of the gradients at the step.",
        }[s.precision])
        notes.append({
            "adamw": "torch.optim.AdamW with foreach=True (the CUDA default): 2 states per "
                     "parameter, and one parameter-sized temporary set during the step.",
            "adamw-fused": "torch.optim.AdamW(fused=True): 2 states per parameter, no step "
                           "temporaries.",
            "adamw-forloop": "torch.optim.AdamW(foreach=False): 2 states per parameter; the step "
                             "goes one tensor at a time (two temporaries of the largest).",
            "adamw-8bit": "bitsandbytes AdamW8bit: 2 uint8 states per parameter plus an fp32 "
                          "absmax per 256 values; tensors under 4096 elements keep fp32 states.",
            "paged-adamw-8bit": "bitsandbytes PagedAdamW8bit: as AdamW8bit, counted on the GPU "
                                "(paging can move the states to CPU RAM under pressure).",
            "sgd": "SGD without momentum: no optimizer state.",
            "sgd-momentum": "SGD with momentum: one state per parameter.",
            "adafactor": "transformers Adafactor: a row and a column vector per matrix (fp32), "
                         "no first moment.",
            "lion": "Lion: one momentum state per parameter.",
        }[s.optimizer])
        if s.method != "full":
            targets = s.lora_targets if isinstance(s.lora_targets, str) else ", ".join(s.lora_targets)
            notes.append(f"LoRA rank {s.lora_rank} on {targets}: "
                         f"{self.trainable_params:,} trainable parameters in {s.lora_dtype} "
                         "(peft keeps adapters in fp32 by default); the base model is frozen.")
        if s.method == "qlora":
            dq = ("double quantization (a uint8 absmax per 64 values and an fp32 constant per "
                  "256 blocks)" if s.double_quant else "an fp32 absmax per 64 values")
            notes.append("QLoRA: the decoder's linear weights in NF4, 0.5 bytes per parameter "
                         f"with {dq}; embeddings, norms and lm_head stay in "
                         f"{'fp32' if self.p == 4 else 'bf16'}. Each layer's weight is "
                         "dequantized into a 16-bit temporary in forward and again in backward.")
        attn = {"sdpa": "SDPA attention (flash / memory-efficient kernels): no seq x seq matrix "
                        "is kept.",
                "flash": "FlashAttention: no seq x seq matrix is kept.",
                "eager": "Eager attention: the seq x seq scores and probabilities are kept for "
                         "every head (fp32 softmax)."}[s.attention]
        notes.append(attn)
        if spec.family == "gpt2":
            notes.append("GPT-2's dropout (0.1, transformers' default) is on: each dropout keeps "
                         "a mask" + (" in its input's dtype, and SDPA takes the math path "
                                     "(CPU kernels)." if s.device == "cpu" else " of 1 byte "
                                     "per element."))
        if s.gradient_checkpointing:
            notes.append("Gradient checkpointing: each layer keeps only its input; one layer's "
                         "activations are recomputed at a time in backward.")
        if s.gradient_accumulation > 1:
            notes.append(f"{s.gradient_accumulation} micro-batches: activations are those of "
                         "one micro-batch, but gradients stay allocated between them.")
        logits = 4 * s.batch_size * s.seq_len * spec.vocab_size
        notes.append(f"Logits: the loss upcasts the logits to fp32 and keeps the log-softmax "
                     f"({logits / GB:.2f} GB for a vocabulary of {spec.vocab_size:,}); "
                     "their gradients appear at the start of backward.")
        if s.n_gpus > 1 or s.zero_stage:
            kind = {0: "DDP: everything replicated, plus gradient buckets as large as the "
                       "gradients",
                    1: "ZeRO-1: optimizer states sharded",
                    2: "ZeRO-2: optimizer states and gradients sharded",
                    3: "ZeRO-3: parameters, gradients and states sharded, plus two layers "
                       "gathered in full (the current and the prefetched one)"}[s.zero_stage]
            notes.append(f"{s.n_gpus} GPUs, {kind}; figures are per GPU.")
        if s.offload_optimizer:
            notes.append("Optimizer states offloaded to CPU RAM: 0 on the GPU (the CPU needs "
                         f"{self.offload_bytes / GB:.1f} GB for them and the step).")
        if s.device == "cuda":
            const = cuda_constants()
            ratio = const["allocator_margin_ratio"] - 1
            notes.append(f"CUDA context {const['cuda_context_bytes'] / GB:.2f} GB and an "
                         f"allocator margin of {ratio:.0%} of the tensor peak "
                         f"(source: {const['source']}; as of {const['as_of']}).")
        else:
            notes.append("device='cpu': no CUDA context and no allocator margin.")
        return notes

    def report(self) -> MemoryReport:
        peaks, by_phase = self.phases()
        phase = max(peaks, key=peaks.get)
        breakdown = dict(by_phase[phase])
        tensors = sum(breakdown.values())
        if self.s.device == "cuda":
            const = cuda_constants()
            breakdown["cuda_context"] = int(const["cuda_context_bytes"])
            breakdown["allocator_margin"] = int(tensors * (const["allocator_margin_ratio"] - 1))
        settings = {f: getattr(self.s, f) for f in self.s.__dataclass_fields__}
        settings["estimated"] = {
            "weight_bytes": self.weights, "gradient_bytes": self.gradients,
            "optimizer_bytes": self.optimizer, "trainable_parameters": self.trainable_params}
        return MemoryReport(model=self.spec, settings=settings, breakdown=breakdown,
                            peak_phase=phase, phase_peaks=peaks, assumptions=self.assumptions(),
                            source="estimate")
