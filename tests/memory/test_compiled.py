"""compile=True: the partitioner's saved tensors, traced, stored as data and checked.

The data file lessonkit/data/compiled_saves.json must be what tracing gives with the installed
torch (so this fails when PyTorch's partitioner changes); the accuracy grid's COMPILE_ROWS
compare estimate(compile=True) with measure(compile=True).
"""

from __future__ import annotations

import json
import shutil
from importlib import resources

import pytest

import lessonkit
from lessonkit.errors import LessonkitError
from lessonkit.models.spec import ModelSpec
from tests.script_loader import load_script

LLAMA = ModelSpec(
    name="tiny-llama",
    family="llama",
    n_layers=2,
    hidden_size=256,
    n_heads=4,
    n_kv_heads=4,
    intermediate_size=688,
    vocab_size=4096,
)


def _stored() -> dict:
    text = resources.files("lessonkit").joinpath("data/compiled_saves.json").read_text()
    return json.loads(text)


def test_data_file_matches_a_trace_now() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    import torch

    tool = load_script("tools/compiled_saves.py")
    data = _stored()
    assert data["source"] and data["as_of"]
    # the release, whatever the build (+cpu, +cu126)
    release = torch.__version__.split("+")[0]
    assert data["torch_version"].split("+")[0] == release, "retrace: tools/compiled_saves.py"
    layers, backward = tool.traced_layers()
    assert layers == data["layers"]
    assert backward == data["backward"]
    assert tool.traced_cross_entropy() == data["cross_entropy"]


def test_compiled_layers_save_less_than_eager() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    kw = dict(precision="bf16", batch_size=2, seq_len=128, device="cpu")
    eager = lessonkit.measure(LLAMA, **kw)
    compiled = lessonkit.measure(LLAMA, compile=True, **kw)
    assert compiled.breakdown["activations"] < eager.breakdown["activations"]
    for name in ("weights", "gradients", "optimizer"):
        assert compiled.breakdown.get(name) == eager.breakdown.get(name)
    assert any("min_cut_rematerialization_partition" in a for a in compiled.assumptions)


def test_estimate_reads_the_data_file() -> None:
    from lessonkit.memory.estimating import _Step
    from lessonkit.memory.settings import validate_run

    layer = _stored()["layers"]["llama/full/bf16/input-grad"]
    kw = dict(precision="bf16", batch_size=2, seq_len=128, device="cpu")
    eager = lessonkit.estimate(LLAMA, **kw)
    compiled = lessonkit.estimate(LLAMA, compile=True, **kw)
    widths = dict(hidden=256, q=256, intermediate=688, kv=256, heads=4, kv_heads=4, rank=16, one=1)
    per_layer = 2 * 128 * sum(layer[name] * widths[name] for name in widths)
    eager_layer = _Step(LLAMA, validate_run(LLAMA, **_defaults(kw))).layer_saved
    # both at the start of backward: every layer's saved tensors, the rest unchanged
    assert compiled.peak_phase == eager.peak_phase == "backward"
    difference = compiled.breakdown["activations"] - eager.breakdown["activations"]
    assert difference == LLAMA.n_layers * (per_layer - eager_layer)
    assert any("compile=True" in a for a in compiled.assumptions)


def _defaults(kw: dict) -> dict:
    import inspect

    signature = inspect.signature(lessonkit.memory.estimating.estimate)
    defaults = {name: p.default for name, p in signature.parameters.items() if name != "model"}
    return defaults | kw


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (dict(method="qlora"), "'qlora'"),
        (dict(precision="fp16-mixed"), "'bf16' (as torchtune's compiled recipes run) and"),
        (dict(precision="fp32"), "not 'fp32'"),
        (dict(n_gpus=2, zero_stage=2), "ZeRO-2"),
        (dict(n_gpus=2, zero_stage=3, fsdp_version=1), "fsdp_version=1"),
        (dict(method="lora", lora_dropout=0.05), "lora_dropout"),
        (dict(method="lora", lora_targets="all-linear"), "LoRA targets other than peft's default"),
        (dict(method="lora", lora_targets=["q_proj", "k_proj"]), "(q_proj, v_proj)"),
        (dict(attention="eager"), "attention='eager'"),
        (dict(compile="yes"), "compile must be True or False"),
    ],
)
def test_combinations_not_modelled_are_refused(settings: dict, named: str) -> None:
    kw = dict(precision="bf16", compile=True) | settings
    with pytest.raises(LessonkitError, match=None) as error:
        lessonkit.estimate(LLAMA, **kw)
    assert named in str(error.value)


@pytest.mark.parametrize(
    ("family", "why"),
    [
        ("gpt2", "no rotary tables"),
        ("gemma2", "soft-caps the scores"),
        ("gemma3_text", "sliding-window and global layers"),
    ],
)
def test_other_families_are_refused(family: str, why: str) -> None:
    from dataclasses import replace

    spec = replace(LLAMA, name=f"tiny-{family}", family=family)
    with pytest.raises(LessonkitError) as error:
        lessonkit.estimate(spec, precision="bf16", compile=True)
    message = str(error.value)
    assert "llama, mistral, qwen2, qwen3, gemma, phi3, olmo2, smollm3, granite families" in message
    assert f"not {family} (" in message and why in message


