"""What one training step keeps for backward: saved activations, op by op, from the architecture.

Each decoder layer is walked in the order a Hugging Face transformers model runs it, and each
operator saves what autograd needs for the gradients of the inputs that require one (a linear
layer saves its input only when its weight is trained, and its weight only when its input needs a
gradient). Tensors shared by several operators are counted once (by key). The byte counts match
a measured PyTorch step on the shapes checked in tests/memory/test_accuracy.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models.spec import ModelSpec


@dataclass(frozen=True)
class Ctx:
    """The settings that decide what a layer saves (sizes in bytes per element)."""

    batch: int
    seq: int
    p: int  # dtype of the residual stream and of the non-quantized weights
    c: int  # compute dtype
    mixed: bool  # autocast on (fp32 weights, 16-bit matmuls)
    full: bool  # base weights trained (full fine-tuning)
    targets: frozenset  # LoRA target modules
    ad: int  # LoRA adapter dtype
    rank: int
    qlora: bool
    attention: str  # "sdpa", "flash" or "eager"
    dropout: float  # dropout probability of the model's own dropout layers (GPT-2)
    cpu: bool  # CPU kernels (dropout masks in the input's dtype, SDPA math path)
    lora_dropout: float = 0.0  # peft's dropout on each adapter's input
    bnb_saves_input: bool = False  # bitsandbytes before 0.43.2: a 4-bit layer keeps its input

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


class Saved:
    """A set of saved tensors, each counted once, with the weight copies tallied apart.

    A decoder layer's also says what its backward begins with (see ``backward_moments``):
    the gradients made beside the one arriving from above before the output projection's
    backward, what that backward frees (the projection's saved input and weight copy), the
    gradients alive inside the MLP's backward after it, the tensors the forward still holds
    when the projection saves its last tensor (and its highest moment before that), and the
    projection's weight when dequantized.
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
        self.dropout_grads = 0  # LoRA dropout on the output projection (see llama_layer)
        self.bnb_inputs: set[str] = set()  # inputs kept by 4-bit layers (bitsandbytes < 0.43.2)

    def add(self, key: str, nbytes: int) -> None:
        self.items.setdefault(key, nbytes)

    @property
    def activations(self) -> int:
        return sum(self.items.values())


def _linear(
    s: Saved,
    ctx: Ctx,
    name: str,
    x_key: str,
    x_bytes: int,
    x_grad: bool,
    n_in: int,
    n_out: int,
    quantized: bool,
    held: int = 0,
) -> bool:
    """Apply one (possibly LoRA-wrapped) linear layer; returns whether its output needs a grad.

    ``held``: bytes the forward holds at this point besides the saved tensors and the input.
    """
    t = ctx.tokens
    out_grad = x_grad
    if quantized:
        # the 4-bit forward dequantizes into a temporary; bitsandbytes before 0.43.2 also kept
        # the layer's input (cast to the compute dtype) when it needs a gradient
        if ctx.bnb_saves_input and x_grad:
            key = x_key if x_bytes == ctx.c else f"{name}.x4bit"
            s.add(key, ctx.c * t * n_in)
            s.bnb_inputs.add(key)
    else:
        w_grad = ctx.full
        cast = ctx.mixed and x_bytes != ctx.c
        if w_grad:
            s.add(f"{name}.x_cast" if cast else x_key, ctx.c * t * n_in)
            out_grad = True
        if ctx.mixed and ctx.p != ctx.c and (x_grad or w_grad):
            s.weight_copies += ctx.c * n_in * n_out
    if name.split(".")[-1] in ctx.targets:
        r = ctx.rank
        if ctx.mixed:
            s.add(f"{name}.lora_x", ctx.c * t * n_in)
            s.add(f"{name}.lora_a", ctx.c * t * r)
            if ctx.ad != ctx.c:
                s.weight_copies += ctx.c * r * (n_in + n_out)
        else:
            # with dropout, lora_A saves its own dropped-out copy of the input
            own = x_bytes != ctx.ad or ctx.lora_dropout > 0
            s.add(f"{name}.lora_x" if own else x_key, ctx.ad * t * n_in)
            s.add(f"{name}.lora_a", ctx.ad * t * r)
        if ctx.lora_dropout > 0 and x_grad:
            # the dropout's mask, kept when the input needs a gradient: bool on CUDA, in the
            # adapters' dtype on CPU (the input is cast to it first)
            s.add(f"{name}.lora_mask", (ctx.ad if ctx.cpu else 1) * t * n_in)
        # peft's forward at its peak: the input (where nothing saved it) and its copy in the
        # adapters' dtype (autocast saves a 16-bit copy of that), the base output, and LoRA's
        # output with its scaled copy
        x_held = x_bytes * t * n_in if x_key not in s.items else 0
        cast = 4 * t * n_in if ctx.mixed and x_bytes != ctx.ad else 0
        if not ctx.mixed and ctx.lora_dropout > 0 and x_bytes != ctx.ad:
            cast = ctx.ad * t * n_in  # the cast input, held beside its dropped-out copy
        lora_out = (ctx.c if ctx.mixed else ctx.ad) * t * n_out
        s.forward_peak = max(
            s.forward_peak, s.activations + held + x_held + cast + ctx.c * t * n_out + 2 * lora_out
        )
        out_grad = True
    return out_grad


def _rmsnorm(s: Saved, ctx: Ctx, name: str, x_key: str, x_grad: bool, h: int) -> bool:
    t = ctx.tokens
    if x_grad:
        s.add(x_key if ctx.p == 4 else f"{name}.x_fp32", 4 * t * h)
        s.add(f"{name}.rstd", 4 * t)
    if ctx.full:
        s.add(f"{name}.normed", ctx.p * t * h)
    return x_grad or ctx.full


def _attention_core(
    s: Saved, ctx: Ctx, spec: ModelSpec, name: str, qk_bytes: int, v_key: str, q_grad: bool
) -> None:
    """SDPA / eager attention on q, k (after rotary) and v (keys say what is shared)."""
    b, n, t, c = ctx.batch, ctx.seq, ctx.tokens, ctx.c
    q, kv, heads = spec.q_size, spec.kv_size, spec.n_heads
    if not q_grad:
        return
    if ctx.attention == "eager":
        rep = spec.n_heads // spec.n_kv_heads
        s.add(f"{name}.q", c * t * q)
        s.add(f"{name}.k", c * t * (q if rep > 1 else kv))
        s.add(f"{name}.probs32", 4 * b * heads * n * n)
        if qk_bytes != 4 or c != 4:
            s.add(f"{name}.probs", c * b * heads * n * n)
        s.add(f"{name}.v" if rep > 1 else v_key, c * t * (q if rep > 1 else kv))
        s.add(f"{name}.out", c * t * q)  # the contiguous copy o_proj reads
        return
    s.add(f"{name}.q", c * t * q)
    s.add(f"{name}.k", c * t * kv)
    s.add(v_key, c * t * kv)
    s.add(f"{name}.out", c * t * q)
    s.add(f"{name}.lse", 4 * b * heads * n)


def llama_layer(spec: ModelSpec, ctx: Ctx, i: int, x_grad: bool) -> Saved:
    """Saved tensors of one Llama-style decoder layer (Llama, Mistral, Qwen2, Gemma)."""
    s = Saved()
    t, h, inter, c, p = ctx.tokens, spec.hidden_size, spec.intermediate_size, ctx.c, ctx.p
    q, kv = spec.q_size, spec.kv_size
    x = f"L{i}.x"
    g1 = _rmsnorm(s, ctx, f"L{i}.n1", x, x_grad, h)
    n1 = f"L{i}.n1.out"

    def unsaved(key: str, nbytes: int) -> int:
        """What the forward's frames hold of a tensor nothing saved (so far)."""
        return 0 if key in s.items else nbytes

    qg = _linear(s, ctx, f"L{i}.q_proj", n1, p, g1, h, q, ctx.qlora)
    kg = _linear(s, ctx, f"L{i}.k_proj", n1, p, g1, h, kv, ctx.qlora)
    vg = _linear(s, ctx, f"L{i}.v_proj", n1, p, g1, h, kv, ctx.qlora)
    any_grad = qg or kg or vg
    if any_grad:  # rotary cos/sin are made once per forward and shared by every layer
        s.add("rope.cos", p * ctx.seq * spec.head_dim)
        s.add("rope.sin", p * ctx.seq * spec.head_dim)
    qk_bytes = max(c, p)  # q * cos promotes to the residual dtype
    _attention_core(s, ctx, spec, f"L{i}.attn", qk_bytes, f"L{i}.v_proj.out", any_grad)
    og = _linear(
        s,
        ctx,
        f"L{i}.o_proj",
        f"L{i}.attn.out",
        c,
        any_grad,
        q,
        h,
        ctx.qlora,
        held=unsaved(n1, p * t * h),
    )
    hg = x_grad or og
    mid = f"L{i}.mid"
    g2 = _rmsnorm(s, ctx, f"L{i}.n2", mid, hg, h)
    n2 = f"L{i}.n2.out"
    # bitsandbytes returns a 4-bit layer's output in its input's dtype: with autocast over
    # fp32 norms the MLP's intermediates are fp32
    m = p if ctx.qlora and ctx.mixed else c
    if spec.gated_mlp:
        gg = _linear(s, ctx, f"L{i}.gate_proj", n2, p, g2, h, inter, ctx.qlora)
        if gg:
            s.add(f"L{i}.gate", m * t * inter)  # the activation function's input
        ug = _linear(
            s, ctx, f"L{i}.up_proj", n2, p, g2, h, inter, ctx.qlora, held=m * t * inter
        )  # the activation function's output
        if ug:
            s.add(f"L{i}.act", m * t * inter)
        if gg:
            s.add(f"L{i}.up", m * t * inter)
        mg = gg or ug
    else:
        mg = _linear(s, ctx, f"L{i}.up_proj", n2, p, g2, h, inter, ctx.qlora)
        if mg:
            s.add(f"L{i}.up", m * t * inter)
    before, copies, peak = s.activations, s.weight_copies, s.forward_peak
    _linear(
        s,
        ctx,
        f"L{i}.down_proj",
        f"L{i}.act_out",
        m,
        mg,
        inter,
        h,
        ctx.qlora,
        held=unsaved(n2, p * t * h),
    )
    s.freed_first, s.freed_first_copies = s.activations - before, s.weight_copies - copies
    s.forward_peak = peak  # a recomputation stops before down_proj's LoRA output
    # down_proj's input gradient, then the two the gate's product makes from it
    s.mlp_grads = m * t * inter * (3 if spec.gated_mlp else 2) if mg else 0
    lora_out = "down_proj" in ctx.targets
    if lora_out and mg and ctx.lora_dropout > 0:
        # down_proj's input gradient in pieces: the base layer's, the adapter's (in its
        # dtype) and that times the dropout's mask, which is still held
        mask = (ctx.ad if ctx.cpu else 1) * t * inter
        s.dropout_grads = m * t * inter + 2 * ctx.ad * t * inter + mask
    # the residual's gradient cast to down_proj's dtype; LoRA's scaled branch gradient (with
    # 32-bit adapters outside autocast: scaled in 32 bits, and a 16-bit copy for the base)
    s.incoming = c * t * h if p != c else 0
    if lora_out:
        s.incoming += c * t * h + (ctx.ad * t * h if not ctx.mixed and ctx.ad != c else 0)
    # held by the forward's frames when down_proj saves its last tensor: the MLP's input and
    # product where nothing saved them; with LoRA there, the base output and peft's copy of
    # the input in the adapters' dtype (autocast then saves a 16-bit copy of that)
    s.forward_held = (p * t * h if n2 not in s.items else 0) + (
        m * t * inter if f"L{i}.act_out" not in s.items else 0
    )
    if lora_out:
        s.forward_held += c * t * h + (4 * t * inter if ctx.mixed and ctx.ad != c else 0)
        if not ctx.mixed and ctx.lora_dropout > 0 and ctx.ad != c:
            s.forward_held += ctx.ad * t * inter  # the cast input beside its dropped-out copy
    s.dequantized = c * inter * h if ctx.qlora else 0
    return s


def backward_moments(
    s: Saved, ctx: Ctx, h: int, inter: int, input_key: str, recomputed: bool
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
    t = ctx.tokens
    saved, copies = (
        (s.activations - s.items.get(input_key, 0), s.weight_copies) if recomputed else (0, 0)
    )
    incoming = ctx.p * t * h
    moments = [(saved - s.freed_first + incoming + s.mlp_grads, copies - s.freed_first_copies)]
    if s.dropout_grads:
        moments.append(
            (saved - s.freed_first + incoming + s.dropout_grads, copies - s.freed_first_copies)
        )
    if recomputed:
        moments.append((saved + incoming + s.incoming + s.forward_held, copies))
        if s.forward_peak:
            moments.append(
                (s.forward_peak - s.items.get(input_key, 0) + incoming + s.incoming, copies)
            )
    if s.dequantized:
        moments.append((saved + incoming + s.incoming + ctx.c * t * inter, copies + s.dequantized))
    return moments


def _layernorm(s: Saved, ctx: Ctx, name: str, x_key: str, x_grad: bool, h: int) -> bool:
    if x_grad or ctx.full:
        s.add(x_key, ctx.p * ctx.tokens * h)
        s.add(f"{name}.stats", 8 * ctx.tokens)  # mean and rstd in fp32
    return x_grad or ctx.full


def _dropout_mask(ctx: Ctx, elements: int, dtype_bytes: int) -> int:
    """A dropout mask: bool on CUDA; the CPU kernel keeps it in the input's dtype."""
    if ctx.dropout == 0:
        return 0
    return elements * (dtype_bytes if ctx.cpu else 1)


def gpt2_layer(spec: ModelSpec, ctx: Ctx, i: int, x_grad: bool) -> Saved:
    """Saved tensors of one GPT-2 block (LayerNorm, Conv1D, GELU, dropout)."""
    s = Saved()
    b, n, t = ctx.batch, ctx.seq, ctx.tokens
    h, inter, c, p = spec.hidden_size, spec.intermediate_size, ctx.c, ctx.p
    heads = spec.n_heads
    # bitsandbytes returns a 4-bit layer's output in its input's dtype (fp32 under autocast)
    lo = p if ctx.qlora and ctx.mixed else c
    g1 = _layernorm(s, ctx, f"L{i}.ln1", f"L{i}.x", x_grad, h)
    ag = _linear(s, ctx, f"L{i}.c_attn", f"L{i}.ln1.out", p, g1, h, 3 * h, ctx.qlora)
    if ag:
        if ctx.dropout and ctx.cpu:
            # CPU SDPA with dropout takes the math path, in fp32: q*scale, k and v, then the
            # softmax, the dropout mask and the dropped probabilities
            s.add(f"L{i}.attn.qkv32", 3 * 4 * t * h)
            s.add(f"L{i}.attn.probs", 3 * 4 * b * heads * n * n)
        elif ctx.attention == "eager":
            s.add(f"L{i}.c_attn.out", lo * t * 3 * h)
            s.add(f"L{i}.attn.probs32", 4 * b * heads * n * n)
            if lo != 4:
                s.add(f"L{i}.attn.probs", lo * b * heads * n * n)
            s.add(f"L{i}.attn.mask", _dropout_mask(ctx, b * heads * n * n, lo))
            if ctx.dropout:
                s.add(f"L{i}.attn.dropped", lo * b * heads * n * n)
        else:
            s.add(f"L{i}.c_attn.out", lo * t * 3 * h)
            s.add(f"L{i}.attn.out", lo * t * h)
            s.add(f"L{i}.attn.lse", 4 * b * heads * n)
    og = _linear(s, ctx, f"L{i}.c_proj", f"L{i}.attn.merged", lo, ag, h, h, ctx.qlora)
    if og:
        s.add(f"L{i}.drop1", _dropout_mask(ctx, t * h, lo))
    g2 = _layernorm(s, ctx, f"L{i}.ln2", f"L{i}.mid", x_grad or og, h)
    fg = _linear(s, ctx, f"L{i}.c_fc", f"L{i}.ln2.out", p, g2, h, inter, ctx.qlora)
    if fg:  # gelu_new's tanh formula: input, tanh, 0.5*x and 1+tanh
        s.add(f"L{i}.gelu", 4 * lo * t * inter)
    before, copies = s.activations, s.weight_copies
    pg = _linear(s, ctx, f"L{i}.mlp.c_proj", f"L{i}.gelu.out", lo, fg, inter, h, ctx.qlora)
    if pg:
        s.add(f"L{i}.drop2", _dropout_mask(ctx, t * h, lo))
    s.freed_first, s.freed_first_copies = s.activations - before, s.weight_copies - copies
    # c_proj's input gradient, then the two the last product of gelu_new makes from it
    s.mlp_grads = 3 * lo * t * inter if fg else 0
    return s
