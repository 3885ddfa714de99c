"""What a compiled training step saves for backward: AOTAutograd's partitioner, traced.

``torch.compile`` (inductor, its default backend) traces each compiled region's forward and
backward into one joint graph and splits it with
``torch._functorch.partitioners.min_cut_rematerialization_partition``: the forward keeps
fewer, and other, tensors than eager autograd does, and the backward recomputes the cheap rest.
``memory/compiled_trace.py`` traces one decoder layer of a transformers model that way under
FakeTensorMode (nothing is allocated) and reads the tensors the forward graph hands to the
backward graph: the saved tensors. Their bytes, per token, are stored by family in
``lessonkit/data/compiled_saves.json`` (written by ``tools/compiled_saves.py``), where
estimate(compile=True) reads them here as plain numbers (no torch).

Each saved tensor's size per token is one of the layer's widths (hidden, the query width
n_heads x head_dim, intermediate, the key/value width, the number of heads or of key/value heads,
the LoRA rank, or 1), or phi3's fused q/k/v or gate/up width; the data gives the bytes per token
per unit of each width, so one trace on a shape where the widths differ gives every size.

In bf16-mixed the layer is traced under bf16 autocast over fp32 weights; the bf16 copies of its
weights that it saves are left out of the data, as the estimate counts them as eager mode's
weight copies. With gradient checkpointing the checkpoint wraps each compiled layer, as
torchtune wraps each layer and then compiles the layer inside: the forward keeps each layer's
input and a layer's backward runs its compiled forward again, which saves what the data says.

A compiled layer's backward graph frees each saved tensor after its last use (inductor's
generated code clears its boxed arguments and deletes each input once dead), so the data's
backward moments hold the saved tensors still to be used beside what the graph makes; the
optimizer step in backward and activation offloading act around the compiled layers as in
eager mode. Under ZeRO-3 (FSDP2) each layer's compiled graphs run on its gathered weights,
so they save what they save on one GPU; FSDP's mixed precision gathers the weights in bf16
and runs without autocast, so its layers are the pure bf16 traces.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from ..errors import LessonkitError
from ..models.spec import ModelSpec

COMPILED_FAMILIES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "phi3",
    "olmo2",
    "smollm3",
    "granite",
)
COMPILED_METHODS = ("full", "lora")
COMPILED_PRECISIONS = ("bf16", "bf16-mixed")
# why the other families are refused
NOT_TRACED = {
    "gemma2": "its attention soft-caps the scores, so it runs as eager attention and the "
    "compiled layer saves the [heads, seq, seq] scores and softmax, which grow with the "
    "sequence: not bytes per token, which the data holds",
    "gemma3_text": "its sliding-window and global layers take their own rotary tables and "
    "masks: not traced",
    "qwen3_moe": "the routed experts' tensors depend on the routing: not traced",
    "mixtral": "the routed experts' tensors depend on the routing: not traced",
    "gpt_oss": "the routed experts' tensors depend on the routing: not traced",
    "gpt2": "its layer takes no rotary tables (learned positions): not traced",
    "traced": "a traced model's layers are not traced compiled",
}
WIDTHS = ("hidden", "q", "intermediate", "kv", "heads", "kv_heads", "rank", "one")
# phi3's fused projections: q/k/v in one (q + 2 kv wide) and gate/up in one (2 intermediate)
FUSED_WIDTHS = {"qkv": {"q": 1, "kv": 2}, "gate_up": {"intermediate": 2}}


def widths(spec: ModelSpec, lora_rank: int) -> dict[str, int]:
    """The per-token widths a decoder layer's tensors come in."""
    return {
        "hidden": spec.hidden_size,
        "q": spec.q_size,
        "intermediate": spec.intermediate_size,
        "kv": spec.kv_size,
        "heads": spec.n_heads,
        "kv_heads": spec.n_kv_heads,
        "rank": lora_rank,
        "one": 1,
    }


