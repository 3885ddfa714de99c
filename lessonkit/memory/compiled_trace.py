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
from .compiled import FUSED_WIDTHS, WIDTHS, widths


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
    target = str(node.target)
    return (
        ("_to_copy" in target or "convert_element_type" in target)
        and getattr(source, "op", None) == "placeholder"
        and placeholders.index(source) not in counted_inputs
    )


def saved_tensors(fw_module: Any, bw_module: Any, counted_inputs: set[int]) -> list[SavedTensor]:
    """The storages the backward graph receives from the forward graph, de-aliased: views are
    followed to their root; inputs count only when their index is in ``counted_inputs`` (the
    layer's hidden-state input, not its weights or the shared rotary tables)."""
    return list(
        {
            tensor.name: tensor
            for tensor in saved_inputs(fw_module, bw_module, counted_inputs).values()
        }.values()
    )


def saved_inputs(
    fw_module: Any, bw_module: Any, counted_inputs: set[int]
) -> dict[str, SavedTensor]:
    """The backward graph's inputs that are counted saved tensors (see ``saved_tensors``), by
    the name of their placeholder in the backward graph, each described as its storage's
    root: two placeholders that are views of one storage share its description."""
    bw_saved = [
        n for n in bw_module.graph.nodes if n.op == "placeholder" and "tangents" not in n.name
    ]
    output = next(n for n in fw_module.graph.nodes if n.op == "output")
    outputs = list(output.args[0])
    fw_saved = outputs[len(outputs) - len(bw_saved) :]
    placeholders = [n for n in fw_module.graph.nodes if n.op == "placeholder"]
    out: dict[str, SavedTensor] = {}
    for bw_node, node in zip(bw_saved, fw_saved, strict=True):
        root = _root(node)
        value = root.meta.get("val")
        if value is None or not hasattr(value, "numel"):
            continue  # a symbolic size, not a tensor
        if root.op == "placeholder" and placeholders.index(root) not in counted_inputs:
            continue
        if _weight_copy(root, placeholders, counted_inputs):
            continue  # autocast's cast of a weight: the estimate's weight copies count it
        out[bw_node.name] = _described(root, root.op == "placeholder")
    return out


def compile_function(function: Any, record: list[Any] | None = None, fused: bool = False) -> Any:
    """``function`` through AOTAutograd with inductor's partitioner; the graphs run as they are
    (eager kernels on the partitioner's saved tensors). With ``fused``, inductor's
    decompositions too, and on fake tensors each graph makes only its outputs, as inductor's
    fused kernels do for a graph of pointwise ops and reductions (see ``fused_graph``).
    Without it (the decoder layers) the graphs keep aten's composite ops: run with eager
    kernels, decomposed pointwise ops would make intermediates that inductor's fused kernels
    do not (the saved tensors are the same with and without, but for phi3's full
    fine-tuning, 2 bytes per token per unit of hidden fewer with them). ``record`` gets each
    (forward, backward) graph pair the partitioner makes."""
    from torch._functorch.aot_autograd import aot_function
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    def partition(joint: Any, joint_inputs: Any, **kwargs: Any) -> Any:
        fw_module, bw_module = min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
        if record is not None:
            record.append((fw_module, bw_module))
        return fw_module, bw_module

    def run_graph(graph: Any, _inputs: Sequence[Any]) -> Any:
        return fused_graph(graph) if fused else freeing_graph(graph)

    return aot_function(
        function,
        fw_compiler=cast(Any, run_graph),
        partition_fn=partition,
        decompositions=select_decomp_table() if fused else None,
    )