def test_sequences_past_a_sliding_window_are_refused() -> None:
    from dataclasses import replace

    spec = replace(LLAMA, name="tiny-mistral", family="mistral", extra={"sliding_window": 256})
    lessonkit.estimate(spec, precision="bf16", compile=True, seq_len=256)
    with pytest.raises(LessonkitError, match="sliding window \\(256 tokens\\), not seq_len=512"):
        lessonkit.estimate(spec, precision="bf16", compile=True, seq_len=512)


def test_smollm3_layers_without_rotary_save_the_same() -> None:
    """SmolLM3 leaves out rotary in every fourth layer: the data, traced on a layer with it,
    must hold for those too."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from dataclasses import replace

    from lessonkit.memory.compiled_trace import trace_layer
    from lessonkit.memory.measuring import build_model, validate

    tool = load_script("tools/compiled_saves.py")
    spec = replace(tool.trace_spec("smollm3"), n_layers=4)
    kw = _defaults(dict(precision="bf16", batch_size=1, seq_len=40))
    model = build_model(spec, validate(spec, **kw), "meta")
    with_rope, without = (trace_layer(model, spec, 1, 40, True, index) for index in (1, 3))
    # the same sizes, in another order (the partitioner's)
    assert sorted(t.nbytes for t in with_rope) == sorted(t.nbytes for t in without)


def test_checkpointed_compiled_layers_recompute_in_backward() -> None:
    """With checkpointing around each compiled layer the forward keeps the layers' inputs
    (as eager checkpointing) and the backward runs the compiled forward again."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from lessonkit.models.spec import ModelSpec as Spec

    wide = Spec(
        name="wide-llama",
        family="llama",
        n_layers=4,
        hidden_size=512,
        n_heads=8,
        n_kv_heads=8,
        intermediate_size=1408,
        vocab_size=1000,
    )
    kw = dict(method="lora", precision="bf16", batch_size=4, seq_len=512, device="cpu")
    eager = lessonkit.measure(wide, gradient_checkpointing=True, **kw)
    compiled = lessonkit.measure(wide, gradient_checkpointing=True, compile=True, **kw)
    plain = lessonkit.measure(wide, compile=True, **kw)
    assert compiled.tensor_bytes < eager.tensor_bytes < plain.tensor_bytes
    estimated = lessonkit.estimate(wide, gradient_checkpointing=True, compile=True, **kw)
    assert abs(estimated.tensor_bytes / compiled.tensor_bytes - 1) < 0.05