def check_compiled(
    spec: ModelSpec, method: str, precision: str, checkpointing: bool, seq_len: int = 0
) -> None:
    """Raise a LessonkitError for a compiled run that is not modelled."""
    window = spec.extra.get("sliding_window")
    if isinstance(window, int) and 0 < window < seq_len:
        raise LessonkitError(
            f"compile=True is modelled for sequences up to {spec.name}'s sliding window "
            f"({window} tokens), not seq_len={seq_len}: beyond it the layers take a mask, "
            f"which the traced layers do not; use compile=False or seq_len <= {window}."
        )
    if spec.family not in COMPILED_FAMILIES:
        raise LessonkitError(
            f"compile=True is modelled for the {', '.join(COMPILED_FAMILIES)} families, "
            f"not {spec.family} ({NOT_TRACED.get(spec.family, 'not traced')}): use "
            f"compile=False for {spec.name}."
        )
    if method not in COMPILED_METHODS:
        raise LessonkitError(
            f"compile=True is modelled for method {' and '.join(map(repr, COMPILED_METHODS))}, "
            f"not {method!r} (bitsandbytes' 4-bit layers are not traced): use compile=False."
        )
    if precision not in COMPILED_PRECISIONS:
        raise LessonkitError(
            f"compile=True is modelled for precision 'bf16' (as torchtune's compiled recipes "
            f"run) and 'bf16-mixed', not {precision!r}: use compile=False."
        )