def freeing_graph(graph: Any) -> Any:
    """A boxed callable that runs ``graph`` node by node and releases each value, the graph's
    inputs among them, after its last use, as inductor's generated code does (``args.clear()``,
    then ``del`` of each buffer and input once dead): in a backward graph each saved tensor is
    freed as soon as the gradient math is done with it."""
    import torch.fx

    def run(args: list[Any]) -> Any:
        return torch.fx.Interpreter(graph).boxed_run(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def fused_graph(graph: Any) -> Any:
    """A boxed callable that runs ``graph`` as one fused kernel allocates: on fake tensors it
    returns the graph's inputs where the graph returns them and a new tensor for each other
    output (no intermediate is made, as when inductor fuses a cross-entropy's upcast, softmax
    and gradient into a few kernels that keep only [rows, 1] reductions); on real tensors it
    runs the graph."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    output = next(n for n in graph.graph.nodes if n.op == "output")

    def run(args: list[Any]) -> Any:
        if not any(isinstance(arg, FakeTensor) for arg in args):
            return graph(*args)
        values = dict(zip(placeholders, args, strict=True))
        device = next(arg.device for arg in args if isinstance(arg, torch.Tensor))
        results = []
        for node in output.args[0]:
            if node is None or node in values:
                results.append(values.get(node))
                continue
            if _is_view(node):
                raise LessonkitError(f"a fused graph returns a view ({node.name}): not modelled")
            value = node.meta["val"]
            results.append(
                torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=device)
            )
        args.clear()  # boxed: the caller's inputs are released as the graph's are
        return results

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def chunk_cross_entropy(logits: Any, labels: Any) -> Any:
    """torchtune's CEWithChunkedOutputLoss.compute_cross_entropy: one chunk's summed loss."""
    import torch.nn.functional as F

    return F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum")


def compiled_cross_entropy() -> Any:
    """torchtune's compiled cross-entropy of one chunk (training.compile_loss compiles
    CEWithChunkedOutputLoss.compute_cross_entropy): ``(logits, labels) -> summed loss`` with
    the logits upcast to fp32 inside the compiled region, run as inductor's fused kernels
    allocate (``fused_graph``); one graph per shape of the chunk, as dynamo recompiles."""
    by_shape: dict[tuple[Any, ...], Any] = {}

    def run(logits: Any, labels: Any) -> Any:
        key = (tuple(logits.shape), logits.dtype)
        if key not in by_shape:
            by_shape[key] = compile_function(chunk_cross_entropy, fused=True)
        return by_shape[key](logits, labels)

    return run


def trace_cross_entropy(rows: int, vocab: int) -> tuple[list[SavedTensor], list[SavedTensor]]:
    """What the compiled cross-entropy of ``rows`` bf16 logits saves for backward (the
    logits among them, as input) and what its backward graph makes: the tensors it returns."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    record: list[Any] = []
    with FakeTensorMode():
        logits = torch.empty(rows, vocab, dtype=torch.bfloat16, requires_grad=True)
        labels = torch.zeros(rows, dtype=torch.long)
        compile_function(chunk_cross_entropy, record, fused=True)(logits, labels).backward()
    fw_module, bw_module = record[-1]
    saved = [t for t in saved_tensors(fw_module, bw_module, {0, 1}) if t.dtype != "int64"]
    output = next(n for n in bw_module.graph.nodes if n.op == "output")
    made = [_described(n) for n in output.args[0] if n is not None]
    return saved, made


def _described(node: Any, is_input: bool = False) -> SavedTensor:
    value = node.meta["val"]
    return SavedTensor(
        node.name,
        tuple(value.shape),
        str(value.dtype).removeprefix("torch."),
        value.numel() * value.element_size(),
        is_input,
    )


def compiled_layer(layer: Any, record: list[Any] | None = None) -> Any:
    """A decoder layer's forward, as a function of (params, hidden, cos, sin), compiled."""
    from torch.nn.utils.stateless import _reparametrize_module

    forward = layer.forward  # the layer's own, before compiled_layers replaces it

    def layer_function(params: dict[str, Any], hidden: Any, cos: Any, sin: Any) -> Any:
        with _reparametrize_module(layer, params):
            return forward(hidden, position_embeddings=(cos, sin), attention_mask=None)

    return compile_function(layer_function, record)


def trace_layer_graphs(
    model: Any,
    spec: ModelSpec,
    batch_size: int,
    seq_len: int,
    input_grad: bool,
    index: int = 1,
    precision: str = "bf16",
) -> tuple[Any, Any, int]:
    """Trace decoder layer ``index`` of ``model`` (built on the meta device, as measure builds it)
    with AOTAutograd under FakeTensorMode: its forward and backward graphs, and the index of
    the forward graph's hidden-state input (after the parameters)."""
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
    return fw_module, bw_module, len(params)


def trace_layer(
    model: Any,
    spec: ModelSpec,
    batch_size: int,
    seq_len: int,
    input_grad: bool,
    index: int = 1,
    precision: str = "bf16",
) -> list[SavedTensor]:
    """The tensors the compiled forward of decoder layer ``index`` saves for backward (see
    ``trace_layer_graphs``)."""
    fw_module, bw_module, hidden_input = trace_layer_graphs(
        model, spec, batch_size, seq_len, input_grad, index, precision
    )
    return saved_tensors(fw_module, bw_module, {hidden_input})


# families whose head width is hidden / n_heads whatever the config says: q is hidden there
FIXED_HEAD_WIDTH = ("phi3",)


def _width_names(
    spec: ModelSpec, lora_rank: int
) -> tuple[dict[int, str], dict[str, dict[str, int]]]:
    """Each width's size on ``spec`` (by size) and what each name counts in units of WIDTHS
    (phi3's fused projections count twice or thrice); raises when two widths are equal."""
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
    return {size: name for name, size in sizes.items()}, parts


def per_width_bytes(
    spec: ModelSpec, lora_rank: int, tokens: int, saved: list[SavedTensor]
) -> dict[str, int]:
    """Bytes per token per unit of each width, from one trace, and (as ``input``) the bytes per
    token per unit of hidden of the layer's input among them; raises when a tensor's size per
    token is none of the widths (or two widths are equal on ``spec``)."""
    by_size, parts = _width_names(spec, lora_rank)
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


