"""A decoder layer composed of the blocks of memory/activations.py, family by family, and the
blocks outside the layers (embeddings, head).

A layer is residual branches (``Branch``): a norm before the sublayer where the family has one,
the sublayer (attention or MLP), a norm after it where the family has one, and the residual
addition. ``decoder_layer(spec)`` gives the layer of a spec's family.
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
    "gemma3_text": DecoderLayer(
        (
            Branch(
                "x",
                RMSNorm("input_layernorm", "n1", float_output=True),
                Attention(qk_norm="head", float_norm=True, sliding=True),
                RMSNorm("post_attention_layernorm", "n1post", float_output=True),
            ),
            Branch(
                "mid",
                RMSNorm("pre_feedforward_layernorm", "n2", float_output=True),
                DenseMLP(),
                RMSNorm("post_feedforward_layernorm", "n2post", float_output=True),
            ),
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


def decoder_layer(spec: ModelSpec) -> DecoderLayer:
    """The blocks of one decoder layer of ``spec``'s family."""
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
        return kept + (residual * tokens * hidden if checkpointing and not ctx.trains_base else 0)


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
