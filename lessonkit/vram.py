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


def _shard(shape: tuple[int, ...], n: int) -> int:
    """Elements of one rank's shard when dim 0 is split over n ranks (padded, as FSDP does)."""
    return math.ceil(shape[0] / n) * math.prod(shape[1:])


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
        self.notes: list[str] = []
        full, lora, qlora = s.method == "full", s.method != "full", s.method == "qlora"
        self.p = 2 if s.precision in ("bf16", "bf16-master") else 4
        self.c = 4 if s.precision == "fp32" else 2
        self.mixed = s.precision.endswith("-mixed")
        self.ad = DTYPE_BYTES[s.lora_dtype]
        master = s.precision == "bf16-master"
        n = s.n_gpus
        shard_w = n if s.zero_stage == 3 else 1
        shard_g = n if s.zero_stage >= 2 else 1
        shard_o = n if s.zero_stage >= 1 else 1
        layers = spec.n_layers

        # weights, and the trainable tensors (numel per rank, shape, count)
        weights = 0
        trainable: list[tuple[int, tuple[int, ...], int]] = []
        layer_grad_bytes = 0
        for kind, shape in _layer_tensors(spec):
            numel = math.prod(shape)
            if qlora and kind == "linear":
                weights += _nf4_bytes(numel, s.double_quant) * layers
                continue
            weights += self.p * _shard(shape, shard_w) * layers
            if full:
                trainable.append((_shard(shape, shard_o), shape, layers))
                layer_grad_bytes += self.p * numel
        outer_grads = 0
        for kind, shape in _outer_tensors(spec):
            weights += self.p * _shard(shape, shard_w)
            if full:
                trainable.append((_shard(shape, shard_o), shape, 1))
                outer_grads += self.p * math.prod(shape)
        if lora:
            for n_in, n_out in spec.lora_shapes(s.lora_targets):
                for shape in ((s.lora_rank, n_in), (n_out, s.lora_rank)):
                    weights += self.ad * _shard(shape, shard_w) * layers
                    trainable.append((_shard(shape, shard_o), shape, layers))
                    layer_grad_bytes += self.ad * math.prod(shape)
        weights += _buffer_bytes(spec)
        self.weights = weights
        grad_dtype = self.ad if lora else self.p
        self.trainable_params = sum(numel * count for numel, _, count in trainable) * shard_o
        # gradients: the same tensors, in the trainable dtype, sharded from ZeRO-2
        grads_full = layer_grad_bytes * layers + outer_grads
        self.gradients = math.ceil(grads_full / shard_g) if shard_g > 1 else grads_full
        if shard_g == 1 and shard_o > 1:
            pass
        self.layer_grads = layer_grad_bytes / shard_g
        self.head_grads = (0 if not full or spec.tie_embeddings
                           else self.p * spec.vocab_size * spec.hidden_size / shard_g)
        state = opt.state_bytes(s.optimizer, trainable, grad_dtype, master)
        if s.optimizer == "adamw-fused":
            state += 4 * sum(count for _, _, count in trainable)  # step scalars on the GPU
        self.optimizer = 0 if s.offload_optimizer else state
        self.step_temps = 0 if s.offload_optimizer else opt.step_temporaries(
            s.optimizer, trainable, grad_dtype, master)
        if s.n_gpus > 1 and s.zero_stage == 0:
            self.ddp_buckets = grads_full  # DDP's flat gradient buckets, a second copy
        else:
            self.ddp_buckets = 0
        self.gather = 0
        if s.zero_stage == 3 and n > 1:
            per_layer = sum(self.p * math.prod(sh) for _, sh in _layer_tensors(spec))
            self.gather = 2 * per_layer  # the layer being computed and the next one prefetched

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
        if ckpt:  # each layer keeps its input; autocast still caches every weight copy
            self.fw_layers = spec.n_layers * p * t * h + self.rope
            self.fw_copies = self.first_copies + (spec.n_layers - 1) * self.layer_copies
        else:
            self.fw_layers = (self.first_saved + self.first_copies
                              + (spec.n_layers - 1) * (self.layer_saved + self.layer_copies)
                              + self.rope)
            self.fw_copies = 0

    def phases(self) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
        spec, s, ctx = self.spec, self.s, self.ctx
        t, h, v, p, c = ctx.tokens, spec.hidden_size, spec.vocab_size, self.p, self.c
        static = {"weights": self.weights, "optimizer": self.optimizer}
        grads_fw = self.gradients if s.gradient_accumulation > 1 else 0
        logits_fw = c * t * v + (4 * t * v if c != 4 else 0) + self.logsoftmax
        last_hidden = p * t * h
        fw = dict(static, gradients=grads_fw,
                  activations=self.inputs + self.fw_layers + self.head_saved + last_hidden
                  + 8 * s.batch_size * (s.seq_len + 1),
                  logits=logits_fw, temporaries=self.head_copies + self.fw_copies + self.gather)
        bw_start = dict(static, gradients=grads_fw,
                        activations=self.inputs + self.fw_layers + self.head_saved,
                        logits=self.logsoftmax + 8 * t * v,
                        temporaries=self.head_copies + self.gather)
        # backward of the last layer: every activation still saved (with checkpointing, that
        # layer's recomputed ones too), the head's gradients, and the gradients flowing back
        inter = spec.intermediate_size
        flowing = 2 * p * t * h + c * t * h + 3 * c * t * inter
        recompute = (self.layer_saved + self.layer_copies) if s.gradient_checkpointing else 0
        bw_layer = dict(static, gradients=grads_fw + self.head_grads,
                        activations=self.inputs + self.fw_layers + recompute + flowing,
                        temporaries=self.gather)
        # end: every gradient; tied embeddings add the embedding's gradient to lm_head's
        tied = 2 * p * v * h if ctx.full and spec.tie_embeddings else 0
        bw_end = dict(static, gradients=self.gradients,
                      activations=self.inputs + 2 * p * t * h + tied,
                      temporaries=self.ddp_buckets + self.gather)
        step = dict(static, gradients=self.gradients, activations=self.inputs,
                    temporaries=self.step_temps + self.ddp_buckets)
        bw = max((bw_start, bw_layer, bw_end), key=lambda d: sum(d.values()))
        by_phase = {"forward": fw, "backward": bw, "optimizer": step}
        return {k: sum(d.values()) for k, d in by_phase.items()}, by_phase

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
                            peak_phase=phase, phase_peaks=peaks, assumptions=self.notes,
                            source="estimate")
