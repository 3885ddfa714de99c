"""Tracing what a compiled decoder layer saves: AOTAutograd with inductor's partitioner.

See memory/compiled.py for what is traced and why. Needs torch: imported by measure(compile=True)
(which runs its layers through ``compiled_layer``) and by tools/compiled_saves.py.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ..errors import LessonkitError
from ..models.spec import ModelSpec
from .compiled import WIDTHS, widths


@dataclass
class SavedTensor:
    """One tensor the forward graph keeps for backward (its storage's root, de-aliased)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    is_input: bool = False  # the layer's hidden-state input itself


def _is_view(node: Any) -> bool:
    target = getattr(node, "target", None)
    schema = getattr(target, "_schema", None)
    if node.op != "call_function" or schema is None or not schema.returns:
        return False
    alias = schema.returns[0].alias_info
    return alias is not None and not alias.is_write


def _root(node: Any) -> Any:
    while _is_view(node):
        node = node.args[0]
    return node


def _weight_copy(node: Any, placeholders: list[Any], counted_inputs: set[int]) -> bool:
    """Whether ``node`` is a cast of a parameter (an input not in ``counted_inputs``)."""
    source = node.args[0] if node.op == "call_function" and node.args else None
    return (
        "_to_copy" in str(node.target)
        and getattr(source, "op", None) == "placeholder"
        and placeholders.index(source) not in counted_inputs
    )


def saved_tensors(fw_module: Any, bw_module: Any, counted_inputs: set[int]) -> list[SavedTensor]:
    """The storages the backward graph receives from the forward graph, de-aliased: views are
    followed to their root; inputs count only when their index is in ``counted_inputs`` (the
    layer's hidden-state input, not its weights or the shared rotary tables)."""
    bw_saved = [
        n for n in bw_module.graph.nodes if n.op == "placeholder" and "tangents" not in n.name
    ]
    output = next(n for n in fw_module.graph.nodes if n.op == "output")
    outputs = list(output.args[0])
    fw_saved = outputs[len(outputs) - len(bw_saved) :]
    placeholders = [n for n in fw_module.graph.nodes if n.op == "placeholder"]
    roots: dict[str, SavedTensor] = {}
    for node in fw_saved:
        root = _root(node)
        value = root.meta.get("val")
        if value is None or not hasattr(value, "numel"):
            continue  # a symbolic size, not a tensor
        if root.op == "placeholder" and placeholders.index(root) not in counted_inputs:
            continue
        if _weight_copy(root, placeholders, counted_inputs):
            continue  # autocast's cast of a weight: the estimate's weight copies count it
        roots[root.name] = SavedTensor(
            root.name,
            tuple(value.shape),
            str(value.dtype).removeprefix("torch."),
            value.numel() * value.element_size(),
            root.op == "placeholder",
        )
    return list(roots.values())


def compile_function(function: Any, record: list[Any] | None = None) -> Any:
    """``function`` through AOTAutograd with inductor's partitioner; the graphs run as they
    are (eager kernels on the partitioner's saved tensors). ``record`` gets each
    (forward, backward) graph pair the partitioner makes."""
    from torch._functorch._aot_autograd.utils import make_boxed_func
    from torch._functorch.aot_autograd import aot_function
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    def partition(joint: Any, joint_inputs: Any, **kwargs: Any) -> Any:
        fw_module, bw_module = min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
        if record is not None:
            record.append((fw_module, bw_module))
        return fw_module, bw_module

    def run_graph(graph: Any, _inputs: Sequence[Any]) -> Any:
        return make_boxed_func(graph)

    return aot_function(function, fw_compiler=cast(Any, run_graph), partition_fn=partition)


def compiled_layer(layer: Any, record: list[Any] | None = None) -> Any:
    """A decoder layer's forward, as a function of (params, hidden, cos, sin), compiled."""
    from torch.nn.utils.stateless import _reparametrize_module

    forward = layer.forward  # the layer's own, before compiled_layers replaces it

    def layer_function(params: dict[str, Any], hidden: Any, cos: Any, sin: Any) -> Any:
        with _reparametrize_module(layer, params):
            return forward(hidden, position_embeddings=(cos, sin), attention_mask=None)

    return compile_function(layer_function, record)


def trace_layer(
    model: Any,
    spec: ModelSpec,
    batch_size: int,
    seq_len: int,
    input_grad: bool,
    index: int = 1,
    precision: str = "bf16",
) -> list[SavedTensor]:
    """Trace decoder layer ``index`` of ``model`` (built on the meta device, as measure builds it)
    with AOTAutograd under FakeTensorMode and return the tensors its compiled forward saves
    for backward."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder()
    layer, rotary = decoder.layers[min(index, spec.n_layers - 1)], decoder.rotary_emb
    record: list[Any] = []
    with FakeTensorMode(allow_non_fake_inputs=True):
        layer.to_empty(device="cpu")
        rotary.to_empty(device="cpu")
        mixed = precision.endswith("-mixed")  # fp32 weights and residual under bf16 autocast
        dtype = torch.float32 if mixed else torch.bfloat16
        hidden = torch.empty(
            batch_size, seq_len, spec.hidden_size, dtype=dtype, requires_grad=input_grad
        )
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
            cos, sin = rotary(hidden, torch.arange(seq_len)[None])
            params = dict(layer.named_parameters())
            out = compiled_layer(layer, record)(params, hidden, cos, sin)
        del out
    fw_module, bw_module = record[-1]
    # the forward graph's inputs: the parameters, then hidden, cos, sin
    return saved_tensors(fw_module, bw_module, {len(params)})


# phi3's fused projections: q/k/v in one (q + 2 kv wide) and gate/up in one (2 intermediate)
FUSED_WIDTHS = {"qkv": {"q": 1, "kv": 2}, "gate_up": {"intermediate": 2}}
# families whose head width is hidden / n_heads whatever the config says: q is hidden there
FIXED_HEAD_WIDTH = ("phi3",)


def per_width_bytes(
    spec: ModelSpec, lora_rank: int, tokens: int, saved: list[SavedTensor]
) -> dict[str, int]:
    """Bytes per token per unit of each width, from one trace, and (as ``input``) the bytes per
    token per unit of hidden of the layer's input among them; raises when a tensor's size per
    token is none of the widths (or two widths are equal on ``spec``)."""
    sizes = widths(spec, lora_rank)
    if spec.family in FIXED_HEAD_WIDTH:
        del sizes["q"]  # always hidden: its tensors count as hidden
    parts = {name: {name: 1} for name in sizes}
    if spec.family == "phi3":
        parts |= FUSED_WIDTHS
        for name, weights in FUSED_WIDTHS.items():
            sizes[name] = sum(n * widths(spec, lora_rank)[w] for w, n in weights.items())
    if len(set(sizes.values())) != len(sizes):
        raise LessonkitError(f"the widths of {spec.name} must all differ to be told apart")
    by_size = {size: name for name, size in sizes.items()}
    out = dict.fromkeys((*WIDTHS, "input"), 0)
    for tensor in saved:
        elements = math.prod(tensor.shape)
        width, rest = divmod(elements, tokens)
        if rest or width not in by_size:
            raise LessonkitError(f"saved tensor {tensor.name} {tensor.shape} fits no width")
        per_unit = tensor.nbytes // (width * tokens)
        for name, count in parts[by_size[width]].items():
            out[name] += count * per_unit
        if tensor.is_input:
            out["input"] += per_unit
    return out


def checkpointed(layer: Any) -> bool:
    """Whether transformers checkpoints ``layer`` now (its GradientCheckpointingLayer's test)."""
    import torch

    return (
        bool(getattr(layer, "gradient_checkpointing", False))
        and layer.training
        and (torch.is_grad_enabled())
    )


@contextlib.contextmanager
def compiled_layers(model: Any) -> Iterator[None]:
    """Run every decoder layer of ``model`` through its own AOTAutograd-compiled forward (as
    torchtune's recipes compile each layer), so that autograd keeps the partitioner's saved
    tensors. With gradient checkpointing the checkpoint wraps the compiled layer (torchtune
    wraps each layer in a checkpoint, then compiles the layer inside): the forward keeps the
    layer's input, the backward runs the compiled forward again and keeps its saved tensors.
    The first call of each layer traces it: make it before measuring."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder_layers = list(base.get_decoder().layers)
    originals = [layer.forward for layer in decoder_layers]

    def compiled_forward(layer: Any) -> Any:
        function = compiled_layer(layer)

        def forward(
            hidden_states: Any,
            attention_mask: Any = None,
            position_embeddings: Any = None,
            **_kwargs: Any,
        ) -> Any:
            if attention_mask is not None:
                raise LessonkitError(
                    "measure(compile=True) runs unpadded batches only (no attention mask)"
                )
            cos, sin = position_embeddings

            def run(hidden: Any) -> Any:
                return function(dict(layer.named_parameters()), hidden, cos, sin)

            if checkpointed(layer):  # the checkpoint around the compiled layer, as torchtune's
                return layer._gradient_checkpointing_func(run, hidden_states)
            return run(hidden_states)

        return forward

    for layer in decoder_layers:
        layer.forward = compiled_forward(layer)
    try:
        yield
    finally:
        for layer, original in zip(decoder_layers, originals, strict=True):
            layer.forward = original
