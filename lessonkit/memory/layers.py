"""A decoder layer composed of the blocks of memory/activations.py, family by family, and the
blocks outside the layers (embeddings, head).

A layer is residual branches (``Branch``): a norm before the sublayer where the family has one,
the sublayer (attention or MLP), a norm after it where the family has one, and the residual
addition. ``decoder_layer(spec)`` gives the layer of a spec's family; ``decoder_layers(spec)``
each layer's, of its own attention type (``spec.layer_types``: Gemma 3's sliding-window and
full-attention layers save differently), and ``saved_by_layer`` what each saves.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models.spec import ModelSpec, ParamTensor
from .activations import (
    GPT2MLP,
    Attention,
    Block,
    DenseMLP,
    Flow,
    GPT2Attention,
    LayerNorm,
    RMSNorm,
    Saved,
    StepContext,
    dropout_mask,
    layernorm,
    linear,
    rmsnorm,
)
from .attention_sinks import SinkAttention
from .experts import BiasedMoEMLP, MoEMLP


# ----- the decoder layer ---------------------------------------------------------------------
@dataclass(frozen=True)
class Branch:
    """One residual branch: ``x + post_norm(sublayer(pre_norm(x)))``; the residual's key
    within a layer is ``residual`` ("x" for the layer's input)."""

    residual: str
    pre_norm: Block | None
    sublayer: Block
    post_norm: Block | None = None


@dataclass(frozen=True)
class DecoderLayer:
    """A decoder layer: its residual branches, in the order the forward runs them."""

    branches: tuple[Branch, ...]

    def blocks(self) -> tuple[Block, ...]:
        return tuple(
            block
            for b in self.branches
            for block in (b.pre_norm, b.sublayer, b.post_norm)
            if block is not None
        )

    def parameters(self, spec: ModelSpec) -> tuple[ParamTensor, ...]:
        return tuple(t for block in self.blocks() for t in block.parameters(spec))

    def saved(self, spec: ModelSpec, ctx: StepContext, layer: int, input_grad: bool) -> Saved:
        """What decoder layer number ``layer`` saves for backward."""
        saved = Saved()
        grad = input_grad
        for branch in self.branches:
            residual = Flow(f"L{layer}.{branch.residual}", ctx.residual_bytes, grad)
            normed = residual
            if branch.pre_norm is not None:
                normed = branch.pre_norm.forward(saved, ctx, spec, layer, residual)
            out = branch.sublayer.forward(saved, ctx, spec, layer, normed)
            if branch.post_norm is not None:
                out = branch.post_norm.forward(saved, ctx, spec, layer, out)
            grad = grad or out.needs_grad  # the residual addition
        return saved


LLAMA_LAYER = DecoderLayer(
    (
        Branch("x", RMSNorm("input_layernorm", "n1"), Attention()),
        Branch("mid", RMSNorm("post_attention_layernorm", "n2"), DenseMLP(gated=True)),
    )
)
GPT2_LAYER = DecoderLayer(
    (
        Branch("x", LayerNorm("ln_1", "ln1"), GPT2Attention()),
        Branch("mid", LayerNorm("ln_2", "ln2"), GPT2MLP()),
    )
)


_LAYERS = {
    "qwen3": DecoderLayer(
        (
            Branch("x", RMSNorm("input_layernorm", "n1"), Attention(qk_norm="head")),
            LLAMA_LAYER.branches[1],
        )
    ),
    "phi3": DecoderLayer(
        (
            Branch("x", RMSNorm("input_layernorm", "n1"), Attention(fused=True)),
            Branch("mid", RMSNorm("post_attention_layernorm", "n2"), DenseMLP(fused=True)),
        )
    ),
    "olmo2": DecoderLayer(
        (
            Branch(
                "x",
                None,
                Attention(qk_norm="projection"),
                RMSNorm("post_attention_layernorm", "n1"),
            ),
            Branch("mid", None, DenseMLP(), RMSNorm("post_feedforward_layernorm", "n2")),
        )
    ),
}


GPT_OSS_LAYER = DecoderLayer(
    (
        Branch(
            "x",
            RMSNorm("input_layernorm", "n1", float_output=True, float_scale=False),
            SinkAttention(),
        ),
        Branch(
            "mid",
            RMSNorm("post_attention_layernorm", "n2", float_output=True, float_scale=False),
            BiasedMoEMLP(),
        ),
    )
)


def _gemma3_layer(layer_type: str) -> DecoderLayer:
    """Gemma 3's layer: a sliding-window layer keeps its SDPA mask (beyond the window), and
    each type of layer has rotary tables of its own."""
    return DecoderLayer(
        (
            Branch(
                "x",
                RMSNorm("input_layernorm", "n1", float_output=True),
                Attention(
                    qk_norm="head",
                    float_norm=True,
                    sliding=layer_type == "sliding_attention",
                    rope_table=layer_type,
                ),
                RMSNorm("post_attention_layernorm", "n1post", float_output=True),
            ),
            Branch(
                "mid",
                RMSNorm("pre_feedforward_layernorm", "n2", float_output=True),
                DenseMLP(),
                RMSNorm("post_feedforward_layernorm", "n2post", float_output=True),
            ),
        )
    )


_GEMMA3_LAYERS = {kind: _gemma3_layer(kind) for kind in ("sliding_attention", "full_attention")}


def decoder_layers(spec: ModelSpec) -> tuple[DecoderLayer, ...]:
    """The blocks of each decoder layer of ``spec``, in order: the family's layer, of each
    layer's own attention type (``spec.layer_types``) where that changes what it saves
    (Gemma 3). gpt-oss's sliding-window and full layers save the same (eager attention)."""
    if spec.family == "gemma3_text":
        return tuple(_GEMMA3_LAYERS[kind] for kind in spec.layer_types)
    return (decoder_layer(spec),) * spec.n_layers


def saved_by_layer(
    spec: ModelSpec, ctx: StepContext, first_grad: bool
) -> tuple[list[Saved], Saved, Saved]:
    """What each decoder layer after the first saves (one walk per kind of layer, keyed as
    layer 1), the last layer's (the first the backward reaches) and the first layer's (its
    input needs a gradient only where ``first_grad``)."""
    each = decoder_layers(spec)
    # the layers of one kind are one object: keyed by identity (a layer's hash walks its blocks)
    walked: dict[int, Saved] = {}
    for layer in each[1:] or each[:1]:
        if id(layer) not in walked:
            walked[id(layer)] = layer.saved(spec, ctx, 1, True)
    rest = [walked[id(layer)] for layer in each[1:]]
    return rest, walked[id(each[-1])], each[0].saved(spec, ctx, 0, first_grad)


def without_rope(saved: list[Saved]) -> tuple[list[int], int]:
    """Each layer's saved bytes less the rotary tables, and the tables' bytes: each table
    (one per kind of layer where the family has several) counted once for all layers."""
    tables: dict[str, int] = {}
    each = []
    done: dict[int, int] = {}  # the layers of one kind share one Saved: read it once
    for layer in saved:
        if id(layer) not in done:
            own = {key: nbytes for key, nbytes in layer.items.items() if key.startswith("rope.")}
            tables.update(own)
            done[id(layer)] = layer.activations - sum(own.values())
        each.append(done[id(layer)])
    return each, sum(tables.values())


def layers_saved_ends(saved: list[Saved]) -> list[int]:
    """How many layers the backward has done (k) at the first and the last layer of each run
    of layers that save the same: where the highest moment of a run lies, as activations
    are freed and gradients made at a steady rate within it."""
    n = len(saved)
    kinds = [layer.items if index else None for index, layer in enumerate(saved)]
    ends = {0, n - 1}
    for index in range(1, n - 1):
        if kinds[index] != kinds[index - 1] or kinds[index] != kinds[index + 1]:
            ends.add(index)
    return sorted(n - 1 - index for index in ends)


def checkpointed_masks(spec: ModelSpec, ctx: StepContext) -> int:
    """The attention masks gradient checkpointing keeps among each layer's inputs until the
    backward is done: gpt-oss's eager masks, one [batch, 1, seq, seq] mask in the residual
    dtype per type of layer (sliding-window, full), shared by the layers (measured)."""
    if spec.family != "gpt_oss":
        return 0
    return len(set(spec.layer_types)) * ctx.residual_bytes * ctx.batch_size * ctx.seq_len**2


def decoder_layer(spec: ModelSpec, index: int = 0) -> DecoderLayer:
    """The blocks of decoder layer number ``index`` of ``spec``'s family."""
    if spec.family == "gemma3_text":
        return _GEMMA3_LAYERS[spec.layer_types[index]]
    if spec.family == "gpt_oss":
        return GPT_OSS_LAYER
    if spec.family in ("qwen3_moe", "mixtral"):
        mixtral = spec.family == "mixtral"
        experts = MoEMLP(
            normalize_top_k=mixtral or bool(spec.extra.get("norm_topk_prob")),
            float_weights=mixtral,
        )
        qk = "head" if spec.family == "qwen3_moe" else "none"
        return DecoderLayer(
            (
                Branch("x", RMSNorm("input_layernorm", "n1"), Attention(qk_norm=qk)),
                Branch("mid", RMSNorm("post_attention_layernorm", "n2"), experts),
            )
        )
    if spec.family == "gpt2":
        return GPT2_LAYER
    if spec.family in _LAYERS:
        return _LAYERS[spec.family]
    if not spec.gated_mlp:
        return DecoderLayer(
            (
                LLAMA_LAYER.branches[0],
                Branch("mid", LLAMA_LAYER.branches[1].pre_norm, DenseMLP(False)),
            )
        )
    return LLAMA_LAYER


# ----- outside the decoder layers ------------------------------------------------------------
@dataclass(frozen=True)
class Embeddings:
    """The token embeddings (and GPT-2's learned positions): what they keep to the end."""

    def parameters(self, spec: ModelSpec) -> tuple[ParamTensor, ...]:
        return tuple(t for t in spec.parameter_tensors().outer if t.kind == "embed")

    def saved_bytes(self, spec: ModelSpec, ctx: StepContext, checkpointing: bool) -> int:
        """GPT-2's embeddings keep their dropout's mask and the position ids, and with LoRA and
        checkpointing the token embeddings made to require grad (a leaf)."""
        if spec.family != "gpt2":
            return 0
        tokens, hidden, residual = ctx.tokens, spec.hidden_size, ctx.residual_bytes
        kept = dropout_mask(ctx, tokens * hidden, residual) + 8 * ctx.seq_len
        return kept + self.leaf_bytes(spec, ctx, checkpointing)

    def leaf_bytes(self, spec: ModelSpec, ctx: StepContext, checkpointing: bool) -> int:
        """GPT-2's token embeddings made to require grad (LoRA with checkpointing): a leaf that
        nothing saves, kept by its gradient's accumulator."""
        if spec.family != "gpt2" or not checkpointing or ctx.trains_base:
            return 0
        return ctx.residual_bytes * ctx.tokens * spec.hidden_size


@dataclass(frozen=True)
class Head:
    """The final norm and lm_head (the logits and the loss are the step's)."""

    def parameters(self, spec: ModelSpec) -> tuple[ParamTensor, ...]:
        return tuple(t for t in spec.parameter_tensors().outer if t.kind in ("norm", "head"))

    def saved(self, spec: ModelSpec, ctx: StepContext) -> Saved:
        saved, hidden = Saved(), spec.hidden_size
        norm = layernorm if spec.family == "gpt2" else rmsnorm
        norm(saved, ctx, "final", "final.x", True, hidden)
        final = Flow("final.out", ctx.residual_bytes, True)
        linear(saved, ctx, "lm_head", final, hidden, spec.vocab_size, False)
        return saved
