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

import functools
import math
from typing import Any

from ..models.presets import resolve_model
from ..models.spec import DEFAULT_LORA_TARGETS, ModelSpec
from ..options import DTYPE_BYTES
from . import activations as acts
from . import chunked_head, fsdp1, layers, step_notes, zero3
from . import optimizers as opt
from .compiled import compiled_cross_entropy_bytes
from .loading import estimate_loading
from .report import MemoryReport
from .settings import RunSettings, layer_lora_targets, outer_lora_targets, validate_run
from .step_notes import cuda_constants

GPT2_DROPOUT = 0.1  # transformers' GPT2Config default for resid/embd/attn dropout
NF4_BLOCK, NF4_NESTED_BLOCK = 64, 256


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


def _buffer_bytes(spec: ModelSpec, stored_bytes: int) -> int:
    if spec.family == "gpt2":
        return 0
    if spec.family == "traced":  # the meta model's own buffers
        from ..models.traced import meta_inventory

        inventory = meta_inventory(spec.extra["config"], spec.extra["model_type"], spec.n_layers)
        return int(inventory["buffer_bytes"])
    rotary = 2 * 4 * (spec.head_width // 2)  # rotary inv_freq and original_inv_freq, fp32
    if spec.family == "gemma3_text":
        rotary *= len(set(spec.layer_types))  # a pair for each type of layer (sliding, full)
    # Gemma's and Gemma 3's embeddings hold their scale, sqrt(hidden_size), as a buffer of the
    # weights' dtype
    return rotary + (stored_bytes if spec.family in ("gemma", "gemma3_text") else 0)


def _kept_fp32(spec: ModelSpec) -> tuple[str, ...]:
    """The parameters a traced model keeps in fp32 when loaded in 16 bits."""
    if spec.family != "traced":
        return ()
    from ..models.traced import meta_inventory

    inventory = meta_inventory(spec.extra["config"], spec.extra["model_type"], spec.n_layers)
    return tuple(inventory["kept_fp32"])


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
    fsdp_version: int = 2,
    compile: bool = False,
) -> MemoryReport:
    """Estimate the peak GPU memory per GPU of one training step of ``model``.

    ``model`` is a preset name ("llama-2-7b"), a size ("7B", 7e9), a ModelSpec or a Hugging
    Face config dict. ``precision`` defaults to the method's usual precision
    (``settings.usual_precision``: "bf16-mixed" for full fine-tuning, "bf16" for LoRA and QLoRA),
    as everywhere in lessonkit. ``lora_targets`` may add "lm_head" (an untied output head, as
    LitGPT's lora_head) and "embed_tokens" (peft's LoRA Embedding) to the layers' modules.
    Returns a MemoryReport with the breakdown at the peak, the peak
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
        fsdp_version=fsdp_version,
        compile=compile,
    )
    return _Step(spec, s).report()


class _Step:
    """The arithmetic of one step; each attribute is bytes on one GPU."""

    def __init__(self, spec: ModelSpec, s: RunSettings) -> None:
        self.spec, self.settings = spec, s
        full, lora, qlora = s.method == "full", s.method != "full", s.method == "qlora"
        self.stored_bytes = 2 if s.precision in ("bf16", "bf16-master") else 4  # stored weights
        self.compute_bytes = 4 if s.precision == "fp32" else 2
        # ZeRO-3 with "-mixed" is FSDP's mixed precision: the fp32 shards are gathered in 16
        # bits and the model computes as in pure 16 bits, without autocast
        self.sharded_mixed = s.sharded_mixed
        self.autocast = s.mixed and not self.sharded_mixed
        self.residual_bytes = (
            self.compute_bytes if self.sharded_mixed else self.stored_bytes
        )  # the residual stream's dtype
        self.adapter_bytes = DTYPE_BYTES[s.lora_dtype]
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
                nbytes = (
                    self.compute_bytes if qlora and tensor.kind == "bias" else self.stored_bytes
                )
                layer_params.append((tensor.shape, nbytes, full))
        # a traced model's tensors are all outer ones, its decoder's linear weights among them
        kept_fp32 = _kept_fp32(spec)
        root_params = [
            (tensor.shape, 4 if tensor.name in kept_fp32 else self.stored_bytes, full)
            for tensor in tensors.outer
            if not (qlora and tensor.kind == "linear")
        ]
        if lora:  # a traced model's shapes are every layer's, its tensors outer ones
            adapters = root_params if spec.family == "traced" else layer_params
            for n_in, n_out in spec.lora_shapes(layer_lora_targets(s.lora_targets)):
                adapters += [
                    ((s.lora_rank, n_in), self.adapter_bytes, True),
                    ((n_out, s.lora_rank), self.adapter_bytes, True),
                ]
            # the experts' 3D weights (peft's ParamWrapper): A [r x experts, in], B [out, r x experts]
            for experts, n_in, n_out in spec.expert_lora_shapes(s.lora_targets):
                adapters += [
                    ((s.lora_rank * experts, n_in), self.adapter_bytes, True),
                    ((n_out, s.lora_rank * experts), self.adapter_bytes, True),
                ]
            # outside the layers: lm_head's A [r, hidden] and B [vocab, r]; peft's LoRA
            # Embedding's A [r, vocab] and B [hidden, r]
            outer = outer_lora_targets(s.lora_targets)
            r, h, v = s.lora_rank, spec.hidden_size, spec.vocab_size
            outer_shapes: list[tuple[int, ...]] = []
            if "lm_head" in outer:
                outer_shapes += [(r, h), (v, r)]
            if "embed_tokens" in outer:
                outer_shapes += [(r, v), (h, r)]
            root_params += [(shape, self.adapter_bytes, True) for shape in outer_shapes]

        # weights on this GPU, and (shape, count) of the trainable tensors
        weights = _buffer_bytes(spec, self.stored_bytes)
        if qlora:
            weights += layers * sum(
                _nf4_bytes(math.prod(tensor.shape), s.double_quant)
                for tensor in tensors.layer
                if tensor.kind == "linear"
            ) + sum(
                _nf4_bytes(math.prod(tensor.shape), s.double_quant)
                for tensor in tensors.outer
                if tensor.kind == "linear"
            )
        trainable: list[tuple[tuple[int, ...], int]] = []
        for params, count in ((layer_params, layers), (root_params, 1)):
            for shape, nbytes, trained in params:
                weights += nbytes * math.prod(local(shape, 3 if zero == 3 else 0)) * count
                if trained:
                    trainable.append((shape, count))
        self.weights = weights
        grad_dtype = self.adapter_bytes if lora else self.stored_bytes
        self.trainable_params = sum(math.prod(sh) * count for sh, count in trainable)
        grads_full = grad_dtype * self.trainable_params
        # gradients: sharded from ZeRO-2; DDP (several GPUs, ZeRO-0) adds its flat buckets
        g_stage = zero if zero >= 2 else 0
        self.gradients = sum(
            grad_dtype * math.prod(local(sh, g_stage)) * count for sh, count in trainable
        )
        # a traced model's tensors kept in fp32 (DeepSeek-V3's router): fp32 gradients too
        kept_trained = [
            t.shape for t in tensors.outer if full and t.name in kept_fp32 and grad_dtype < 4
        ]
        self.gradients += sum(
            (4 - grad_dtype) * math.prod(local(sh, g_stage)) for sh in kept_trained
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
        self.step_in_backward = s.optimizer_in_backward

        def step_temps(shape: tuple[int, ...]) -> int:
            return opt.step_temporaries(
                s.optimizer, [(math.prod(shape), shape, 1)], grad_dtype, master
            )

        self.in_backward_head_grads = self.in_backward_head_temps = self.in_backward_mlp_temps = (
            self.in_backward_embed_temps
        ) = 0
        if self.step_in_backward:
            self.in_backward_head_grads, self.head_grads, self.layer_grads = self.head_grads, 0, 0
            self.in_backward_head_temps = step_temps((spec.vocab_size, spec.hidden_size))
            self.in_backward_mlp_temps = step_temps(mlp_out) if full else 0
            self.in_backward_embed_temps = (
                step_temps((spec.vocab_size, spec.hidden_size)) if full else 0
            )
        # optimizer states: sharded from ZeRO-1
        shards = [(math.prod(local(sh, zero)), local(sh, zero), count) for sh, count in trainable]
        state = opt.state_bytes(s.optimizer, shards, grad_dtype, master)
        kept_shards = [(math.prod(local(sh, zero)), local(sh, zero), 1) for sh in kept_trained]
        state += opt.state_bytes(s.optimizer, kept_shards, 4, master) - opt.state_bytes(
            s.optimizer, kept_shards, grad_dtype, master
        )
        if s.optimizer == "adamw-fused":
            state += 4 * sum(count for _, count in trainable)  # step counters on the GPU
        self.offload_bytes = state if s.offload_optimizer else 0
        self.optimizer = 0 if s.offload_optimizer else state
        # the part of the states a paged bitsandbytes optimizer keeps in CUDA managed memory
        self.managed = 0 if s.offload_optimizer else opt.paged_state_bytes(s.optimizer, shards)
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
            self.fsdp_first_grad = (
                self.compute_bytes if self.sharded_mixed else self.stored_bytes
            ) * first
            # the root's parameters (embeddings, final norm, lm_head) stay gathered for the
            # whole forward and backward; a decoder layer's gathered buffer is held until
            # the next layer is gathered
            self.gather = self.fsdp["root_params"] + self.fsdp["layer_flat"]
            if s.fsdp_version == 1:  # flat parameters per unit (memory/fsdp1.py)
                fsdp1.apply(self)

        # activations
        self.embed_lora = lora and "embed_tokens" in outer_lora_targets(s.lora_targets)
        targets = (
            frozenset(k.split(".")[-1] for k in spec.linear_shapes())
            if s.lora_targets == "all-linear"
            else frozenset(s.lora_targets)
        )
        dropout = GPT2_DROPOUT if spec.family == "gpt2" else 0.0
        self.ctx = acts.StepContext(
            batch_size=s.batch_size,
            seq_len=s.seq_len,
            residual_bytes=self.residual_bytes,
            compute_bytes=self.compute_bytes,
            autocast=self.autocast,
            trains_base=full or s.fsdp_version == 1,  # FSDP1: frozen tensors get gradients
            lora_targets=targets if lora else frozenset(),
            adapter_bytes=self.compute_bytes if self.sharded_mixed else self.adapter_bytes,
            lora_rank=s.lora_rank,
            qlora=qlora,
            attention=s.attention,
            dropout=dropout,
            cpu_kernels=s.device == "cpu",
            lora_dropout=s.lora_dropout if lora else 0.0,
            bnb_saves_input=qlora and s.bitsandbytes == "before-0.43.2",
        )
        self._activations()
        if s.compile:  # the partitioner's saved tensors, from data (memory/compiled.py)
            from .compiled import apply_compiled

            apply_compiled(self)

    @functools.cached_property
    def loading(self) -> Any:
        """Loading the checkpoint before the first step (memory/loading.py), worked out when
        the report's text or timeline first asks for it."""
        return estimate_loading(
            self.spec, self.settings, _buffer_bytes(self.spec, self.stored_bytes)
        )

    def _fsdp_buffers(
        self, layer_params: list[Any], root_params: list[Any], local: Any
    ) -> dict[str, int]:
        return zero3.fsdp_buffers(self, layer_params, root_params, local)

    def _activations(self) -> None:
        spec, s, ctx = self.spec, self.settings, self.ctx
        t, h, v = ctx.tokens, spec.hidden_size, spec.vocab_size
        p = self.residual_bytes
        full = ctx.trains_base
        ckpt = s.gradient_checkpointing
        if spec.family == "traced":
            first, rest, other, average = self._traced_layers()
        else:
            # checkpointing with LoRA makes the inputs require grad, as LoRA on the embeddings does
            first_grad = fsdp1.root_context(ctx, s).trains_base or ckpt or self.embed_lora
            rest, other, first = layers.saved_by_layer(spec, ctx, first_grad)
        # each layer's saved tensors less the rotary tables, which every layer shares
        self.layers_saved, rope = layers.without_rope([first, *rest])
        self.layer_saved = layers.without_rope([other])[0][0]
        self.layer_copies = other.weight_copies
        if spec.family == "traced":  # autocast's copies of the layers after the first, on average
            self.layer_copies = average.weight_copies
        self.first_saved = self.layers_saved[0]
        self.first_copies = first.weight_copies
        self.first_layer, self.other_layer = first, other
        self.saved_layers = [first, *rest]
        self.backward_ends = layers.layers_saved_ends(self.saved_layers)
        self.rope = rope
        root_ctx = fsdp1.root_context(ctx, s)  # FSDP1: the root's own gradients decide
        self.embed_saved = layers.Embeddings().saved_bytes(spec, root_ctx, ckpt)
        if self.embed_lora:  # peft's LoRA Embedding: B's matmul saves A's rank-r output
            self.embed_saved += ctx.adapter_bytes * t * ctx.lora_rank
        # the head: final norm, lm_head, log-softmax (fp32) and the targets
        head = layers.Head().saved(spec, root_ctx)
        if spec.family == "traced":
            head = acts.Saved()
            head.add("traced", int(self.trace.outside_per_token * t))
        self.head_saved = head.activations + 8 * t + self.embed_saved  # + the shifted labels
        # what lm_head itself saves (its input, or autocast's cast of it): recipes that offload
        # activations leave it on the device (see phases())
        self.head_kept = sum(
            nbytes
            for key, nbytes in head.items.items()
            if key == "final.out" or key.startswith("lm_head")
        )
        # the final RMSNorm's fp32 input is saved twice (by its square and by its product
        # with rstd): one tensor on the device, but offloading copies each saved reference
        self.norm_input_again = head.items.get("final.x_fp32", head.items.get("final.x", 0))
        if spec.norm == "layernorm":
            self.norm_input_again = 0
        self.head_copies = head.weight_copies
        if s.loss == "chunked" and not full:
            # autocast casts a frozen lm_head anew for each chunk, and each chunk saves its cast
            self.head_copies *= s.loss_chunks
        self.logsoftmax = 4 * t * v
        self.inputs = 8 * t  # input_ids (the labels are the same tensor)
        copies = self.first_copies + (spec.n_layers - 1) * self.layer_copies
        # bitsandbytes before 0.43.2 kept the 4-bit layers' inputs on ctx, not as saved
        # tensors: checkpointing cannot drop them, so each layer keeps them beside its input
        self.legacy_bnb_inputs = (
            sum(other.items[k] for k in other.bnb_inputs if k != "L1.x") if ckpt else 0
        )
        if ckpt:
            # each layer keeps only its input; autocast still caches the copies of trained
            # weights until the forward ends, and nothing is saved for backward
            self.fw_layers = spec.n_layers * (p * t * h + self.legacy_bnb_inputs) + self.rope
            self.fw_layers += layers.checkpointed_masks(spec, ctx)
            self.fw_copies, self.bw_copies = (copies if full else 0), 0
        else:
            self.fw_layers = sum(self.layers_saved) + self.rope
            self.fw_copies = self.bw_copies = copies  # saved until each layer's backward
        # activation offloading as torchtune's and TRL's recipes do it: whatever the decoder
        # saves for backward goes to host memory, and autocast's cached copies of trained
        # weights are all that stays until the forward ends; lm_head's own saved tensors stay
        # on the device (a no-op region around its forward), and so does a chunked loss, which
        # torchtune computes outside the offloading region
        # with LoRA and checkpointing the embeddings' output is made to require grad: a leaf,
        # which its gradient's accumulator keeps on the device although it is offloaded
        self.offload_kept = p * t * h if ckpt and not full else 0
        # what goes to the host: every saved tensor outside the checkpointed layers (their
        # inputs, the embedding's indices, the final norm's) and, with the standard loss (in
        # the model's forward), the loss's two fp32 [tokens, vocab] tensors
        self.offloaded = (
            self.inputs
            + self.fw_layers
            + self.head_saved
            - self.head_kept
            + self.norm_input_again
            - layers.Embeddings().leaf_bytes(spec, root_ctx, ckpt)
            + (2 * self.logsoftmax if s.loss == "standard" else 0)
            if s.activation_offload
            else 0
        )
        if s.activation_offload:
            self.fw_copies, self.bw_copies = (copies if full else 0), 0

    def _traced_layers(self) -> tuple[acts.Saved, list[acts.Saved], acts.Saved, acts.Saved]:
        """A traced model's decoder layers (memory/tracing.py), scaled to the step's tokens:
        the first, each of the others (as the traced layer of its kind), the kind that saves
        the most, and the others on average."""
        from .tracing import LayerTrace, traced_activations

        self.trace = trace = traced_activations(self.spec, self.settings)
        shape = self.ctx.batch_size, self.ctx.seq_len

        def saved(layer: LayerTrace) -> acts.Saved:
            result = acts.Saved()
            result.add("L.traced", layer.saved(*shape))
            result.weight_copies = int(layer.fixed)
            return result

        kinds = [saved(kind) for kind in trace.kinds]
        rest = [kinds[kind] for kind in trace.others]
        return saved(trace.first), rest, saved(trace.largest(*shape)), saved(trace.average())

    def phases(self) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
        spec, s, ctx = self.spec, self.settings, self.ctx
        t, h, v, p, c = (
            ctx.tokens,
            spec.hidden_size,
            spec.vocab_size,
            self.residual_bytes,
            self.compute_bytes,
        )
        static = {"weights": self.weights, "optimizer": self.optimizer}
        grads_fw = self.gradients if s.gradient_accumulation > 1 else self.buckets
        logits_fw = c * t * v + (4 * t * v if c != 4 else 0) + self.logsoftmax
        logits_bw = self.logsoftmax + 8 * t * v
        chunk = s.batch_size * -(-s.seq_len // s.loss_chunks) * v  # the largest chunk's
        if s.loss == "chunked" and s.compile:
            # each chunk's compiled cross-entropy keeps its logits and a few numbers per token
            # (no fp32 copy or log-softmax: the upcast is fused into its kernels); its backward
            # makes the chunk's logit gradient while the chunk's logits are still kept
            loss = compiled_cross_entropy_bytes(t, v, c, chunk)
            logits_fw, logits_bw = loss.kept, loss.kept + loss.gradient
        elif s.loss == "chunked":
            # every chunk's logits and log-softmax stay, but only one chunk's fp32 copy and,
            # in backward, one chunk's two fp32 gradients exist at a time (the largest chunk)
            logits_fw = c * t * v + (4 * chunk if c != 4 else 0) + self.logsoftmax
            logits_bw = self.logsoftmax + 8 * chunk
        # the residual before the final norm, still held by the model's forward at the loss
        # (a chunked loss runs after the decoder has returned)
        last_hidden = 0 if s.loss == "chunked" else p * t * h
        # offloaded: only lm_head's saved tensors and the labels the loss is working on stay
        offload_kept = self.offload_kept + self.head_kept
        saved = 8 * t + offload_kept if s.activation_offload else self.fw_layers + self.head_saved
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
            activations=self.inputs + (offload_kept if s.activation_offload else saved),
            logits=logits_bw,
            temporaries=self.head_copies + self.bw_copies + self.gather,
        )
        bw_layers = self._layer_moments(static, grads_fw)
        # end: every gradient; tied embeddings add the embedding's gradient to lm_head's
        tied = 2 * p * v * h if ctx.trains_base and spec.tie_embeddings else 0
        bw_end = dict(
            static,
            gradients=0 if self.step_in_backward else self.gradients,
            activations=self.inputs + 2 * p * t * h + tied,
            temporaries=self.gather + self.in_backward_embed_temps,
        )
        step = dict(
            static,
            gradients=0 if self.step_in_backward else self.step_gradients,
            activations=self.inputs,
            temporaries=0 if self.step_in_backward else self.step_temps,
        )
        fws, bws = [fw], [bw_start, *bw_layers, bw_end]
        self.head_backward = chunked_head.backward_moments(self, bw_start)
        bws[1:1] = self.head_backward  # the chunked loss's head (memory/chunked_head.py): LoRA
        self.head_accumulation = chunked_head.accumulation_moments(self, bw_start)
        bws[1:1] = self.head_accumulation  # and full fine-tuning
        extra = self.other_layer.forward_extra
        if extra and not (s.gradient_checkpointing or s.activation_offload or self.fsdp):
            # the last layer's forward at its top (MoE: its rows put back in token order),
            # beside its input and the embeddings' output, which the frames hold until then
            held = self.first_layer.held_unless_saved("L0.x", p * t * h)
            if spec.n_layers > 1:
                held += self.other_layer.held_unless_saved("L1.x", p * t * h)
            below = self.inputs + self.embed_saved + self.fw_layers
            fws.append(dict(fw, activations=below + held + extra, logits=0))
        if self.in_backward_head_grads:  # lm_head's gradient, stepped as backward begins
            bws.append(
                dict(
                    bw_start,
                    gradients=self.in_backward_head_grads,
                    logits=0,
                    activations=bw_start["activations"] + p * t * h,
                    temporaries=bw_start["temporaries"] + self.in_backward_head_temps,
                )
            )
        if self.fsdp:
            more_fw, bws = self._fsdp_moments(static, grads_fw)
            fws += more_fw
            # FSDP1 gathers the last decoder layer as soon as backward begins (prefetch)
            prefetch = self.fsdp.get("backward_prefetch", 0)
            bws = [dict(bw_start, temporaries=bw_start["temporaries"] + prefetch), *bws]
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
        spec, s = self.spec, self.settings
        t, h, p = self.ctx.tokens, spec.hidden_size, self.residual_bytes
        layers, ckpt = spec.n_layers, s.gradient_checkpointing
        kept = p * t * h + self.legacy_bnb_inputs if ckpt else self.layer_saved
        kept_copies = 0 if ckpt or s.activation_offload else self.layer_copies
        moments = []
        # k layers done; layers of several kinds (Gemma 3's): the first and last of each run
        for k in self.backward_ends if ks is None else ks:
            freed = k * kept if ckpt else sum(self.layers_saved[layers - k :])
            below = self.inputs + self.embed_saved + self.fw_layers - freed
            if s.activation_offload:  # only the layer at work is back on the device
                here = kept if ckpt or k == layers - 1 else self.layers_saved[layers - 1 - k]
                below = self.inputs + self.offload_kept + here
            if ks is not None:
                moments.append(
                    dict(
                        static,
                        gradients=grads_fw + self.head_grads + k * self.layer_grads,
                        activations=below + p * t * h,
                        temporaries=self.bw_copies - k * kept_copies + self.gather,
                    )
                )
            for extra, temps in self._inside_layer(k == layers - 1, layers - 1 - k):
                moments.append(
                    dict(
                        static,
                        gradients=grads_fw
                        + self.head_grads
                        + k * self.layer_grads
                        + (0 if s.compile else self.first_layer_grad),
                        activations=below + extra,
                        temporaries=self.bw_copies
                        - k * kept_copies
                        + temps
                        + self.gather
                        + self.in_backward_mlp_temps,
                    )
                )
        return moments

    def _inside_layer(self, first: bool, index: int | None = None) -> list[tuple[int, int]]:
        """The highest moments inside a layer's backward: the first layer's, the layer
        number ``index``'s, or the last layer's."""
        layer = self.first_layer if first else self.other_layer
        if index is not None and not first:
            layer = self.saved_layers[index]
        if self.settings.compile:
            from .compiled import compiled_inside_layer  # the backward graph's own moments

            return compiled_inside_layer(self, layer, first)
        return acts.backward_moments(
            layer,
            self.ctx,
            self.spec.hidden_size,
            self.spec.intermediate_size,
            "L0.x" if first else "L1.x",
            self.settings.gradient_checkpointing,
        )

    def _fsdp_moments(
        self, static: dict[str, int], grads_fw: int
    ) -> tuple[list[dict[str, int]], list[dict[str, int]]]:
        if self.settings.fsdp_version == 1:
            return fsdp1.moments(self, static, grads_fw)
        return zero3.fsdp_moments(self, static, grads_fw)

    def assumptions(self) -> list[str]:
        notes = step_notes.assumptions(self)
        if self.settings.compile:
            from .compiled import compiled_note

            notes.append(compiled_note(self.settings.loss == "chunked"))
        return notes

    def report(self) -> MemoryReport:
        peaks, by_phase = self.phases()
        phase = max(peaks, key=lambda name: peaks[name])
        breakdown = dict(by_phase[phase])
        tensors = sum(breakdown.values())
        if self.settings.device == "cuda":
            const = cuda_constants()
            breakdown["cuda_context"] = int(const["cuda_context_bytes"])
            pooled = tensors - self.managed  # managed memory is outside torch's caching allocator
            breakdown["allocator_margin"] = int(pooled * (const["allocator_margin_ratio"] - 1))
        settings = self.settings.as_dict()
        settings["estimated"] = {  # with the step in backward no gradient is kept
            "weight_bytes": self.weights,
            "gradient_bytes": 0 if self.step_in_backward else self.gradients,
            "optimizer_bytes": self.optimizer,
            "trainable_parameters": self.trainable_params,
        }
        if self.settings.activation_offload:
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
            managed_bytes=min(self.managed, breakdown["optimizer"]),
            loading_source=lambda: self.loading,
        )

    def timeline(self) -> Any:
        """The step's moments in time order (memory/timeline.py), made when first asked for."""
        from .timeline import estimated

        return estimated(self)