@cache
def _data() -> dict[str, Any]:
    text = resources.files("lessonkit").joinpath("data/compiled_saves.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def data_key(family: str, method: str, precision: str, input_grad: bool) -> str:
    """The data file's key of one traced case."""
    return f"{family}/{method}/{precision}/{'input-grad' if input_grad else 'no-input-grad'}"


def compiled_layer_bytes(
    spec: ModelSpec,
    method: str,
    precision: str,
    lora_rank: int,
    tokens: int,
    input_grad: bool,
    less_input: bool = False,
) -> int:
    """Bytes one compiled decoder layer saves for backward (from the data file); with
    ``less_input``, less the layer's input when it is among them."""
    per_width = _data()["layers"][data_key(spec.family, method, precision, input_grad)]
    sizes = widths(spec, lora_rank)
    saved = sum(int(per_width[name]) * sizes[name] for name in WIDTHS)
    return tokens * (saved - (int(per_width["input"]) * spec.hidden_size if less_input else 0))


def _sizes(spec: ModelSpec, lora_rank: int) -> dict[str, int]:
    sizes = widths(spec, lora_rank)
    for name, parts in FUSED_WIDTHS.items():
        sizes[name] = sum(count * sizes[width] for width, count in parts.items())
    return sizes


@dataclass(frozen=True)
class BackwardMoment:
    """What a compiled layer's backward graph holds beside its incoming gradient at one of its
    highest moments: per-token tensors (its saved tensors not yet freed, the layer's input
    among them as ``layer_input``, and those of its gradient math) and weight-shaped ones
    (the gradients of its weights as they are made)."""

    per_token: int
    weights: int
    layer_input: int


def compiled_backward_moments(
    spec: ModelSpec, method: str, precision: str, lora_rank: int, tokens: int, input_grad: bool
) -> list[BackwardMoment]:
    """A compiled layer's backward graph at each of its highest moments (from the data file),
    each saved tensor freed after its last use as inductor's generated code frees it."""
    key = data_key(spec.family, method, precision, input_grad)
    sizes = _sizes(spec, lora_rank)
    out = []
    for moment in _data()["backward"][key]:
        per_token = weights = 0
        for unit, count in moment.items():
            if unit == "input":
                continue  # a part of "hidden"
            if " x " in unit:
                first, second = unit.split(" x ")
                weights += int(count) * sizes[first] * sizes[second]
            else:
                per_token += int(count) * tokens * sizes[unit]
        layer_input = int(moment.get("input", 0)) * tokens * spec.hidden_size
        out.append(BackwardMoment(per_token, weights, layer_input))
    return out


@dataclass(frozen=True)
class CompiledLoss:
    """Bytes of a compiled chunked cross-entropy: what its chunks keep for backward, and the
    logit gradient one chunk's backward makes."""

    kept: int
    gradient: int


def compiled_cross_entropy_bytes(
    tokens: int, vocab: int, logit_bytes: int, largest_chunk: int
) -> CompiledLoss:
    """torchtune's compiled cross-entropy over every chunk of ``tokens`` (from the data file):
    each chunk keeps its logits (``logit_bytes`` each) and a few fp32 numbers per token; the
    backward of the largest chunk (``largest_chunk`` logits) makes its gradient."""
    loss = _data()["cross_entropy"]
    kept = int(loss["keeps_logits"]) * logit_bytes * tokens * vocab
    kept += int(loss["saved_bytes_per_token"]) * tokens
    return CompiledLoss(kept, int(loss["gradient_bytes_per_logit"]) * largest_chunk)


def traced_precision(s: Any) -> str:
    """The precision whose traced layers a run's compiled layers are: under FSDP's mixed
    precision (``sharded_mixed``) each layer is gathered in bf16 and runs without autocast,
    as a pure bf16 layer does."""
    return "bf16" if s.sharded_mixed else str(s.precision)


def apply_compiled(step: Any) -> None:
    """Replace an estimate's decoder-layer activations (``estimating._Step``) by what the
    compiled layers save, from the data file; nothing else of the step changes. With gradient
    checkpointing each layer keeps its input as in eager mode, and its backward first runs
    the compiled forward again: what that saves replaces the eager layer's recomputed tensors
    (``activations.backward_moments``)."""
    spec, s, ctx = step.spec, step.settings, step.ctx
    full = s.method == "full"
    args = spec, s.method, traced_precision(s), s.lora_rank, ctx.tokens
    if s.gradient_checkpointing:  # every layer's input requires grad (as eager's first_grad)
        again = compiled_layer_bytes(*args, True, less_input=True)
        step.first_layer = _recomputed(step.first_layer, "L0.x", again)
        step.other_layer = _recomputed(step.other_layer, "L1.x", again)
        step.saved_layers = [step.first_layer] + [step.other_layer] * (spec.n_layers - 1)
        return
    layer = compiled_layer_bytes(*args, True)
    first = compiled_layer_bytes(*args, full)
    step.layer_saved, step.first_saved = layer, first
    step.layers_saved = [first] + [layer] * (spec.n_layers - 1)
    step.fw_layers = first + (spec.n_layers - 1) * layer + step.rope


def compiled_inside_layer(step: Any, layer: Any, first: bool) -> list[tuple[int, int]]:
    """(activations, temporaries) a compiled layer's backward adds to what the layers below it
    keep, at its highest moments (``estimating._Step._inside_layer``): the gradient coming in
    and what the backward graph holds (the weights' gradients as they are made among the
    temporaries), less what is counted below already: without checkpointing the tensors the
    layer saved in the forward, which the graph frees one by one; with it, the layer's input,
    which the checkpoint holds until the layer is done. With checkpointing in bf16-mixed the
    compiled forward run again casts the layer's weights to bf16 once more, and its backward
    holds those copies."""
    spec, s, ctx = step.spec, step.settings, step.ctx
    ckpt = s.gradient_checkpointing
    input_grad = ckpt or not first or s.method == "full"  # checkpointing: every layer's input
    incoming = ctx.residual_bytes * ctx.tokens * spec.hidden_size
    args = spec, s.method, traced_precision(s), s.lora_rank, ctx.tokens, input_grad
    saved = compiled_layer_bytes(*args)
    copies = layer.weight_copies if ckpt else 0
    return [
        (
            incoming + moment.per_token - (moment.layer_input if ckpt else saved),
            moment.weights + copies,
        )
        for moment in compiled_backward_moments(*args)
    ]


def _recomputed(eager: Any, input_key: str, again: int) -> Any:
    """An eager layer's ``activations.Saved`` whose recomputation saves ``again`` bytes beside
    its checkpointed input (key ``input_key``), as the compiled forward does."""
    out = copy.copy(eager)
    out.items = {input_key: eager.items.get(input_key, 0), "compiled": again}
    return out


COMPILED_NOTE = (
    "compile=True: each decoder layer is compiled (AOTAutograd with inductor's partitioner, "
    "min_cut_rematerialization_partition): it saves for backward what the partitioner keeps, "
    "traced with torch {torch} ({source}), fewer tensors than eager mode since its backward "
    "recomputes the cheap rest; the embeddings, the head and the standard loss as in eager "
    "mode."
)


def compiled_note(chunked_loss: bool = False) -> str:
    """The assumption an estimate with compile=True states."""
    data = _data()
    note = COMPILED_NOTE.format(
        torch=data["torch_version"], source="lessonkit/data/compiled_saves.json"
    )
    if chunked_loss:
        note += CHUNKED_NOTE
    return note


CHUNKED_NOTE = (
    " With the chunked loss, each chunk's cross-entropy is compiled too, as torchtune's "
    "compile_loss compiles CEWithChunkedOutputLoss.compute_cross_entropy: inductor fuses the "
    "fp32 upcast into its kernels, so a chunk keeps only its bf16 logits and two fp32 numbers "
    "per token for backward, and its backward makes the chunk's bf16 logit gradient."
)
