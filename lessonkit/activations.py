"""What one training step keeps for backward: saved activations, op by op, from the architecture.

Each decoder layer is walked in the order a Hugging Face transformers model runs it, and each
operator saves what autograd needs for the gradients of the inputs that require one (a linear
layer saves its input only when its weight is trained, and its weight only when its input needs a
gradient). Tensors shared by several operators are counted once (by key). The byte counts match
a measured PyTorch step on the shapes checked in tests/test_accuracy.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from .models import ModelSpec


@dataclass(frozen=True)
class Ctx:
    """The settings that decide what a layer saves (sizes in bytes per element)."""

    batch: int
    seq: int
    p: int               # dtype of the residual stream and of the non-quantized weights
    c: int               # compute dtype
    mixed: bool          # autocast on (fp32 weights, 16-bit matmuls)
    full: bool           # base weights trained (full fine-tuning)
    targets: frozenset   # LoRA target modules
    ad: int              # LoRA adapter dtype
    rank: int
    qlora: bool
    attention: str       # "sdpa", "flash" or "eager"
    dropout: float       # dropout probability of the model's own dropout layers (GPT-2)
    cpu: bool            # CPU kernels (dropout masks in the input's dtype, SDPA math path)

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


class Saved:
    """A set of saved tensors, each counted once, with the weight copies tallied apart."""

    def __init__(self) -> None:
        self.items: dict[str, int] = {}
        self.weight_copies = 0

    def add(self, key: str, nbytes: int) -> None:
        self.items.setdefault(key, nbytes)

    @property
    def activations(self) -> int:
        return sum(self.items.values())


def _linear(s: Saved, ctx: Ctx, name: str, x_key: str, x_bytes: int, x_grad: bool,
            n_in: int, n_out: int, quantized: bool) -> bool:
    """Apply one (possibly LoRA-wrapped) linear layer; returns whether its output needs a grad."""
    t = ctx.tokens
    out_grad = x_grad
    if quantized:
        pass  # the 4-bit forward dequantizes into a temporary and saves nothing
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
            s.add(f"{name}.lora_x" if x_bytes != ctx.ad else x_key, ctx.ad * t * n_in)
            s.add(f"{name}.lora_a", ctx.ad * t * r)
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


def _attention_core(s: Saved, ctx: Ctx, spec: ModelSpec, name: str, qk_bytes: int,
                    v_key: str, q_grad: bool) -> None:
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
        if qk_bytes != 4:
            s.add(f"{name}.probs", c * b * heads * n * n)
        elif c != 4:
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
    qg = _linear(s, ctx, f"L{i}.q_proj", n1, p, g1, h, q, ctx.qlora)
    kg = _linear(s, ctx, f"L{i}.k_proj", n1, p, g1, h, kv, ctx.qlora)
    vg = _linear(s, ctx, f"L{i}.v_proj", n1, p, g1, h, kv, ctx.qlora)
    any_grad = qg or kg or vg
    if any_grad:  # rotary cos/sin are made once per forward and shared by every layer
        s.add("rope.cos", p * ctx.seq * spec.head_dim)
        s.add("rope.sin", p * ctx.seq * spec.head_dim)
    qk_bytes = max(c, p)  # q * cos promotes to the residual dtype
    _attention_core(s, ctx, spec, f"L{i}.attn", qk_bytes, f"L{i}.v_proj.out", any_grad)
    og = _linear(s, ctx, f"L{i}.o_proj", f"L{i}.attn.out", c, any_grad, q, h, ctx.qlora)
    hg = x_grad or og
    mid = f"L{i}.mid"
    g2 = _rmsnorm(s, ctx, f"L{i}.n2", mid, hg, h)
    n2 = f"L{i}.n2.out"
    if spec.gated_mlp:
        gg = _linear(s, ctx, f"L{i}.gate_proj", n2, p, g2, h, inter, ctx.qlora)
        ug = _linear(s, ctx, f"L{i}.up_proj", n2, p, g2, h, inter, ctx.qlora)
        if gg:
            s.add(f"L{i}.gate", c * t * inter)  # the activation function's input
        if ug:
            s.add(f"L{i}.act", c * t * inter)
        if gg:
            s.add(f"L{i}.up", c * t * inter)
        mg = gg or ug
    else:
        mg = _linear(s, ctx, f"L{i}.up_proj", n2, p, g2, h, inter, ctx.qlora)
        if mg:
            s.add(f"L{i}.up", c * t * inter)
    _linear(s, ctx, f"L{i}.down_proj", f"L{i}.act_out", c, mg, inter, h, ctx.qlora)
    return s


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
    # a 4-bit layer's 16-bit output plus its bias (kept in the weights' dtype) promotes
    lo = max(c, p) if ctx.qlora else c
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
    pg = _linear(s, ctx, f"L{i}.mlp.c_proj", f"L{i}.gelu.out", lo, fg, inter, h, ctx.qlora)
    if pg:
        s.add(f"L{i}.drop2", _dropout_mask(ctx, t * h, lo))
    return s
