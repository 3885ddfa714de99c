"""estimate(): the GPU memory of one fine-tuning step, phase by phase, in microseconds.

Pure arithmetic (no torch): the weights, gradients and optimizer states are counted tensor by
tensor; the activations are what each operator of the model saves for backward
(memory/activations.py); the peak is the highest of three moments of a steady-state step:

- forward: weights + optimizer states (+ gradients from earlier micro-batches) + every saved
  activation + the logits, their fp32 copy and the log-softmax at the loss;
- backward: at its start the log-softmax's gradient joins the saved activations; then, layer
  by layer, activations (or checkpoints) are freed while gradients appear, with each layer's
  own highest moments inside (activations.backward_moments: its MLP's backward, where a
  checkpointed layer's recomputation stops); at its end every gradient exists;
- optimizer: weights + gradients + states + the step's own temporaries.

Under ZeRO-3 (FSDP) the forward and the backward are followed layer by layer as well (gathered
layers, unsharded gradients, reduce-scatter buffers); with a "-mixed" precision ZeRO-3 is FSDP's
mixed precision (layers gathered in 16 bits from fp32 shards), not autocast.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources
from typing import Any

from ..models.spec import DEFAULT_LORA_TARGETS, ModelSpec, resolve_model
from ..options import DTYPE_BYTES
from ..units import GiB
from . import activations as acts
from . import optimizers as opt
from .report import MemoryReport
from .settings import RunSettings, validate_run

GPT2_DROPOUT = 0.1  # transformers' GPT2Config default for resid/embd/attn dropout
NF4_BLOCK, NF4_NESTED_BLOCK = 64, 256


@lru_cache(maxsize=1)
def pcie_link() -> dict[str, Any]:
    """PCIe 4.0 x16 from the bandwidth ladder (lessonkit/data/bandwidth.json): the host link
    activation offloading crosses."""
    text = resources.files("lessonkit").joinpath("data/bandwidth.json").read_text()
    return next(link for link in json.loads(text)["links"] if link["name"] == "PCIe 4.0 x16")


@lru_cache(maxsize=1)
def cuda_constants() -> dict[str, Any]:
    """The CUDA context size and allocator margin (lessonkit/data/cuda_constants.json)."""
    text = resources.files("lessonkit").joinpath("data/cuda_constants.json").read_text()
    return json.loads(text)


def _nf4_bytes(numel: int, double_quant: bool) -> int:
    """One NF4 weight as bitsandbytes stores it: the packed values, the absmax constants, and
    its QuantState's own code tables (the 16 NF4 values; with double quantization the 256-entry
    8-bit map and the fp32 offset), all fp32."""
    blocks = math.ceil(numel / NF4_BLOCK)
    if double_quant:
        constants = blocks + 4 * math.ceil(blocks / NF4_NESTED_BLOCK) + 4 * 256 + 4
    else:
        constants = 4 * blocks
    return (numel + 1) // 2 + constants + 4 * 16


def _buffer_bytes(spec: ModelSpec) -> int:
    if spec.family == "gpt2":
        return 0
    return 2 * 4 * (spec.head_dim // 2)  # rotary inv_freq and original_inv_freq, fp32


# ----- the estimate --------------------------------------------------------------------------
def estimate(
    model: Any,
    *,
    method: str = "full",
    precision: str | None = None,
    optimizer: str = "adamw",
    batch_size: int = 1,
    seq_len: int = 512,
    gradient_checkpointing: bool = False,
    lora_rank: int = 16,
    lora_targets: tuple[str, ...] | str = DEFAULT_LORA_TARGETS,
    n_gpus: int = 1,
    zero_stage: int = 0,
    attention: str = "sdpa",
    offload_optimizer: bool = False,
    double_quant: bool = True,
    lora_dtype: str = "fp32",
    gradient_accumulation: int = 1,
    device: str = "cuda",
    lora_dropout: float = 0.0,
    bitsandbytes: str = "current",
    activation_offload: bool = False,
    optimizer_in_backward: bool = False,
    loss: str = "standard",
    loss_chunks: int = 8,
    no_sync: bool = False,
) -> MemoryReport:
    """Estimate the peak GPU memory per GPU of one training step of ``model``.

    ``model`` is a preset name ("llama-2-7b"), a size ("7B", 7e9), a ModelSpec or a Hugging
    Face config dict. ``precision`` defaults to the method's usual precision
    (``settings.usual_precision``: "bf16-mixed" for full fine-tuning, "bf16" for LoRA and QLoRA),
    as everywhere in lessonkit. Returns a MemoryReport with the breakdown at the peak, the peak
    of each phase and the assumptions made, in words.
    """
    spec = resolve_model(model)
    s = validate_run(
        spec,
        method=method,
        precision=precision,
        optimizer=optimizer,
        batch_size=batch_size,
        seq_len=seq_len,
        gradient_checkpointing=gradient_checkpointing,
        lora_rank=lora_rank,
        lora_targets=lora_targets,
        n_gpus=n_gpus,
        zero_stage=zero_stage,
        attention=attention,
        offload_optimizer=offload_optimizer,
        double_quant=double_quant,
        lora_dtype=lora_dtype,
        gradient_accumulation=gradient_accumulation,
        device=device,
        lora_dropout=lora_dropout,
        bitsandbytes=bitsandbytes,
        activation_offload=activation_offload,
        optimizer_in_backward=optimizer_in_backward,
        loss=loss,
        loss_chunks=loss_chunks,
        no_sync=no_sync,
    )
    return _Step(spec, s).report()


class _Step:
    """The arithmetic of one step; each attribute is bytes on one GPU."""

    def __init__(self, spec: ModelSpec, s: RunSettings) -> None:
        self.spec, self.s = spec, s
        full, lora, qlora = s.method == "full", s.method != "full", s.method == "qlora"
        self.wp = 2 if s.precision in ("bf16", "bf16-master") else 4  # stored weights
        self.c = 4 if s.precision == "fp32" else 2
        # ZeRO-3 with "-mixed" is FSDP's mixed precision: the fp32 shards are gathered in 16
        # bits and the model computes as in pure 16 bits, without autocast
        self.sharded_mixed = s.sharded_mixed
        self.mixed = s.mixed and not self.sharded_mixed
        self.p = self.c if self.sharded_mixed else self.wp  # the residual stream's dtype
        self.ad = DTYPE_BYTES[s.lora_dtype]
        master = s.precision == "bf16-master"
        n, zero = s.n_gpus, s.zero_stage
        layers = spec.n_layers

        def local(shape: tuple[int, ...], stage: int) -> tuple[int, ...]:
            """One rank's piece: ZeRO-1/2 take a flat slice, ZeRO-3 (FSDP) rows of dim 0."""
            if n == 1 or stage == 0:
                return shape
            if stage == 3:
                return (math.ceil(shape[0] / n), *shape[1:])
            return (math.ceil(math.prod(shape) / n),)

        # (shape, bytes per element, trained) of one decoder layer's and the root's parameters
        tensors = spec.parameter_tensors()
        layer_params: list[tuple[tuple[int, ...], int, bool]] = []
        for tensor in tensors.layer:
            if not (qlora and tensor.kind == "linear"):
                # a 4-bit layer casts its bias to the compute dtype (in place, at its forward)
                nbytes = self.c if qlora and tensor.kind == "bias" else self.wp
                layer_params.append((tensor.shape, nbytes, full))
        if lora:
            for n_in, n_out in spec.lora_shapes(s.lora_targets):
                layer_params += [
                    ((s.lora_rank, n_in), self.ad, True),
                    ((n_out, s.lora_rank), self.ad, True),
                ]
        root_params = [(tensor.shape, self.wp, full) for tensor in tensors.outer]

        # weights on this GPU, and (shape, count) of the trainable tensors
        weights = _buffer_bytes(spec)
        if qlora:
            weights += layers * sum(
                _nf4_bytes(math.prod(tensor.shape), s.double_quant)
                for tensor in tensors.layer
                if tensor.kind == "linear"
            )
        trainable: list[tuple[tuple[int, ...], int]] = []
        for params, count in ((layer_params, layers), (root_params, 1)):
            for shape, nbytes, trained in params:
                weights += nbytes * math.prod(local(shape, 3 if zero == 3 else 0)) * count
                if trained:
                    trainable.append((shape, count))
        self.weights = weights
        grad_dtype = self.ad if lora else self.wp
        self.trainable_params = sum(math.prod(sh) * count for sh, count in trainable)
        grads_full = grad_dtype * self.trainable_params
        # gradients: sharded from ZeRO-2; DDP (several GPUs, ZeRO-0) adds its flat buckets
        g_stage = zero if zero >= 2 else 0
        self.gradients = sum(
            grad_dtype * math.prod(local(sh, g_stage)) * count for sh, count in trainable
        )
        self.buckets = grads_full if n > 1 and zero == 0 else 0  # allocated up front
        self.gradients += self.buckets
        # FSDP without a reduction until the last micro-batch (no_sync): each rank accumulates
        # the full, unsharded gradients, in the reduce dtype (fp32 under mixed precision, even
        # for bf16 adapters); the last micro-batch reduces them to shards before the step
        kept_dtype = 4 if self.sharded_mixed else grad_dtype
        self.gradients_full_layer = sum(
            kept_dtype * math.prod(sh) for sh, _, trained in layer_params if trained
        )
        self.step_gradients = self.gradients  # what the optimizer step finds
        if s.no_sync and zero == 3:
            self.gradients = kept_dtype * self.trainable_params
        # one decoder layer's gradients, as they appear during its backward (with several
        # micro-batches they exist already), and the first of them: the MLP's output weight
        mlp_out = (spec.intermediate_size, spec.hidden_size)
        self.layer_grads = sum(
            grad_dtype * math.prod(local(sh, g_stage)) for sh, _, trained in layer_params if trained
        )
        self.first_layer_grad = grad_dtype * math.prod(local(mlp_out, g_stage)) if full else 0
        # lm_head's gradient, made at the start of backward (untied, full fine-tuning)
        self.head_grads = (
            grad_dtype * math.prod(local((spec.vocab_size, spec.hidden_size), g_stage))
            if full and not spec.tie_embeddings
            else 0
        )
        if s.gradient_accumulation > 1:  # accumulated in place into the existing gradients
            self.layer_grads = self.first_layer_grad = self.head_grads = 0
        # the optimizer step in backward: each gradient is stepped and freed as soon as it is
        # made, one tensor at a time, with that tensor's own step temporaries
        self.oib = s.optimizer_in_backward

        def step_temps(shape: tuple[int, ...]) -> int:
            return opt.step_temporaries(
                s.optimizer, [(math.prod(shape), shape, 1)], grad_dtype, master
            )

        self.oib_head = self.oib_head_temps = self.oib_mlp_temps = self.oib_embed_temps = 0
        if self.oib:
            self.oib_head, self.head_grads, self.layer_grads = self.head_grads, 0, 0
            self.oib_head_temps = step_temps((spec.vocab_size, spec.hidden_size))
            self.oib_mlp_temps = step_temps(mlp_out) if full else 0
            self.oib_embed_temps = step_temps((spec.vocab_size, spec.hidden_size)) if full else 0
        # optimizer states: sharded from ZeRO-1
        shards = [(math.prod(local(sh, zero)), local(sh, zero), count) for sh, count in trainable]
        state = opt.state_bytes(s.optimizer, shards, grad_dtype, master)
        if s.optimizer == "adamw-fused":
            state += 4 * sum(count for _, count in trainable)  # step counters on the GPU
        self.offload_bytes = state if s.offload_optimizer else 0
        self.optimizer = 0 if s.offload_optimizer else state
        self.step_temps = (
            0
            if s.offload_optimizer
            else opt.step_temporaries(s.optimizer, shards, grad_dtype, master)
        )
        self.gather = 0
        self.fsdp: dict[str, int] = {}
        if zero == 3:
            self.fsdp = self._fsdp_buffers(layer_params, root_params, local)
            # the first unsharded gradient of a layer's backward (down_proj's, when trained)
            first = max(a * b for a, b in spec.linear_shapes().values()) if full else 0
            self.fsdp_first_grad = (self.c if self.sharded_mixed else self.wp) * first
            # the root's parameters (embeddings, final norm, lm_head) stay gathered for the
            # whole forward and backward; a decoder layer's gathered buffer is held until
            # the next layer is gathered
            self.gather = self.fsdp["root_params"] + self.fsdp["layer_flat"]

        # activations
        targets = (
            frozenset(k.split(".")[-1] for k in spec.linear_shapes())
            if s.lora_targets == "all-linear"
            else frozenset(s.lora_targets)
        )
        dropout = GPT2_DROPOUT if spec.family == "gpt2" else 0.0
        self.ctx = acts.Ctx(
            batch=s.batch_size,
            seq=s.seq_len,
            p=self.p,
            c=self.c,
            mixed=self.mixed,
            full=full,
            targets=targets if lora else frozenset(),
            ad=self.c if self.sharded_mixed else self.ad,
            rank=s.lora_rank,
            qlora=qlora,
            attention=s.attention,
            dropout=dropout,
            cpu=s.device == "cpu",
            lora_dropout=s.lora_dropout if lora else 0.0,
            bnb_saves_input=qlora and s.bitsandbytes == "before-0.43.2",
        )
        self._activations()

    def _fsdp_buffers(self, layer_params: list, root_params: list, local: Any) -> dict[str, int]:
        """What FSDP (ZeRO-3) allocates per decoder layer and for the root, in bytes: the
        gathered parameters, the flat all-gather buffer, the unsharded gradients, the flat
        reduce-scatter input (padded to a multiple of the GPU count), and the gradient shards
        kept. Gathers are in the compute dtype under mixed precision, reductions in fp32."""
        n = self.s.n_gpus

        def sizes(params: list) -> dict[str, int]:
            out = dict(params=0, flat=0, grads=0, rs=0, shard=0)
            for shape, nbytes, trained in params:
                g = self.c if self.sharded_mixed else nbytes  # gathered and unsharded grads
                numel, padded = math.prod(shape), n * math.prod(local(shape, 3))
                out["params"] += g * numel
                out["flat"] += g * padded
                if trained:
                    r = 4 if self.sharded_mixed else nbytes  # reduce-scatter in fp32
                    out["grads"] += g * numel
                    out["rs"] += r * padded
                    out["shard"] += nbytes * padded // n  # shards keep the parameter's dtype
            return out

        layer, root = sizes(layer_params), sizes(root_params)
        return {
            **{f"layer_{k}": v for k, v in layer.items()},
            **{f"root_{k}": v for k, v in root.items()},
        }

    def _activations(self) -> None:
        spec, s, ctx = self.spec, self.s, self.ctx
        t, h, v = ctx.tokens, spec.hidden_size, spec.vocab_size
        p, _c = self.p, self.c
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
        self.first_layer, self.other_layer = first, other
        self.rope = rope
        # GPT-2's embeddings keep their dropout's mask and the position ids to the end, and
        # with LoRA and checkpointing the token embeddings made to require grad (a leaf)
        self.embed_saved = 0
        if spec.family == "gpt2":
            self.embed_saved = acts._dropout_mask(ctx, t * h, p) + 8 * s.seq_len
            self.embed_saved += p * t * h if ckpt and not full else 0
        # the head: final norm, lm_head, log-softmax (fp32) and the targets
        head = acts.Saved()
        if spec.family == "gpt2":
            acts._layernorm(head, ctx, "final", "final.x", True, h)
        else:
            acts._rmsnorm(head, ctx, "final", "final.x", True, h)
        acts._linear(head, ctx, "lm_head", "final.out", p, True, h, v, False)
        self.head_saved = head.activations + 8 * t + self.embed_saved  # + the shifted labels
        self.head_copies = head.weight_copies
        if s.loss == "chunked" and not full:
            # autocast casts a frozen lm_head anew for each chunk, and each chunk saves its cast
            self.head_copies *= s.loss_chunks
        self.logsoftmax = 4 * t * v
        self.inputs = 8 * t  # input_ids (the labels are the same tensor)
        copies = self.first_copies + (spec.n_layers - 1) * self.layer_copies
        # bitsandbytes before 0.43.2 kept the 4-bit layers' inputs on ctx, not as saved
        # tensors: checkpointing cannot drop them, so each layer keeps them beside its input
        self.bnb_kept = sum(other.items[k] for k in other.bnb_inputs if k != "L1.x") if ckpt else 0
        if ckpt:
            # each layer keeps only its input; autocast still caches the copies of trained
            # weights until the forward ends, and nothing is saved for backward
            self.fw_layers = spec.n_layers * (p * t * h + self.bnb_kept) + self.rope
            self.fw_copies, self.bw_copies = (copies if full else 0), 0
        else:
            self.fw_layers = self.first_saved + (spec.n_layers - 1) * self.layer_saved + self.rope
            self.fw_copies = self.bw_copies = copies  # saved until each layer's backward
        # activation offloading: whatever is saved for backward goes to host memory, and
        # autocast's cached copies of trained weights are all that stays until the forward ends
        # with LoRA and checkpointing the embeddings' output is made to require grad: a leaf,
        # which its gradient's accumulator keeps on the device although it is offloaded
        self.offload_kept = p * t * h if ckpt and not full else 0
        # what goes to the host: every saved tensor outside the checkpointed layers (their
        # inputs, the embedding's indices, the head's, the loss's two fp32 [tokens, vocab]
        # tensors) and lm_head's weight as the matmul saves it
        self.offloaded = (
            self.inputs + self.fw_layers + self.head_saved + 2 * self.logsoftmax + self.c * v * h
            if s.activation_offload
            else 0
        )
        if s.activation_offload:
            self.fw_copies, self.bw_copies = (copies if full else 0), 0
            self.head_copies = self.head_copies if full else 0

    def phases(self) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
        spec, s, ctx = self.spec, self.s, self.ctx
        t, h, v, p, c = ctx.tokens, spec.hidden_size, spec.vocab_size, self.p, self.c
        static = {"weights": self.weights, "optimizer": self.optimizer}
        grads_fw = self.gradients if s.gradient_accumulation > 1 else self.buckets
        logits_fw = c * t * v + (4 * t * v if c != 4 else 0) + self.logsoftmax
        logits_bw = self.logsoftmax + 8 * t * v
        if s.loss == "chunked":
            # every chunk's logits and log-softmax stay, but only one chunk's fp32 copy and,
            # in backward, one chunk's two fp32 gradients exist at a time (the largest chunk)
            chunk = s.batch_size * -(-s.seq_len // s.loss_chunks) * v
            logits_fw = c * t * v + (4 * chunk if c != 4 else 0) + self.logsoftmax
            logits_bw = self.logsoftmax + 8 * chunk
        # the residual before the final norm, still held by the model's forward at the loss
        # (a chunked loss runs after the decoder has returned)
        last_hidden = 0 if s.loss == "chunked" else p * t * h
        # offloaded: only the labels the loss is working on stay of what is saved
        saved = (
            8 * t + self.offload_kept if s.activation_offload else self.fw_layers + self.head_saved
        )
        fw = dict(
            static,
            gradients=grads_fw,
            activations=self.inputs + saved + last_hidden + 8 * s.batch_size * (s.seq_len + 1),
            logits=logits_fw,
            temporaries=self.head_copies + self.fw_copies + self.gather,
        )
        bw_start = dict(
            static,
            gradients=grads_fw,
            activations=self.inputs + (self.offload_kept if s.activation_offload else saved),
            logits=logits_bw,
            temporaries=(0 if s.activation_offload else self.head_copies)
            + self.bw_copies
            + self.gather,
        )
        bw_layers = self._layer_moments(static, grads_fw)
        # end: every gradient; tied embeddings add the embedding's gradient to lm_head's
        tied = 2 * p * v * h if ctx.full and spec.tie_embeddings else 0
        bw_end = dict(
            static,
            gradients=0 if self.oib else self.gradients,
            activations=self.inputs + 2 * p * t * h + tied,
            temporaries=self.gather + self.oib_embed_temps,
        )
        step = dict(
            static,
            gradients=0 if self.oib else self.step_gradients,
            activations=self.inputs,
            temporaries=0 if self.oib else self.step_temps,
        )
        fws, bws = [fw], [bw_start, *bw_layers, bw_end]
        if self.oib_head:  # lm_head's gradient, stepped as backward begins
            bws.append(
                dict(
                    bw_start,
                    gradients=self.oib_head,
                    logits=0,
                    activations=bw_start["activations"] + p * t * h,
                    temporaries=bw_start["temporaries"] + self.oib_head_temps,
                )
            )
        if self.fsdp:
            more_fw, bws = self._fsdp_moments(static, grads_fw)
            fws += more_fw
            bws = [bw_start, *bws]
        self.moments = {"forward": fws, "backward": bws, "optimizer": [step]}  # memory/timeline.py
        by_phase = {
            "forward": max(fws, key=lambda d: sum(d.values())),
            "backward": max(bws, key=lambda d: sum(d.values())),
            "optimizer": step,
        }
        return {k: sum(d.values()) for k, d in by_phase.items()}, by_phase

    def _layer_moments(
        self, static: dict[str, int], grads_fw: int, ks: Any = None
    ) -> list[dict[str, int]]:
        """Inside a decoder layer's backward (activations.backward_moments), layer by layer:
        each finished layer frees what it kept (its activations, or its checkpointed input)
        and leaves its gradients, so the highest moment is in the first layer backward
        reaches (the last) or in the last one (the first layer). ``ks`` (the timeline) asks
        for these layers instead, each first at its start: the layers below it and the
        gradient coming into it."""
        spec, s = self.spec, self.s
        t, h, p = self.ctx.tokens, spec.hidden_size, self.p
        layers, ckpt = spec.n_layers, s.gradient_checkpointing
        kept = p * t * h + self.bnb_kept if ckpt else self.layer_saved
        kept_copies = 0 if ckpt or s.activation_offload else self.layer_copies
        moments = []
        for k in sorted({0, layers - 1}) if ks is None else ks:  # k layers done
            below = self.inputs + self.embed_saved + self.fw_layers - k * kept
            if s.activation_offload:  # only the layer at work is back on the device
                below = self.inputs + self.offload_kept + kept
            if ks is not None:
                moments.append(
                    dict(
                        static,
                        gradients=grads_fw + self.head_grads + k * self.layer_grads,
                        activations=below + p * t * h,
                        temporaries=self.bw_copies - k * kept_copies + self.gather,
                    )
                )
            for extra, temps in self._inside_layer(first=k == layers - 1):
                moments.append(
                    dict(
                        static,
                        gradients=grads_fw
                        + self.head_grads
                        + k * self.layer_grads
                        + self.first_layer_grad,
                        activations=below + extra,
                        temporaries=self.bw_copies
                        - k * kept_copies
                        + temps
                        + self.gather
                        + self.oib_mlp_temps,
                    )
                )
        return moments

    def _inside_layer(self, first: bool) -> list[tuple[int, int]]:
        layer = self.first_layer if first else self.other_layer
        return acts.backward_moments(
            layer,
            self.ctx,
            self.spec.hidden_size,
            self.spec.intermediate_size,
            "L0.x" if first else "L1.x",
            self.s.gradient_checkpointing,
        )

    def _fsdp_moments(
        self, static: dict[str, int], grads_fw: int
    ) -> tuple[list[dict[str, int]], list[dict[str, int]]]:
        """The forward's and the backward's highest moments under FSDP (ZeRO-3).

        Forward: the end of the last layer, gathered alongside its all-gather buffer. Backward,
        layer by layer (k layers done): the end of a layer's backward (its gathered parameters,
        the next layer's prefetched buffer, its unsharded gradients, the previous layer's
        reduce-scatter input still held) and the reduce-scatter that follows; then the root's
        (embeddings, lm_head) reduction at the very end."""
        spec, s, f = self.spec, self.s, self.fsdp
        t, h, p = self.ctx.tokens, spec.hidden_size, self.p
        layers = spec.n_layers
        full = s.method == "full"
        ckpt = s.gradient_checkpointing
        accumulating = s.gradient_accumulation > 1

        def kept(i: int) -> int:
            """What decoder layer ``i`` keeps for backward (the first may keep less)."""
            if ckpt:
                return p * t * h
            return self.first_saved if i == 0 else self.layer_saved

        def copies(i: int) -> int:
            return 0 if ckpt else (self.first_copies if i == 0 else self.layer_copies)

        def freed(j: int) -> tuple[int, int]:
            """Activations and weight copies the last ``j`` layers kept (freed once done)."""
            done = range(layers - j, layers)
            return sum(kept(i) for i in done), sum(copies(i) for i in done)

        fw_end = dict(
            static,
            gradients=grads_fw,
            activations=self.inputs
            + self.fw_layers
            + p * t * h
            + 8 * s.batch_size * (s.seq_len + 1),
            temporaries=self.fw_copies + f["root_params"] + f["layer_params"] + f["layer_flat"],
        )
        # gathering the last layer: the previous layer's buffer is freed only after it
        fw_gather = dict(
            fw_end,
            activations=fw_end["activations"] - kept(layers - 1),
            temporaries=fw_end["temporaries"] - copies(layers - 1) + f["layer_flat"],
        )
        # lm_head's unsharded gradient, held until the root's reduction at the end
        head = (self.c if self.sharded_mixed else self.wp) * spec.vocab_size * h if full else 0
        moments = []
        # no_sync: the micro-batches before the last reduce nothing (no reduce-scatter
        # buffers); in the last, each finished layer's unsharded gradients give way to shards
        passes = [False, True] if s.no_sync else [True]
        unsharded_layer = self.gradients_full_layer - f["layer_shard"] if s.no_sync else 0
        # a layer's new (unsharded) gradients, and its first one, held as temporaries
        new_grads, new_first_grad = f["layer_grads"], self.fsdp_first_grad
        if s.no_sync and not self.sharded_mixed:
            # no reduce dtype: autograd adds each new gradient into the one kept, in place, so
            # neither lm_head's nor a layer's new gradients are held beside it
            head, new_grads, new_first_grad = 0, 0, 0
        for k, reducing in [
            (k, r)
            for r in passes
            for k in sorted({0, 1, layers - 2, layers - 1} & set(range(layers)))
        ]:
            held = f["layer_rs"] if k and reducing else 0
            gone, gone_copies = freed(k + 1)
            # with several micro-batches every shard exists already and is added to in place
            shards = 0 if accumulating else k * f["layer_shard"]
            if s.no_sync and reducing:
                shards = -k * unsharded_layer
            elif s.no_sync and s.gradient_accumulation == 2:
                # the only micro-batch before the last starts with no gradients: the layers
                # done so far (k of them) hold theirs, unsharded
                shards = (k - layers) * self.gradients_full_layer
            end = dict(
                static,
                gradients=grads_fw + shards,
                activations=self.inputs + max(self.rope, self.fw_layers - gone) + 2 * p * t * h,
                temporaries=max(0, self.bw_copies - gone_copies)
                + head
                + f["root_params"]
                + f["layer_params"]
                + new_grads
                + held
                + (f["layer_flat"] if k < layers - 1 else 0),
            )
            # under no_sync the reduction reads the kept gradients, into which the new ones
            # have already been added (and freed)
            reduce = dict(
                end,
                temporaries=end["temporaries"]
                - f["layer_params"]
                - held
                + (f["layer_rs"] if reducing else 0)
                - (new_grads if s.no_sync else 0),
            )
            # its start: its activations still saved, its own gathered buffer not yet freed
            start = dict(
                end,
                activations=end["activations"] + kept(layers - 1 - k),
                temporaries=end["temporaries"]
                - new_grads
                + (0 if k < layers - 1 else f["layer_flat"]),
            )
            # inside its MLP's backward (as bw_layer without FSDP): down_proj's gradient done
            moments += [start, end, reduce]
            for extra, temps in self._inside_layer(first=k == layers - 1):
                moments.append(
                    dict(
                        start,
                        activations=start["activations"] - 2 * p * t * h + extra,
                        temporaries=start["temporaries"]
                        + temps
                        + new_first_grad
                        - (0 if k < layers - 1 else f["layer_flat"]),
                    )
                )
        layer_grads = self.gradients - (0 if accumulating else f["root_shard"])
        root = dict(
            static,
            gradients=layer_grads,
            activations=self.inputs + 2 * p * t * h,
            temporaries=f["layer_rs"] + f["root_params"] + f["root_grads"],
        )
        root_reduce = dict(
            static,
            gradients=layer_grads,
            activations=self.inputs,
            temporaries=f["root_grads"] + f["root_rs"],
        )
        if s.no_sync:  # the last micro-batch's root: every layer reduced to its shard by then
            done = layers * unsharded_layer
            root = dict(root, gradients=layer_grads - done)
            root_reduce = dict(root_reduce, gradients=layer_grads - done)
            # an earlier micro-batch's root: every gradient kept, nothing reduced
            moments.append(
                dict(root, temporaries=f["root_params"] + f["root_grads"], gradients=layer_grads)
            )
        return [fw_end, fw_gather], [*moments, root, root_reduce]

    def assumptions(self) -> list[str]:
        spec, s = self.spec, self.s
        notes = []
        if spec.note:
            notes.append(spec.note)
        half = "fp16" if s.precision.startswith("fp16") else "bf16"
        sharded_mixed = (
            f"ZeRO-3 with {half} mixed precision as FSDP and DeepSpeed run it "
            f"(FSDP2: MixedPrecisionPolicy(param_dtype={half}, reduce_dtype=fp32)): "
            "fp32 shards of the weights, gradients and optimizer states; each layer "
            f"is gathered directly in {half} and freed after use, so there are no "
            "autocast copies; gradients are reduced in fp32."
        )
        notes.append(
            sharded_mixed
            if self.sharded_mixed
            else {
                "fp32": "fp32 weights, gradients, optimizer states and compute.",
                "bf16-mixed": "fp32 weights under bf16 autocast: fp32 gradients and states, plus "
                "autocast's bf16 copy of each weight, kept until its backward.",
                "fp16-mixed": "fp32 weights under fp16 autocast: fp32 gradients and states, plus "
                "autocast's fp16 copy of each weight (loss scaling adds nothing).",
                "bf16": (
                    "Pure bf16: weights, gradients and optimizer states all in bf16."
                    if s.method == "full"
                    else "The frozen base model in bf16 ("
                    + ("NF4 linear layers, " if s.method == "qlora" else "")
                    + "no gradients or states); the adapters, their gradients and optimizer "
                    f"states in {s.lora_dtype}."
                ),
                "bf16-master": "bf16 weights and gradients; the optimizer keeps fp32 master weights "
                "and fp32 states (4 + 4 + 4 bytes per parameter) and makes fp32 "
                "copies of the gradients at the step.",
            }[s.precision]
        )
        notes.append(
            {
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
            }[s.optimizer]
        )
        if s.method != "full":
            targets = (
                s.lora_targets if isinstance(s.lora_targets, str) else ", ".join(s.lora_targets)
            )
            notes.append(
                f"LoRA rank {s.lora_rank} on {targets}: "
                f"{self.trainable_params:,} trainable parameters in {s.lora_dtype} "
                "(peft keeps adapters in fp32 by default); the base model is frozen."
            )
            if spec.lora_default_note(s.lora_targets):
                notes.append(spec.lora_default_note(s.lora_targets))
        if s.method != "full" and s.lora_dropout:
            notes.append(
                f"LoRA dropout {s.lora_dropout:g} (peft): each adapter keeps its own "
                "dropped-out copy of its input and, where the input needs a gradient, "
                "the dropout's mask (1 byte per element on CUDA, the input's dtype on "
                "CPU)."
            )
        if s.method == "qlora":
            dq = (
                "double quantization (a uint8 absmax per 64 values and an fp32 constant per "
                "256 blocks)"
                if s.double_quant
                else "an fp32 absmax per 64 values"
            )
            notes.append(
                "QLoRA: the decoder's linear weights in NF4, 0.5 bytes per parameter "
                f"with {dq}; embeddings, norms and lm_head stay in "
                f"{'fp32' if self.p == 4 else 'bf16'}. Each layer's weight is "
                "dequantized into a 16-bit temporary in forward and again in backward; "
                "its output comes back in its input's dtype."
            )
            notes.append(
                "bitsandbytes 0.43.2 or later (measured with 0.50.2): a 4-bit layer keeps only "
                "its packed weight for backward."
                if s.bitsandbytes == "current"
                else "bitsandbytes before 0.43.2 (e.g. 0.41.1, 2023): each 4-bit layer also keeps its "
                "input for backward, on the autograd context, so gradient checkpointing does "
                "not free it (fixed by bitsandbytes PR #1270, released in 0.43.2)."
            )
        attn = {
            "sdpa": "SDPA attention (flash / memory-efficient kernels): no seq x seq matrix "
            "is kept.",
            "flash": "FlashAttention: no seq x seq matrix is kept.",
            "eager": "Eager attention: the seq x seq scores and probabilities are kept for "
            "every head (fp32 softmax).",
        }[s.attention]
        notes.append(attn)
        if spec.family == "gpt2":
            notes.append(
                "GPT-2's dropout (0.1, transformers' default) is on: each dropout keeps "
                "a mask"
                + (
                    " in its input's dtype, and SDPA takes the math path (CPU kernels)."
                    if s.device == "cpu"
                    else " of 1 byte per element."
                )
            )
        if s.gradient_checkpointing:
            notes.append(
                "Gradient checkpointing: each layer keeps only its input; one layer's "
                "activations are recomputed at a time in backward."
            )
        if s.optimizer_in_backward:
            notes.append(
                "Optimizer step in backward (torchtune's optimizer_in_bwd, PyTorch's "
                "register_post_accumulate_grad_hook tutorial): each parameter has its own "
                "optimizer, stepped as soon as its gradient is made, which is then freed: one "
                "tensor's gradient and step temporaries at a time, none kept after backward. "
                "It rules out gradient accumulation and clipping by the global gradient norm."
            )
        if s.activation_offload:
            link = pcie_link()
            seconds = 2 * self.offloaded * s.gradient_accumulation / (link["bandwidth_gbs"] * 1e9)
            notes.append(
                "Activation offloading (torch.autograd.graph.save_on_cpu, TRL's "
                "activation_offloading, torchtune's OffloadActivations) with checkpointing: "
                "each layer's checkpointed input and the head's saved tensors live in CPU RAM "
                f"(about {self.offloaded / GiB:.2f} GiB per micro-batch) and come back one "
                "layer at a time in backward; autocast's copies of trained weights stay until "
                "the forward ends. The cost is time: that much crosses PCIe twice per "
                f"micro-batch, {seconds * 1e3:,.0f} ms per step at {link['name']}'s "
                f"{link['bandwidth_gbs']:g} GB/s ({link['source']}), partly hidden behind "
                "compute when the host memory is pinned."
            )
        if s.gradient_accumulation > 1:
            notes.append(
                f"{s.gradient_accumulation} micro-batches: activations are those of "
                "one micro-batch, but gradients stay allocated between them."
            )
        logits = 4 * s.batch_size * s.seq_len * spec.vocab_size
        if s.loss == "chunked":
            notes.append(
                f"Chunked cross-entropy in {s.loss_chunks} chunks (torchtune's "
                "CEWithChunkedOutputLoss): lm_head runs on each chunk of the sequence and each "
                "chunk's logits are upcast to fp32 in turn, so the full fp32 copy "
                f"({logits / GiB:.2f} GiB for a vocabulary of {spec.vocab_size:,}) never exists; "
                "the log-softmax of every chunk is still kept for backward."
            )
        else:
            notes.append(
                f"Logits: the loss upcasts the logits to fp32 and keeps the "
                f"log-softmax ({logits / GiB:.2f} GiB for a vocabulary of "
                f"{spec.vocab_size:,}); their gradients appear at the start of "
                "backward."
            )
        if s.n_gpus > 1 or s.zero_stage:
            kind = {
                0: "DDP: everything replicated, plus gradient buckets as large as the gradients",
                1: "ZeRO-1: optimizer states sharded",
                2: "ZeRO-2: optimizer states and gradients sharded",
                3: "ZeRO-3 (FSDP, one unit per decoder layer): parameters, gradients and "
                "states sharded; the embeddings, final norm and lm_head stay gathered "
                "through forward and backward; one decoder layer's parameters are "
                "gathered at a time, beside the next layer's all-gather buffer "
                "(prefetched); in backward, add that layer's unsharded gradients and one "
                "reduce-scatter buffer (the previous layer's, then its own): at most "
                "four layer-sized buffers at once, beside lm_head's unsharded gradient "
                "(held until the root's reduction); with several micro-batches the "
                "gradient shards exist from the first and are added to in place",
            }[s.zero_stage]
            notes.append(f"{s.n_gpus} GPUs, {kind}; figures are per GPU.")
        if s.no_sync:
            notes.append(
                "no_sync: gradients are reduced on the last micro-batch only (FSDP2's "
                "set_requires_gradient_sync(False), what the Trainer does under FSDP), so "
                + (
                    "each GPU accumulates full, unsharded gradients "
                    f"({self.gradients / GiB:.2f} GiB) in place of its shard."
                    if s.zero_stage == 3
                    else "only the communication is skipped: the gradients are full-size anyway."
                )
            )
        if s.offload_optimizer:
            notes.append(
                "Optimizer states offloaded to CPU RAM: 0 on the GPU (the CPU needs "
                f"{self.offload_bytes / GiB:.1f} GiB for them and the step)."
            )
        if s.device == "cuda":
            const = cuda_constants()
            ratio = const["allocator_margin_ratio"] - 1
            notes.append(
                f"CUDA context {const['cuda_context_bytes'] / GiB:.2f} GiB and an "
                f"allocator margin of {ratio:.0%} of the tensor peak "
                f"(source: {const['source']}; as of {const['as_of']})."
            )
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
        settings = self.s.as_dict()
        settings["estimated"] = {  # with the step in backward no gradient is kept
            "weight_bytes": self.weights,
            "gradient_bytes": 0 if self.oib else self.gradients,
            "optimizer_bytes": self.optimizer,
            "trainable_parameters": self.trainable_params,
        }
        if self.s.activation_offload:
            settings["estimated"]["offloaded_bytes"] = self.offloaded
        return MemoryReport(
            model=self.spec,
            settings=settings,
            breakdown=breakdown,
            peak_phase=phase,
            phase_peaks=peaks,
            assumptions=self.assumptions(),
            source="estimate",
            timeline_source=self.timeline,
        )

    def timeline(self) -> Any:
        """The step's moments in time order (memory/timeline.py), made when first asked for."""
        from .timeline import estimated

        return estimated(self)