@pytest.mark.parametrize("method", ["full", "lora"])
def test_the_data_holds_at_another_shape(method: str) -> None:
    """The min-cut weighs tensors by size, so what it saves could change with the shape: the
    data, traced on one shape, must give a trace's bytes on another (hidden 512, 8 heads)."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    import inspect

    from lessonkit.memory.compiled import compiled_layer_bytes
    from lessonkit.memory.compiled_trace import trace_layer
    from lessonkit.memory.measuring import build_model, validate

    spec = ModelSpec(
        name="wide-llama",
        family="llama",
        n_layers=2,
        hidden_size=512,
        n_heads=8,
        n_kv_heads=8,
        intermediate_size=1408,
        vocab_size=1000,
    )
    signature = inspect.signature(lessonkit.memory.estimating.estimate)
    defaults = {name: p.default for name, p in signature.parameters.items() if name != "model"}
    kw = defaults | dict(method=method, precision="bf16", batch_size=2, seq_len=512)
    model = build_model(spec, validate(spec, **kw), "meta")
    traced = sum(t.nbytes for t in trace_layer(model, spec, 2, 512, True))
    assert traced == compiled_layer_bytes(spec, method, "bf16", 16, 2 * 512, True)


def test_the_compiled_loss_saves_what_inductor_saves() -> None:
    """The traced cross-entropy of one chunk must keep for backward what torch.compile's own
    inductor build keeps (its saved tensors, caught by saved-tensor hooks on real CPU
    tensors), and its fused run must make only the logits' gradient."""
    torch = pytest.importorskip("torch")

    from lessonkit.memory.compiled_trace import chunk_cross_entropy, trace_cross_entropy

    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("inductor needs a C++ compiler on CPU")
    rows, vocab = 48, 1000
    logits = torch.randn(rows, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (rows,))
    packed: list = []

    def pack(tensor):
        packed.append(tensor)
        return tensor

    compiled = torch.compile(chunk_cross_entropy, backend="inductor", fullgraph=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = compiled(logits, labels)
    expected = loss.detach().clone()
    loss.backward()
    eager = chunk_cross_entropy(logits.detach().float(), labels)
    assert torch.allclose(expected, eager, rtol=1e-3)
    real = sorted(
        (tuple(t.shape), str(t.dtype).removeprefix("torch."))
        for t in packed
        if t.dtype != torch.int64
    )
    saved, made = trace_cross_entropy(rows, vocab)
    assert sorted((t.shape, t.dtype) for t in saved) == real
    assert [(t.shape, t.dtype) for t in made] == [((rows, vocab), "bfloat16")]
    assert ((rows, vocab), "float32") not in real  # no fp32 log-softmax kept


def test_the_compiled_chunked_loss_keeps_no_fp32_logits() -> None:
    """Compiling the chunked loss drops its fp32 log-softmax: the logits' part of the peak
    falls, by about the fp32 [tokens, vocab] tensor, and the CLI says so too."""
    kw = dict(method="lora", precision="bf16", batch_size=2, seq_len=4096, loss="chunked")
    eager = lessonkit.estimate("llama-3.2-3b", compile=False, **kw)
    compiled = lessonkit.estimate("llama-3.2-3b", compile=True, **kw)
    fp32_logits = 4 * 2 * 4096 * 128256
    assert eager.breakdown["logits"] - compiled.breakdown["logits"] > 0.9 * fp32_logits
    assert any("compute_cross_entropy" in note for note in compiled.assumptions)


def test_a_graphs_working_set_follows_last_uses_and_views() -> None:
    """working_set holds a value from the node that makes it to its last use (outputs to the
    end), counts a view as its root's storage and leaves the graph's inputs out."""
    torch = pytest.importorskip("torch")
    from torch.fx.experimental.proxy_tensor import make_fx

    from lessonkit.memory.compiled_trace import working_set

    def graph(x):
        doubled = x * 2
        shifted = doubled + 1
        product = shifted * doubled  # the last use of both
        flat = product.view(-1)  # a view: no storage of its own
        return (flat * 3).sum(), flat

    traced = make_fx(graph, tracing_mode="fake")(torch.empty(10, 100))
    moments = working_set(traced)
    size = 10 * 100 * 4
    assert max(sum(nbytes for _, nbytes in held) for held in moments) == 3 * size
    inputs_only = moments[0]  # the placeholder: nothing made yet
    assert inputs_only == []
    # at the end: the returned product (through its view) and the sum
    assert sorted(nbytes for _, nbytes in moments[-1]) == [4, size]


def test_a_freeing_graph_releases_an_input_after_its_last_use() -> None:
    """freeing_graph (how measure runs compiled graphs) drops a graph's input once no later
    node uses it, while the graph is still running; a plain boxed call keeps it to the end."""
    torch = pytest.importorskip("torch")
    import weakref

    from torch._functorch._aot_autograd.utils import make_boxed_func

    from lessonkit.memory.compiled_trace import freeing_graph

    seen: list[bool] = []
    graph = torch.fx.Graph()
    first, second = graph.placeholder("first"), graph.placeholder("second")
    doubled = graph.call_function(torch.mul, (first, 2))
    probed = graph.call_function(lambda x: seen.append(ref() is not None) or x, (second,))
    graph.output((doubled, probed))
    module = torch.fx.GraphModule(torch.nn.Module(), graph)

    for runner, alive in ((make_boxed_func(module), True), (freeing_graph(module), False)):
        tensor = torch.ones(4)
        ref = weakref.ref(tensor)
        args = [tensor, torch.zeros(4)]
        del tensor
        runner(args)
        assert seen.pop() is alive


def test_inductors_backward_frees_its_saved_tensors_as_it_goes() -> None:
    """What freeing_graph assumes, read from inductor's own generated code: the backward
    clears its boxed arguments and deletes a saved tensor before its last kernel runs."""
    torch = pytest.importorskip("torch")
    if shutil.which("g++") is None:
        pytest.skip("inductor's CPU backend needs a C++ compiler (g++)")
    from torch._inductor.utils import run_and_get_code

    def function(x, w1, w2):
        return (torch.nn.functional.silu(x @ w1) @ w2).sum()

    x = torch.randn(64, 32, requires_grad=True)
    w1, w2 = torch.randn(32, 128, requires_grad=True), torch.randn(128, 32, requires_grad=True)
    compiled = torch.compile(function, backend="inductor")
    torch._dynamo.reset()
    _, codes = run_and_get_code(lambda: compiled(x, w1, w2).backward())
    backward = next(code for code in codes if "tangents_1" in code)
    call = backward[backward.index("def call(") :]
    unpacked = call.splitlines()[1].split("=")[0]  # "mm, permute, ..., tangents_1 = args"
    saved = [name.strip() for name in unpacked.split(",") if "tangents" not in name]
    assert saved and "args.clear()" in call
    kernels = [
        i for i, line in enumerate(call.splitlines()) if "kernel" in line or "cpp_fused" in line
    ]
    freed = [
        i for i, line in enumerate(call.splitlines()) if line.strip() in {f"del {n}" for n in saved}
    ]
    assert freed and min(freed) < max(kernels)  # a saved tensor freed before the last kernel