def backward_profile(
    spec: ModelSpec,
    lora_rank: int,
    tokens: int,
    bw_module: Any,
    inputs: dict[str, SavedTensor] | None = None,
) -> list[dict[str, int]]:
    """What a compiled layer's backward graph holds beside its incoming gradient at its highest
    moments, as bytes per unit: per token of each width (``hidden``, ...) and per element of
    each weight shape (``"hidden x q"``, a vector ``"hidden"`` as ``"hidden x one"``). The
    tensors it makes count, and its saved tensors ``inputs`` (``saved_inputs``) until their last
    use, the layer's own input among them also as ``input`` (per token per unit of hidden).
    Only the moments no other moment exceeds in every unit are kept."""
    by_size, parts = _width_names(spec, lora_rank)
    order = {name: i for i, name in enumerate((*WIDTHS, *FUSED_WIDTHS))}
    moments: list[dict[str, int]] = []
    alive = inputs_alive(bw_module, inputs or {})
    for held, saved in zip(working_set(bw_module), alive, strict=True):
        units = per_width_bytes(spec, lora_rank, tokens, saved)
        units = {name: count for name, count in units.items() if count}
        for shape, nbytes in held:
            elements = math.prod(shape)
            width, rest = divmod(elements, tokens)
            if not rest and (width in by_size or 2 * width in by_size):
                # half a width: rotary's rotate_half of the query or key
                full = width if width in by_size else 2 * width
                for name, count in parts[by_size[full]].items():
                    units[name] = units.get(name, 0) + count * nbytes // (full * tokens)
                continue
            dims = [d for d in shape if d != 1]
            if not dims:
                continue  # a scalar
            if len(dims) > 2 or any(d not in by_size for d in dims):
                raise LessonkitError(f"a backward tensor {shape} fits no width")
            names = sorted((by_size[d] for d in dims), key=order.__getitem__)
            key = " x ".join(names + ["one"] * (2 - len(names)))
            units[key] = units.get(key, 0) + nbytes // elements
        moments.append(units)
    return _highest(moments)


def _highest(moments: list[dict[str, int]]) -> list[dict[str, int]]:
    """The moments no other moment equals or exceeds in every unit."""
    kept: list[dict[str, int]] = []
    for m in moments:
        if any(all(m.get(k, 0) <= o.get(k, 0) for k in m) for o in kept):
            continue
        kept = [o for o in kept if not all(o.get(k, 0) <= m.get(k, 0) for k in o)] + [m]
    return kept


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


def _storages(graph: Any) -> dict[Any, tuple[Any, int | None]]:
    """Each node's storage: views and getitems point at their root's (a multi-output node's
    element ``i`` is ``(node, i)``)."""
    import operator

    out: dict[Any, tuple[Any, int | None]] = {}
    for node in graph.nodes:
        if _is_view(node):
            out[node] = out.get(node.args[0], (node.args[0], None))
        elif node.op == "call_function" and node.target is operator.getitem:
            parent = node.args[0]
            out[node] = out.get(parent, (parent, None))[0], int(node.args[1])
        else:
            out[node] = (node, None)
    return out


def inputs_alive(graph: Any, inputs: dict[str, SavedTensor]) -> list[list[SavedTensor]]:
    """Which of ``inputs`` (by placeholder name; placeholders that share a storage share one
    description) a graph still holds while each of its nodes runs: from the start to the last
    use of any of their placeholders or views, as ``freeing_graph`` runs it."""
    nodes = list(graph.graph.nodes)
    storage = _storages(graph.graph)
    last: dict[str, int] = {}
    described: dict[str, SavedTensor] = {}
    for i, node in enumerate(nodes):
        for used in node.all_input_nodes:
            root = storage[used][0]
            if root.op == "placeholder" and root.name in inputs:
                tensor = inputs[root.name]
                described[tensor.name] = tensor
                last[tensor.name] = max(last.get(tensor.name, 0), i)
    return [[described[name] for name in described if i <= last[name]] for i in range(len(nodes))]


def working_set(graph: Any) -> list[list[tuple[tuple[int, ...], int]]]:
    """The tensors a graph module has made and still holds while each of its nodes runs (run as FX
    runs it: a value is freed after its last use, the outputs kept), as (shape, bytes) lists;
    the graph's inputs (saved tensors, incoming gradients) and their views are left out."""
    nodes = list(graph.graph.nodes)
    index = {node: i for i, node in enumerate(nodes)}
    storage = _storages(graph.graph)
    last: dict[tuple[Any, int | None], int] = {}
    for node in nodes:
        for used in node.all_input_nodes:
            key = storage[used]
            last[key] = max(last.get(key, 0), index[node])
    for key in {storage[n] for n in nodes if n.op == "output" for n in n.all_input_nodes}:
        last[key] = len(nodes)
    sizes: dict[tuple[Any, int | None], tuple[tuple[int, ...], int]] = {}
    for node in nodes:
        root, _ = storage[node]
        if root is not node or node.op != "call_function":
            continue
        value = node.meta.get("val")
        values = value if isinstance(value, (tuple, list)) else [value]
        for i, each in enumerate(values):
            if hasattr(each, "numel") and each.numel():
                key = (node, i if isinstance(value, (tuple, list)) else None)
                sizes[key] = (tuple(each.shape), each.numel() * each.element_size())
    born = {key: index[key[0]] for key in sizes}
    return [
        [sizes[key] for key in sizes if born[key] <= i <= last.get(key, born[key])]
        for i in range(len(nodes))
    ]
