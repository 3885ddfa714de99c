"""What a traced model (a causal LM lessonkit has no blocks for) saves for backward, traced.

Its forward runs under FakeTensorMode (no memory is allocated) with transformers' own modeling
code, at the real widths, with 1 and then 2 decoder layers and at two sequence lengths; each
tensor saved for backward is counted once (by storage), leaving out the parameters. Those four
traces give, by differences, what one layer saves per token and in all (autocast's copies of
its weights), and what the rest of the model saves per token. The result is cached per
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

# The sequence lengths traced (batch 1): short, so that a trace stays cheap; attention's
# seq x seq terms (eager attention) are scaled per token, so approximate.
TRACED_LENGTHS = (32, 64)


@dataclass(frozen=True)
class Trace:
    """Saved bytes of a traced model: per decoder layer (per token and fixed), and of the rest
    of the model (per token, the loss's log-softmax left out: the step counts it)."""

    layer_per_token: float
    layer_fixed: float
    outside_per_token: float
    precision: str  # the precision traced (pure bf16 where the model refuses another)


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
            raise _untraceable(spec, first) from None
        try:
            return _trace_at(spec, replace(settings, precision="bf16"))
        except Exception as err:
            raise _untraceable(spec, err) from None


def _untraceable(spec: ModelSpec, err: Exception) -> LessonkitError:
    return LessonkitError(
        f"transformers' {spec.extra.get('model_type')} model could not be traced on a short "
        f"step ({type(err).__name__}: {short_str(err, 200)}), so its activations cannot be "
        "estimated."
    )


def _trace_at(spec: ModelSpec, settings: RunSettings) -> Trace:
    saved = {}
    for layers in (1, 2):
        # a short model: its MoE layers counted no further than its layers (the trace builds
        # the model from the config, which says which layers have experts)
        one = replace(spec, n_layers=layers, moe_layers=min(spec.moe_layers, layers))
        for length in TRACED_LENGTHS:
            saved[layers, length] = _saved_bytes(one, replace(settings, seq_len=length))
    short, long = TRACED_LENGTHS
    layer = {n: saved[2, n] - saved[1, n] for n in TRACED_LENGTHS}
    layer_per_token = (layer[long] - layer[short]) / (long - short)
    layer_fixed = max(0.0, layer[short] - layer_per_token * short)
    outside = {n: saved[1, n] - layer[n] - 4 * n * spec.vocab_size for n in TRACED_LENGTHS}
    outside_per_token = max(0.0, (outside[long] - outside[short]) / (long - short))
    return Trace(max(0.0, layer_per_token), layer_fixed, outside_per_token, settings.precision)


def _saved_bytes(spec: ModelSpec, settings: RunSettings) -> int:
    """Bytes one forward of ``spec`` saves for backward, under FakeTensorMode."""
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
        storages: dict[Any, int] = {}

        def pack(tensor: Any) -> Any:
            storage = storage_ref(tensor.untyped_storage())
            if storage not in weights:
                storages[storage] = tensor.untyped_storage().nbytes()
            return tensor

        ids = torch.randint(0, spec.vocab_size, (settings.batch_size, settings.seq_len))
        with (
            torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
            torch.autocast("cpu", dtype=compute_dtype, enabled=settings.mixed),
        ):
            model(input_ids=ids, labels=ids)
        return sum(storages.values())


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
