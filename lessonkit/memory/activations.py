"""What one training step keeps for backward: the blocks a decoder layer is made of.

A decoder layer (memory/layers.py) is residual branches of these blocks. Each block
(``RMSNorm``, ``LayerNorm``, ``Attention``, ``GPT2Attention``, ``DenseMLP``, ``GPT2MLP``; and
outside the layers ``Embeddings`` and ``Head``, in layers.py) states the parameter tensors it
owns (``parameters``) and what its forward saves for backward (``forward``), walked in the
order a Hugging Face transformers model runs it. Each operator saves what autograd needs for the
gradients of the inputs that require one (a linear layer saves its input only when its weight is
trained, and its weight only when its input needs a gradient). Tensors shared by several
operators are counted once (by key). The byte counts match a measured PyTorch step on the shapes
checked in tests/memory/test_accuracy.py; tests/memory/test_blocks.py measures each block, and
each family's layer, on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ..models.spec import ModelSpec, ParamTensor


@dataclass(frozen=True)
class StepContext:
    """The settings that decide what a layer saves (sizes in bytes per element)."""

    batch_size: int
    seq_len: int
    residual_bytes: int  # dtype of the residual stream and of the non-quantized weights
    compute_bytes: int  # dtype the matrix multiplications run in
    autocast: bool  # autocast on (fp32 weights, 16-bit matmuls)
    trains_base: bool  # base weights trained (full fine-tuning)
    lora_targets: frozenset[str]  # LoRA target modules
    adapter_bytes: int  # LoRA adapters' dtype
    lora_rank: int
    qlora: bool
    attention: str  # "sdpa", "flash" or "eager"
    dropout: float  # dropout probability of the model's own dropout layers (GPT-2)
    cpu_kernels: bool  # CPU kernels (dropout masks in the input's dtype, SDPA math path)
    lora_dropout: float = 0.0  # peft's dropout on each adapter's input
    bnb_saves_input: bool = False  # bitsandbytes before 0.43.2: a 4-bit layer keeps its input

    @property
    def tokens(self) -> int:
        return self.batch_size * self.seq_len

    @property
    def quantized_output_bytes(self) -> int:
        """The dtype of what a linear layer of the decoder returns: bitsandbytes returns a
        4-bit layer's output in its input's dtype (fp32 under autocast over fp32 norms)."""
        return self.residual_bytes if self.qlora and self.autocast else self.compute_bytes


class Saved:
    """A set of saved tensors, each counted once, with the weight copies tallied apart.

    A decoder layer's also says what its backward begins with (see ``backward_moments``),
    as its last block (the MLP, whose backward runs first) sets it: the gradients made beside
    the one arriving from above before the output projection's backward, what that backward
    frees (the projection's saved input and weight copy), the gradients alive inside the MLP's
    backward after it, the tensors the forward still holds when the projection saves its last
    tensor (and its highest moment before that), and the projection's weight when dequantized.
    """

    def __init__(self) -> None:
        self.items: dict[str, int] = {}
        self.weight_copies = 0
        self.incoming = 0
        self.freed_first = self.freed_first_copies = 0
        self.mlp_grads = 0
        self.forward_held = 0
        self.forward_peak = 0  # the highest moment of its forward before that
        self.dequantized = 0
        self.dropout_grads = 0  # LoRA dropout on the output projection (see DenseMLP)
        self.unsort_grads = 0  # MoE: gradients alive in the un-permutation and weighting backward
        self.forward_extra = 0  # held beside all its saved tensors at its forward's top (MoE)
        # MoE with LoRA on the experts' weights (memory/experts.py): the folded expert stacks
        # the forward's cache holds without saving them, and the backward's moments of theirs
        self.cached_folds = 0
        self.weight_grad_moments: list[int] = []
        self.bnb_inputs: set[str] = set()  # inputs kept by 4-bit layers (bitsandbytes < 0.43.2)

    def add(self, key: str, nbytes: int) -> None:
        self.items.setdefault(key, nbytes)

    def held_unless_saved(self, key: str, nbytes: int) -> int:
        """What the forward's frames hold of tensor ``key`` when nothing saved it (so far)."""
        return 0 if key in self.items else nbytes

    @property
    def activations(self) -> int:
        return sum(self.items.values())


class Flow(NamedTuple):
    """The tensor flowing between blocks: its key, bytes per element, and whether it needs a
    gradient."""

    key: str
    element_bytes: int
    needs_grad: bool


class Block(Protocol):
    """One part of a decoder layer: the parameter tensors it owns and what it saves."""

    def parameters(self, spec: ModelSpec) -> tuple[ParamTensor, ...]: ...

    def forward(
        self, saved: Saved, ctx: StepContext, spec: ModelSpec, layer: int, flow: Flow
    ) -> Flow: ...


def _owned(spec: ModelSpec, prefixes: tuple[str, ...]) -> tuple[ParamTensor, ...]:
    """A decoder layer's parameter tensors whose names start with one of ``prefixes``."""
    return tuple(t for t in spec.parameter_tensors().layer if t.name.startswith(prefixes))


# ----- linear layers (plain, LoRA-wrapped or 4-bit) ------------------------------------------
def linear(
    saved: Saved,
    ctx: StepContext,
    name: str,
    flow: Flow,
    n_in: int,
    n_out: int,
    quantized: bool,
    held: int = 0,
) -> bool:
    """Apply one (possibly LoRA-wrapped) linear layer; returns whether its output needs a grad.

    ``held``: bytes the forward holds at this point besides the saved tensors and the input.
    """
    tokens, compute = ctx.tokens, ctx.compute_bytes
    x_key, x_bytes, x_grad = flow
    out_grad = x_grad
    if quantized:
        # the 4-bit forward dequantizes into a temporary; bitsandbytes before 0.43.2 also kept
        # the layer's input (cast to the compute dtype) when it needs a gradient
        if ctx.bnb_saves_input and x_grad:
            key = x_key if x_bytes == compute else f"{name}.x4bit"
            saved.add(key, compute * tokens * n_in)
            saved.bnb_inputs.add(key)
    else:
        weight_grad = ctx.trains_base
        cast = ctx.autocast and x_bytes != compute
        if weight_grad:
            saved.add(f"{name}.x_cast" if cast else x_key, compute * tokens * n_in)
            out_grad = True
        if ctx.autocast and ctx.residual_bytes != compute and (x_grad or weight_grad):
            saved.weight_copies += compute * n_in * n_out
    if name.split(".")[-1] in ctx.lora_targets:
        _lora(saved, ctx, name, flow, n_in, n_out, held)
        out_grad = True
    return out_grad


def _lora(
    saved: Saved, ctx: StepContext, name: str, flow: Flow, n_in: int, n_out: int, held: int
) -> None:
    """What peft's LoRA branch on a linear layer saves, and its forward's highest moment."""
    tokens, compute, adapter, rank = ctx.tokens, ctx.compute_bytes, ctx.adapter_bytes, ctx.lora_rank
    x_key, x_bytes, x_grad = flow
    if ctx.autocast:
        saved.add(f"{name}.lora_x", compute * tokens * n_in)
        saved.add(f"{name}.lora_a", compute * tokens * rank)
        if adapter != compute:
            saved.weight_copies += compute * rank * (n_in + n_out)
    else:
        # with dropout, lora_A saves its own dropped-out copy of the input
        own = x_bytes != adapter or ctx.lora_dropout > 0
        saved.add(f"{name}.lora_x" if own else x_key, adapter * tokens * n_in)
        saved.add(f"{name}.lora_a", adapter * tokens * rank)
    if ctx.lora_dropout > 0 and x_grad:
        # the dropout's mask, kept when the input needs a gradient: bool on CUDA, in the
        # adapters' dtype on CPU (the input is cast to it first)
        saved.add(f"{name}.lora_mask", (adapter if ctx.cpu_kernels else 1) * tokens * n_in)
    # peft's forward at its peak: the input (where nothing saved it) and its copy in the
    # adapters' dtype (autocast saves a 16-bit copy of that), the base output, and LoRA's
    # output with its scaled copy
    x_held = saved.held_unless_saved(x_key, x_bytes * tokens * n_in)
    cast = 4 * tokens * n_in if ctx.autocast and x_bytes != adapter else 0
    if not ctx.autocast and ctx.lora_dropout > 0 and x_bytes != adapter:
        cast = adapter * tokens * n_in  # the cast input, held beside its dropped-out copy
    lora_out = (compute if ctx.autocast else adapter) * tokens * n_out
    saved.forward_peak = max(
        saved.forward_peak,
        saved.activations + held + x_held + cast + compute * tokens * n_out + 2 * lora_out,
    )


# ----- norms ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RMSNorm:
    """An RMSNorm: ``module`` is its name in transformers, ``key`` its name in the keys."""

    module: str
    key: str
    float_output: bool = False  # Gemma 3: weighted in fp32, so the fp32 normed input is kept
    # Gemma 3 weighs by 1 + weight, made in fp32 and kept; gpt-oss by the weight itself
    float_scale: bool = True

    def parameters(self, spec: ModelSpec) -> tuple[ParamTensor, ...]:
        return _owned(spec, (f"{self.module}.",))

    def forward(
        self, saved: Saved, ctx: StepContext, spec: ModelSpec, layer: int, flow: Flow
    ) -> Flow:
        name = f"L{layer}.{self.key}"
        normed = 4 if self.float_output else flow.element_bytes
        grad = rmsnorm(
            saved,
            ctx,
            name,
            flow.key,
            flow.needs_grad,
            spec.hidden_size,
            flow.element_bytes,
            normed,
        )
        if self.float_output and self.float_scale and flow.needs_grad:
            # 1 + weight, in fp32, for the input's gradient
            saved.add(f"{name}.scale", 4 * spec.hidden_size)
        return Flow(f"{name}.out", ctx.residual_bytes, grad)


def rmsnorm(
    saved: Saved,
    ctx: StepContext,
    name: str,
    x_key: str,
    x_grad: bool,
    width: int,
    x_bytes: int | None = None,
    normed_bytes: int | None = None,
    rows_per_token: int = 1,
) -> bool:
    """An RMSNorm over ``width`` (``rows_per_token`` rows of it per token: the heads of a QK
    norm): its fp32 input and rstd when the input needs a gradient, its normalised input
    (in the input's dtype, or ``normed_bytes``) when its weight is trained."""
    tokens = ctx.tokens
    x_bytes = ctx.residual_bytes if x_bytes is None else x_bytes
    elements = tokens * rows_per_token * width
    if x_grad:
        saved.add(x_key if x_bytes == 4 else f"{name}.x_fp32", 4 * elements)
        saved.add(f"{name}.rstd", 4 * tokens * rows_per_token)
    if ctx.trains_base:
        saved.add(f"{name}.normed", (x_bytes if normed_bytes is None else normed_bytes) * elements)
    return x_grad or ctx.trains_base


@dataclass(frozen=True)
class LayerNorm:
    """A LayerNorm (weight and bias): ``module`` in transformers, ``key`` in the keys."""

    module: str
    key: str

    def parameters(self, spec: ModelSpec) -> tuple[ParamTensor, ...]:
        return _owned(spec, (f"{self.module}.",))

    def forward(
        self, saved: Saved, ctx: StepContext, spec: ModelSpec, layer: int, flow: Flow
    ) -> Flow:
        name = f"L{layer}.{self.key}"
        grad = layernorm(saved, ctx, name, flow.key, flow.needs_grad, spec.hidden_size)
        return Flow(f"{name}.out", ctx.residual_bytes, grad)


def layernorm(
    saved: Saved, ctx: StepContext, name: str, x_key: str, x_grad: bool, width: int
) -> bool:
    """A LayerNorm: its input and the fp32 mean and rstd."""
    if x_grad or ctx.trains_base:
        saved.add(x_key, ctx.residual_bytes * ctx.tokens * width)
        saved.add(f"{name}.stats", 8 * ctx.tokens)  # mean and rstd in fp32
    return x_grad or ctx.trains_base


def dropout_mask(ctx: StepContext, elements: int, dtype_bytes: int) -> int:
    """A dropout mask: bool on CUDA; the CPU kernel keeps it in the input's dtype."""
    if ctx.dropout == 0:
        return 0
    return elements * (dtype_bytes if ctx.cpu_kernels else 1)


# ----- attention -----------------------------------------------------------------------------
def attention_core(
    saved: Saved,
    ctx: StepContext,
    spec: ModelSpec,
    name: str,
    qk_bytes: int,
    v_key: str,
    q_grad: bool,
) -> None:
    """SDPA / eager attention on q, k (after rotary) and v (keys say what is shared)."""
    batch, seq, tokens, compute = ctx.batch_size, ctx.seq_len, ctx.tokens, ctx.compute_bytes
    q_size, kv_size, heads = spec.q_size, spec.kv_size, spec.n_heads
    if not q_grad:
        return
    if ctx.attention == "eager":
        repeats = spec.n_heads // spec.n_kv_heads
        saved.add(f"{name}.q", compute * tokens * q_size)
        saved.add(f"{name}.k", compute * tokens * (q_size if repeats > 1 else kv_size))
        saved.add(f"{name}.probs32", 4 * batch * heads * seq * seq)
        if qk_bytes != 4 or compute != 4:
            saved.add(f"{name}.probs", compute * batch * heads * seq * seq)
        v_saved = f"{name}.v" if repeats > 1 else v_key
        saved.add(v_saved, compute * tokens * (q_size if repeats > 1 else kv_size))
        saved.add(f"{name}.out", compute * tokens * q_size)  # the contiguous copy o_proj reads
        return
    saved.add(f"{name}.q", compute * tokens * q_size)
    saved.add(f"{name}.k", compute * tokens * kv_size)
    saved.add(v_key, compute * tokens * kv_size)
    saved.add(f"{name}.out", compute * tokens * q_size)
    saved.add(f"{name}.lse", 4 * batch * heads * seq)


@dataclass(frozen=True)
class Attention:
    """Rotary self-attention with q, k, v and o projections (Llama, Mistral, Qwen2, Gemma),
    grouped-query where the family has fewer key/value heads; ``fused``: one qkv_proj whose
    output v stays a view of (Phi-3); ``qk_norm``: an RMSNorm on q and k, per head ("head":
    Qwen3, Gemma 3) or over the whole projection ("projection": OLMo 2)."""

    fused: bool = False
    qk_norm: str = "none"
    float_norm: bool = False  # Gemma 3's QK norms weigh in fp32
    sliding: bool = False  # sliding-window layers (Gemma 3): a mask beyond the window
    # which rotary tables the layer reads, where each type of layer has its own (Gemma 3)
    rope_table: str = ""

    def parameters(self, spec: ModelSpec) -> tuple[ParamTensor, ...]:
        return _owned(spec, ("self_attn.",))

    def forward(
        self, saved: Saved, ctx: StepContext, spec: ModelSpec, layer: int, flow: Flow
    ) -> Flow:
        hidden, compute, residual = spec.hidden_size, ctx.compute_bytes, ctx.residual_bytes
        q_size, kv_size, prefix = spec.q_size, spec.kv_size, f"L{layer}"
        v_key = f"{prefix}.v_proj.out"
        if self.fused:
            qkv = q_size + 2 * kv_size
            any_grad = linear(saved, ctx, f"{prefix}.qkv_proj", flow, hidden, qkv, ctx.qlora)
            v_key = f"{prefix}.qkv_proj.out"
            if any_grad:  # v, a view, keeps the whole fused output alive
                saved.add(v_key, ctx.quantized_output_bytes * ctx.tokens * qkv)
        else:
            q_grad = linear(saved, ctx, f"{prefix}.q_proj", flow, hidden, q_size, ctx.qlora)
            k_grad = linear(saved, ctx, f"{prefix}.k_proj", flow, hidden, kv_size, ctx.qlora)
            v_grad = linear(saved, ctx, f"{prefix}.v_proj", flow, hidden, kv_size, ctx.qlora)
            any_grad = q_grad or k_grad or v_grad
        if self.qk_norm != "none":
            self._qk_norms(saved, ctx, spec, prefix, any_grad)
            any_grad = any_grad or ctx.trains_base
        if any_grad:  # rotary cos/sin are made once per forward and shared by every layer
            table = f"rope.{self.rope_table}." if self.rope_table else "rope."
            saved.add(f"{table}cos", residual * ctx.seq_len * spec.head_width)
            saved.add(f"{table}sin", residual * ctx.seq_len * spec.head_width)
        qk_bytes = max(compute, residual)  # q * cos promotes to the residual dtype
        attention_core(saved, ctx, spec, f"{prefix}.attn", qk_bytes, v_key, any_grad)
        window = spec.extra.get("sliding_window")
        beyond = isinstance(window, int) and ctx.seq_len > window
        if self.sliding and any_grad and ctx.attention != "eager" and beyond:
            # past the window SDPA is given the mask: the CPU kernel keeps it expanded to
            # every head, as bool, in each layer (measured); on CUDA the model's [batch, 1,
            # seq, seq] bool mask as given, counted in each layer (not measured)
            heads = spec.n_heads if ctx.cpu_kernels else 1
            saved.add(f"{prefix}.attn.mask", ctx.batch_size * heads * ctx.seq_len**2)
        out_grad = linear(
            saved,
            ctx,
            f"{prefix}.o_proj",
            # Phi-3's attention output reaches o_proj as a copy of its own (measured)
            Flow(f"{prefix}.attn.{'merged' if self.fused else 'out'}", compute, any_grad),
            q_size,
            hidden,
            ctx.qlora,
            held=saved.held_unless_saved(flow.key, residual * ctx.tokens * hidden),
        )
        return Flow(f"{prefix}.o_proj.out", compute, out_grad)

    def _qk_norms(
        self, saved: Saved, ctx: StepContext, spec: ModelSpec, prefix: str, grad: bool
    ) -> None:
        out_bytes = ctx.quantized_output_bytes
        normed = 4 if self.float_norm else out_bytes
        per_head = self.qk_norm == "head"
        for part, size, heads in (
            ("q", spec.q_size, spec.n_heads),
            ("k", spec.kv_size, spec.n_kv_heads),
        ):
            width = spec.head_width if per_head else size
            key = f"{prefix}.{part}_proj.out"
            name = f"{prefix}.{part}_norm"
            rmsnorm(saved, ctx, name, key, grad, width, out_bytes, normed, heads if per_head else 1)
            if self.float_norm and grad:  # Gemma's 1 + weight, in fp32
                saved.add(f"{name}.scale", 4 * width)


@dataclass(frozen=True)
class GPT2Attention:
    """GPT-2's attention: one fused Conv1D for q, k and v, no rotary, dropout after c_proj."""

    def parameters(self, spec: ModelSpec) -> tuple[ParamTensor, ...]:
        return _owned(spec, ("attn.",))

    def forward(
        self, saved: Saved, ctx: StepContext, spec: ModelSpec, layer: int, flow: Flow
    ) -> Flow:
        batch, seq, tokens = ctx.batch_size, ctx.seq_len, ctx.tokens
        hidden, heads, prefix = spec.hidden_size, spec.n_heads, f"L{layer}"
        out_bytes = ctx.quantized_output_bytes
        qkv_grad = linear(saved, ctx, f"{prefix}.c_attn", flow, hidden, 3 * hidden, ctx.qlora)
        scores = batch * heads * seq * seq
        if qkv_grad:
            if ctx.dropout and ctx.cpu_kernels:
                # CPU SDPA with dropout takes the math path, in fp32: q*scale, k and v, then
                # the softmax, the dropout mask and the dropped probabilities
                saved.add(f"{prefix}.attn.qkv32", 3 * 4 * tokens * hidden)
                saved.add(f"{prefix}.attn.probs", 3 * 4 * scores)
            elif ctx.attention == "eager":
                saved.add(f"{prefix}.c_attn.out", out_bytes * tokens * 3 * hidden)
                saved.add(f"{prefix}.attn.probs32", 4 * scores)
                if out_bytes != 4:
                    saved.add(f"{prefix}.attn.probs", out_bytes * scores)
                saved.add(f"{prefix}.attn.mask", dropout_mask(ctx, scores, out_bytes))
                if ctx.dropout:
                    saved.add(f"{prefix}.attn.dropped", out_bytes * scores)
            else:
                saved.add(f"{prefix}.c_attn.out", out_bytes * tokens * 3 * hidden)
                saved.add(f"{prefix}.attn.out", out_bytes * tokens * hidden)
                saved.add(f"{prefix}.attn.lse", 4 * batch * heads * seq)
        merged = Flow(f"{prefix}.attn.merged", out_bytes, qkv_grad)
        out_grad = linear(saved, ctx, f"{prefix}.c_proj", merged, hidden, hidden, ctx.qlora)
        if out_grad:
            saved.add(f"{prefix}.drop1", dropout_mask(ctx, tokens * hidden, out_bytes))
        return Flow(f"{prefix}.attn.dropped_out", out_bytes, out_grad)


# ----- MLPs ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DenseMLP:
    """A dense MLP: gated (gate_proj, up_proj, act(gate) * up, down_proj) or not (up_proj,
    act, down_proj). As the layer's last block it also sets what its backward begins with."""

    gated: bool = True
    fused: bool = False  # one gate_up_proj, chunked into gate and up (Phi-3)

    def parameters(self, spec: ModelSpec) -> tuple[ParamTensor, ...]:
        return _owned(spec, ("mlp.",))

    def forward(
        self, saved: Saved, ctx: StepContext, spec: ModelSpec, layer: int, flow: Flow
    ) -> Flow:
        tokens, hidden, inter = ctx.tokens, spec.hidden_size, spec.intermediate_size
        compute, residual, adapter = ctx.compute_bytes, ctx.residual_bytes, ctx.adapter_bytes
        prefix = f"L{layer}"
        # bitsandbytes returns a 4-bit layer's output in its input's dtype: with autocast over
        # fp32 norms the MLP's intermediates are fp32
        mid_bytes = ctx.quantized_output_bytes
        product = mid_bytes * tokens * inter  # one intermediate tensor
        if self.fused:
            inner_grad = linear(
                saved, ctx, f"{prefix}.gate_up_proj", flow, hidden, 2 * inter, ctx.qlora
            )
            if inner_grad:  # gate and up are views of one output; the activation's output
                saved.add(f"{prefix}.gate_up", 2 * product)
                saved.add(f"{prefix}.act", product)
        elif self.gated:
            gate_grad = linear(saved, ctx, f"{prefix}.gate_proj", flow, hidden, inter, ctx.qlora)
            if gate_grad:
                saved.add(f"{prefix}.gate", product)  # the activation function's input
            up_grad = linear(
                saved, ctx, f"{prefix}.up_proj", flow, hidden, inter, ctx.qlora, held=product
            )  # the activation function's output
            if up_grad:
                saved.add(f"{prefix}.act", product)
            if gate_grad:
                saved.add(f"{prefix}.up", product)
            inner_grad = gate_grad or up_grad
        else:
            inner_grad = linear(saved, ctx, f"{prefix}.up_proj", flow, hidden, inter, ctx.qlora)
            if inner_grad:
                saved.add(f"{prefix}.up", product)
        before, copies, peak = saved.activations, saved.weight_copies, saved.forward_peak
        inner = Flow(f"{prefix}.act_out", mid_bytes, inner_grad)
        out_grad = linear(
            saved,
            ctx,
            f"{prefix}.down_proj",
            inner,
            inter,
            hidden,
            ctx.qlora,
            held=saved.held_unless_saved(flow.key, residual * tokens * hidden),
        )
        saved.freed_first = saved.activations - before
        saved.freed_first_copies = saved.weight_copies - copies
        saved.forward_peak = peak  # a recomputation stops before down_proj's LoRA output
        # down_proj's input gradient, then the two the gate's product makes from it
        saved.mlp_grads = product * (3 if self.gated or self.fused else 2) if inner_grad else 0
        lora_out = "down_proj" in ctx.lora_targets
        if lora_out and inner_grad and ctx.lora_dropout > 0:
            # down_proj's input gradient in pieces: the base layer's, the adapter's (in its
            # dtype) and that times the dropout's mask, which is still held
            mask = (adapter if ctx.cpu_kernels else 1) * tokens * inter
            saved.dropout_grads = product + 2 * adapter * tokens * inter + mask
        # the residual's gradient cast to down_proj's dtype; LoRA's scaled branch gradient (with
        # 32-bit adapters outside autocast: scaled in 32 bits, and a 16-bit copy for the base)
        saved.incoming = compute * tokens * hidden if residual != compute else 0
        if lora_out:
            saved.incoming += compute * tokens * hidden + (
                adapter * tokens * hidden if not ctx.autocast and adapter != compute else 0
            )
        # held by the forward's frames when down_proj saves its last tensor: the MLP's input and
        # product where nothing saved them; with LoRA there, the base output and peft's copy of
        # the input in the adapters' dtype (autocast then saves a 16-bit copy of that)
        saved.forward_held = saved.held_unless_saved(
            flow.key, residual * tokens * hidden
        ) + saved.held_unless_saved(inner.key, product)
        if lora_out:
            saved.forward_held += compute * tokens * hidden + (
                4 * tokens * inter if ctx.autocast and adapter != compute else 0
            )
            if not ctx.autocast and ctx.lora_dropout > 0 and adapter != compute:
                saved.forward_held += adapter * tokens * inter  # the cast input, dropped copy
        saved.dequantized = compute * inter * hidden if ctx.qlora else 0
        return Flow(f"{prefix}.down_proj.out", compute, out_grad)


@dataclass(frozen=True)
class GPT2MLP:
    """GPT-2's MLP: c_fc, gelu_new (tanh formula), c_proj, dropout."""

    def parameters(self, spec: ModelSpec) -> tuple[ParamTensor, ...]:
        return _owned(spec, ("mlp.",))

    def forward(
        self, saved: Saved, ctx: StepContext, spec: ModelSpec, layer: int, flow: Flow
    ) -> Flow:
        tokens, hidden, inter, prefix = (
            ctx.tokens,
            spec.hidden_size,
            spec.intermediate_size,
            f"L{layer}",
        )
        out_bytes = ctx.quantized_output_bytes
        fc_grad = linear(saved, ctx, f"{prefix}.c_fc", flow, hidden, inter, ctx.qlora)
        if fc_grad:  # gelu_new's tanh formula: input, tanh, 0.5*x and 1+tanh
            saved.add(f"{prefix}.gelu", 4 * out_bytes * tokens * inter)
        before, copies = saved.activations, saved.weight_copies
        gelu_out = Flow(f"{prefix}.gelu.out", out_bytes, fc_grad)
        out_grad = linear(saved, ctx, f"{prefix}.mlp.c_proj", gelu_out, inter, hidden, ctx.qlora)
        if out_grad:
            saved.add(f"{prefix}.drop2", dropout_mask(ctx, tokens * hidden, out_bytes))
        saved.freed_first = saved.activations - before
        saved.freed_first_copies = saved.weight_copies - copies
        # c_proj's input gradient, then the two the last product of gelu_new makes from it
        saved.mlp_grads = 3 * out_bytes * tokens * inter if fc_grad else 0
        return Flow(f"{prefix}.mlp.out", out_bytes, out_grad)


def backward_moments(
    saved: Saved, ctx: StepContext, hidden: int, inter: int, input_key: str, recomputed: bool
) -> list[tuple[int, int]]:
    """(activations, temporaries) a decoder layer's backward adds to what the layers below it
    keep, at its highest moments. With ``recomputed`` (gradient checkpointing) its saved
    tensors are made again first, all but its input (``input_key``), which is the checkpoint;
    otherwise they are still saved from the forward and not counted here.

    - inside the MLP's backward, once the output projection's is done: the saved tensors less
      what that projection kept, the gradient from above and the MLP's input gradients;
    - checkpointing: where the recomputation stops (the projection's last saved tensor), with
      what the forward still holds and the gradients made before it;
    - QLoRA: the projection's own backward, its weight dequantized beside the gradient it makes.
    """
    tokens, s = ctx.tokens, saved
    again, copies = (
        (s.activations - s.items.get(input_key, 0), s.weight_copies) if recomputed else (0, 0)
    )
    incoming = ctx.residual_bytes * tokens * hidden
    after_first = again - s.freed_first + incoming
    moments = [(after_first + s.mlp_grads, copies - s.freed_first_copies)]
    if s.dropout_grads:
        moments.append((after_first + s.dropout_grads, copies - s.freed_first_copies))
    for extra in s.weight_grad_moments:  # LoRA on the experts' weights
        moments.append((again + incoming + extra, copies))
    if s.unsort_grads:  # before the MLP's own backward, all its saved tensors still there
        moments.append((again + incoming + s.unsort_grads, copies))
    if recomputed:
        moments.append((again + incoming + s.incoming + s.forward_held, copies))
        if s.forward_peak:
            moments.append(
                (s.forward_peak - s.items.get(input_key, 0) + incoming + s.incoming, copies)
            )
    if s.dequantized:
        moments.append(
            (
                again + incoming + s.incoming + ctx.compute_bytes * tokens * inter,
                copies + s.dequantized,
            )
        )
    return moments
