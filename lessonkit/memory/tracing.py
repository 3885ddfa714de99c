"""What a traced model (a causal LM lessonkit has no blocks for) saves for backward, traced.

Its forward runs under FakeTensorMode (no memory is allocated) with transformers' own modeling
code, at the real widths and at two sequence lengths, with as many of its first decoder layers
as it takes to meet each kind of layer it has (``models.traced.layer_kinds``: DeepSeek-V3's
dense first layers and its MoE layers, Llama 4's layers with and without RoPE). Each tensor
saved for backward is counted once (by storage), leaving out the parameters, and belongs to the
decoder layer that was running when it was first saved, or to the rest of the model. Those two
traces give what each kind of layer saves per token and in all (autocast's copies of its
weights), and what the rest of the model saves per token. The result is cached per
configuration and per the settings that decide it; the first trace of a configuration takes a
few seconds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from ..errors import LessonkitError
from ..models.spec import ModelSpec
from ..safe_repr import short_str
from .settings import RunSettings

# The sequence lengths traced (batch 1): short, so that a trace stays cheap; three of them, so
# that a seq x seq term (eager attention's probabilities) is fitted beside the per-token one.
TRACED_LENGTHS = (32, 64, 96)


@dataclass(frozen=True)
class LayerTrace:
    """Saved bytes of one decoder layer as traced: per token, per token and token of the same
    sequence (attention's seq x seq terms), and fixed (autocast's copies of its weights);
    ``count`` layers of the model are of its kind."""

    per_token: float
    fixed: float
    count: int = 1
    per_token_pair: float = 0.0

    def saved(self, batch_size: int, seq_len: int) -> int:
        return int(batch_size * seq_len * (self.per_token + self.per_token_pair * seq_len))


@dataclass(frozen=True)
class Trace:
    """Saved bytes of a traced model: its first decoder layer, each kind of the others, and
    the rest of the model (per token, the loss's log-softmax left out: the step counts it)."""

    first: LayerTrace
    kinds: tuple[LayerTrace, ...]  # the layers after the first, a kind each (counts add up)
    others: tuple[int, ...]  # for each layer after the first, its kind (an index in kinds)
    outside_per_token: float
    precision: str  # the precision traced (pure bf16 where the model refuses another)
    layers_traced: int

    def average(self) -> LayerTrace:
        """The layers after the first, on average (what they save in all, over their count)."""
        count = sum(kind.count for kind in self.kinds)
        if not count:
            return self.first
        return LayerTrace(
            sum(kind.per_token * kind.count for kind in self.kinds) / count,
            sum(kind.fixed * kind.count for kind in self.kinds) / count,
            count,
            sum(kind.per_token_pair * kind.count for kind in self.kinds) / count,
        )

    def largest(self, batch_size: int, seq_len: int) -> LayerTrace:
        """The kind of layer after the first that saves the most in a step of this shape."""
        if not self.kinds:
            return self.first
        return max(self.kinds, key=lambda kind: kind.saved(batch_size, seq_len) + kind.fixed)


def traced_activations(spec: ModelSpec, settings: RunSettings) -> Trace:
    """The trace of ``spec`` under the settings that change what is saved (QLoRA traced as
    LoRA on 16-bit weights; one GPU, no checkpointing: the step applies those)."""
    traced = replace(
        settings,
        method="lora" if settings.method == "qlora" else settings.method,
        batch_size=1,
        seq_len=TRACED_LENGTHS[0],
        gradient_checkpointing=False,
        n_gpus=1,
        zero_stage=0,
        offload_optimizer=False,
        gradient_accumulation=1,
        device="cpu",
        lora_dropout=0.0,
        bitsandbytes="current",
        activation_offload=False,
        optimizer_in_backward=False,
        loss="standard",
        no_sync=False,
        optimizer="sgd",
    )
    return _trace(spec, traced)


@lru_cache(maxsize=64)
def _trace(spec: ModelSpec, settings: RunSettings) -> Trace:
    try:
        return _trace_at(spec, settings)
    except Exception as first:  # e.g. grouped-GEMM experts refuse fp32 inputs
        if settings.precision == "bf16":
            raise _untraceable(spec, settings, first) from None
        try:
            return _trace_at(spec, replace(settings, precision="bf16"))
        except Exception as err:
            raise _untraceable(spec, settings, err) from None


def _untraceable(spec: ModelSpec, settings: RunSettings, err: Exception) -> LessonkitError:
    lora = ""
    if settings.method != "full" and _traces_without_lora(spec, settings):
        targets = settings.lora_targets
        named = targets if isinstance(targets, str) else ", ".join(targets)
        # e.g. peft's all-linear wraps Llama 4's router, whose forward returns a tuple
        lora = (
            f" It fails with LoRA on {named} only (the step traces without LoRA), so a "
            "training run with these targets fails the same way: name lora_targets among "
            "the attention and MLP projections instead."
        )
    return LessonkitError(
        f"transformers' {spec.extra.get('model_type')} model could not be traced on a short "
        f"step ({type(err).__name__}: {short_str(err, 200)}), so its activations cannot be "
        f"estimated.{lora}"
    )


def _traces_without_lora(spec: ModelSpec, settings: RunSettings) -> bool:
    try:
        _saved_bytes(
            replace(spec, n_layers=1, moe_layers=min(spec.moe_layers, 1)),
            replace(settings, method="full", precision="bf16"),
        )
    except Exception:
        return False
    return True


def _trace_at(spec: ModelSpec, settings: RunSettings) -> Trace:
    from ..models.traced import layer_kinds

    kinds = layer_kinds(spec.extra["config"], spec.extra["model_type"], spec.n_layers)
    # each kind met first after the first layer (whose input may not require grad)
    first_of = {kind: i for i, kind in reversed(list(enumerate(kinds))) if i > 0}
    traced_layers = max(first_of.values(), default=0) + 1
    short = replace(spec, n_layers=traced_layers, moe_layers=min(spec.moe_layers, traced_layers))
    saved = {
        length: _saved_bytes(short, replace(settings, seq_len=length)) for length in TRACED_LENGTHS
    }

    def layer(i: int, count: int) -> LayerTrace:
        fixed, per_token, pair = _fit({n: saved[n][0][i] for n in TRACED_LENGTHS})
        return LayerTrace(per_token, fixed, count, pair)

    counts = {kind: kinds[1:].count(kind) for kind in first_of}
    order = list(first_of)
    low, high = TRACED_LENGTHS[0], TRACED_LENGTHS[-1]
    outside = {n: saved[n][1] - 4 * n * spec.vocab_size for n in (low, high)}
    return Trace(
        first=layer(0, 1),
        kinds=tuple(layer(i, counts[kind]) for kind, i in first_of.items()),
        others=tuple(order.index(kind) for kind in kinds[1:]),
        outside_per_token=max(0.0, (outside[high] - outside[low]) / (high - low)),
        precision=settings.precision,
        layers_traced=traced_layers,
    )


def _fit(saved: dict[int, int]) -> tuple[float, float, float]:
    """``fixed + per_token * n + pair * n * n`` through the bytes saved at three lengths ``n``
    (none negative: a trace's rounding must not make a step save less with more tokens)."""
    (n1, b1), (n2, b2), (n3, b3) = sorted(saved.items())
    slope_low, slope_high = (b2 - b1) / (n2 - n1), (b3 - b2) / (n3 - n2)
    pair = max(0.0, (slope_high - slope_low) / (n3 - n1))
    per_token = max(0.0, slope_low - pair * (n1 + n2))
    return max(0.0, b1 - per_token * n1 - pair * n1 * n1), per_token, pair


def _saved_bytes(spec: ModelSpec, settings: RunSettings) -> tuple[list[int], int]:
    """Bytes one forward of ``spec`` saves for backward, under FakeTensorMode: in each decoder
    layer, and outside them."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.multiprocessing import reductions

    from .measuring import build_model, dtypes, finish_model, unpacked_sequences

    _, compute_dtype = dtypes(settings)
    storage_ref: Any = reductions.StorageWeakRef  # a key per storage, fake ones too
    with contextlib.ExitStack() as stack:
        stack.enter_context(unpacked_sequences())
        stack.enter_context(_quiet("torch._subclasses.fake_tensor"))  # a refusal is an error
        model = build_model(spec, settings, "meta")
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        model.to_empty(device="cpu")
        finish_model(model, spec, settings)
        weights = {storage_ref(p.untyped_storage()) for p in model.parameters()}
        weights |= {storage_ref(b.untyped_storage()) for b in model.buffers()}
        running: list[int | None] = [None]  # the decoder layer running, if any
        for i, decoder_layer in enumerate(_decoder_layers(model, spec.n_layers)):
            decoder_layer.register_forward_pre_hook(lambda *_, i=i: running.__setitem__(0, i))
            decoder_layer.register_forward_hook(lambda *_: running.__setitem__(0, None))
        storages: dict[Any, tuple[int, int | None]] = {}

        def pack(tensor: Any) -> Any:
            storage = storage_ref(tensor.untyped_storage())
            if storage not in weights and storage not in storages:
                storages[storage] = (tensor.untyped_storage().nbytes(), running[0])
            return tensor

        ids = torch.randint(0, spec.vocab_size, (settings.batch_size, settings.seq_len))
        with (
            torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
            torch.autocast("cpu", dtype=compute_dtype, enabled=settings.mixed),
        ):
            model(input_ids=ids, labels=ids)
    per_layer = [0] * spec.n_layers
    outside = 0
    for nbytes, owner in storages.values():
        if owner is None:
            outside += nbytes
        else:
            per_layer[owner] += nbytes
    return per_layer, outside


def _decoder_layers(model: Any, n_layers: int) -> Any:
    """The model's decoder layers: of its lists of ``n_layers`` modules, the one holding the
    most parameters."""
    import torch

    lists = [
        module
        for module in model.modules()
        if isinstance(module, torch.nn.ModuleList) and len(module) == n_layers
    ]
    if not lists:
        raise LessonkitError(f"no list of {n_layers} decoder layers in the model")
    return max(lists, key=lambda layers: sum(p.numel() for p in layers.parameters()))


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """Silence ``logger`` (FakeTensorMode logs a traceback for an operator it cannot run,
    which the trace handles: it retries in bf16 or says the model cannot be traced)."""
    import logging

    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)
