"""Loading the checkpoint: the moment before the first forward, and what it leaves reserved.

How transformers 5.24's ``from_pretrained`` puts a model on the GPU (modeling_utils.py
``_load_pretrained_model``, core_model_loading.py ``convert_and_load_state_dict_in_model``,
quantizers/quantizer_bnb_4bit.py, integrations/bitsandbytes.py ``Bnb4bitQuantize``):

- the model is built on the meta device; ``low_cpu_mem_usage`` is accepted and ignored (it is
  always so in transformers 5);
- with a ``device_map`` on the GPU (QLoRA always has one: bitsandbytes' quantizer sets
  ``{"": current device}`` when none is given), ``caching_allocator_warmup`` first allocates and
  frees one block of the model's size on the GPU, counting each 4-bit weight at 0.5 bytes per
  parameter and every other tensor at its dtype's size: the caching allocator keeps it reserved;
- the checkpoint's tensors are then taken in ``dot_natural_key`` order of their names. Without
  quantization each is copied to the GPU in the model's dtype by 4 threads; with bitsandbytes
  4-bit quantization on the fly the loading is sequential: each linear weight comes to the GPU
  in 16 bits, ``Params4bit`` quantizes it there (``bitsandbytes.functional.quantize_4bit``: the
  packed weight and fp32 absmax, then with double quantization the 8-bit absmax and its
  constants, from a temporary ``absmax - mean``), and the 16-bit copy is freed.

The peak allocated during loading is the warm-up block or the moment one weight is quantized
(every weight loaded before it, its 16-bit copy and its quantization buffers), whichever is
higher; what stays reserved is the caching allocator's replay of that sequence
(memory/caching_allocator.py). A step afterwards reuses those segments, so
``max_memory_reserved`` over a run that includes loading reads the higher of loading's reserve
and the step's.

``estimate_loading`` is arithmetic; ``measure_loading`` replays the same order on fake tensors
under the tracker (memory/tracking.py), with bitsandbytes' own ``quantize_4bit`` where it is
installed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..models.spec import ModelSpec
from . import caching_allocator

NF4_BLOCK, NF4_NESTED_BLOCK = 64, 256


@dataclass(frozen=True)
class Loading:
    """The loading of the checkpoint onto one GPU, before the first step (bytes)."""

    peak_allocated_bytes: int  # torch.cuda.max_memory_allocated while loading
    reserved_bytes: int  # torch.cuda.memory_reserved after loading
    weight_bytes: int  # allocated once loaded: the model's weights
    warmup_bytes: int  # caching_allocator_warmup's block
    peak_tensor: str  # the tensor being loaded at the peak ("" for the warm-up block)
    peak_moment: dict[str, int]  # bytes by category at the peak (weights, temporaries)
    source: str = "estimate"

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "reserved_bytes": self.reserved_bytes,
            "weight_bytes": self.weight_bytes,
            "warmup_bytes": self.warmup_bytes,
            "peak_tensor": self.peak_tensor,
            "peak_moment": dict(self.peak_moment),
            "source": self.source,
        }


def natural_key(name: str) -> list[tuple[Any, ...]]:
    """transformers' ``dot_natural_key``: numbers between dots compare as numbers."""
    parts: list[tuple[Any, ...]] = []
    for part in name.split("."):
        if part.isdigit():
            parts.append((0, int(part)))
        else:
            text = part.rstrip("0123456789")
            digits = part[len(text) :]
            parts.append((1, text, int(digits)) if digits else (1, text))
    return parts


def checkpoint_tensors(spec: ModelSpec, quantized: bool) -> list[tuple[str, tuple[int, ...], bool]]:
    """(name, shape as loaded, quantized on loading) of every tensor, in loading order."""
    tensors = spec.parameter_tensors()
    prefix = "transformer.h" if spec.family == "gpt2" else "model.layers"
    out = [
        (f"{prefix}.{i}.{t.name}", t.shape, quantized and t.kind == "linear")
        for i in range(spec.n_layers)
        for t in tensors.layer
    ]
    out += [(t.name, t.shape, quantized and t.kind == "linear") for t in tensors.outer]
    return sorted(out, key=lambda item: natural_key(item[0]))


def _quantize_events(name: str, numel: int, double_quant: bool) -> Iterator[tuple[str, int]]:
    """What bitsandbytes' quantize_4bit allocates (key, bytes) and frees (key, 0) on the GPU,
    in order: the kernel's packed weight and fp32 absmax, the NF4 code table; with double
    quantization the mean, the temporary ``absmax - mean``, quantize_blockwise's 8-bit absmax,
    its fp32 constants and its 8-bit map, then the temporary and the fp32 absmax freed."""
    blocks = math.ceil(numel / NF4_BLOCK)
    yield f"{name}:packed", (numel + 1) // 2
    yield f"{name}:absmax", 4 * blocks
    yield f"{name}:code", 4 * 16
    if double_quant:
        yield f"{name}:offset", 4
        yield f"{name}:centred", 4 * blocks
        yield f"{name}:qabsmax", blocks
        yield f"{name}:nested.absmax", 4 * math.ceil(blocks / NF4_NESTED_BLOCK)
        yield f"{name}:nested.code", 4 * 256
        yield f"{name}:centred", 0
        yield f"{name}:absmax", 0


def loading_events(
    spec: ModelSpec, weight_bytes: int, quantized: bool, double_quant: bool
) -> list[tuple[str, int, str]]:
    """The allocation stream of loading (key, bytes or 0 to free, tensor being loaded): the
    warm-up block, then each checkpoint tensor (and its quantization) in order."""
    tensors = checkpoint_tensors(spec, quantized)
    warmup = sum(
        math.prod(shape) // 2 if quant else weight_bytes * math.prod(shape)
        for _, shape, quant in tensors
    )
    events = [("warmup", 2 * (warmup // 2), ""), ("warmup", 0, "")]
    for name, shape, quant in tensors:
        numel = math.prod(shape)
        if not quant:
            events.append((name, weight_bytes * numel, name))
            continue
        events.append((f"{name}:copy", weight_bytes * numel, name))  # in the dtype loaded
        events += [
            (key, nbytes, name) for key, nbytes in _quantize_events(name, numel, double_quant)
        ]
        events.append((f"{name}:copy", 0, name))
    return events


def summarize(events: list[tuple[str, int, str]], source: str) -> Loading:
    """The figures of a loading stream: peaks, the allocator's replay, and the peak's moment
    (weights: what stays allocated; temporaries: what is freed later, the warm-up block among
    them)."""
    freed = {key for key, nbytes, _ in events if not nbytes}
    live: dict[str, int] = {}
    total = peak = weights_at_peak = kept = 0  # kept: the live bytes never freed later
    peak_tensor = ""
    for key, nbytes, tensor in events:
        if nbytes:
            live[key] = live.get(key, 0) + nbytes
            total += nbytes
            kept += 0 if key in freed else nbytes
        else:
            total -= live.pop(key)
        if total > peak:
            peak, peak_tensor, weights_at_peak = total, tensor, kept
    allocator = caching_allocator.replay((key, nbytes) for key, nbytes, _ in events)
    warmup = next((nbytes for key, nbytes, _ in events if key == "warmup"), 0)
    return Loading(
        peak_allocated_bytes=peak,
        reserved_bytes=allocator.reserved,
        weight_bytes=total,
        warmup_bytes=warmup,
        peak_tensor=peak_tensor,
        peak_moment={"weights": weights_at_peak, "temporaries": peak - weights_at_peak},
        source=source,
    )


def estimate_loading(spec: ModelSpec, settings: Any, buffer_bytes: int = 0) -> Loading | None:
    """The loading of ``spec`` as ``settings`` (a RunSettings) loads it: a checkpoint in the
    run's weight dtype onto one GPU, the decoder's linear layers quantized to NF4 for QLoRA;
    then the model's ``buffer_bytes`` of buffers (rotary tables), made after the weights.
    None under ZeRO-3, where each GPU loads a shard (not modelled)."""
    if settings.zero_stage == 3 and settings.n_gpus > 1:
        return None
    stored = 2 if settings.precision in ("bf16", "bf16-master") else 4
    qlora = settings.method == "qlora"
    return _estimated_loading(spec, stored, qlora, qlora and settings.double_quant, buffer_bytes)


@lru_cache(maxsize=256)
def _estimated_loading(
    spec: ModelSpec, stored: int, qlora: bool, double_quant: bool, buffer_bytes: int
) -> Loading:
    # the same for every batch and length: replayed once per model and weight format, so that
    # estimate() stays fast in a loop over batch sizes
    events = loading_events(spec, stored, qlora, double_quant)
    if buffer_bytes:
        events.append(("buffers", buffer_bytes, ""))
    return summarize(events, "estimate")


def replay_loading(spec: ModelSpec, settings: Any) -> Loading:
    """The same loading replayed on fake tensors under the tracker (memory/tracking.py): each
    tensor made in the run's dtype, each 4-bit weight quantized by bitsandbytes' own
    ``quantize_4bit`` (its fake kernels allocate what its CUDA kernels do) where bitsandbytes
    is installed, its stand-in otherwise. Needs torch."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .real_bitsandbytes import bitsandbytes, prepare_fake_bitsandbytes
    from .tracking import Tracker

    stored = torch.bfloat16 if settings.precision in ("bf16", "bf16-master") else torch.float32
    qlora = settings.method == "qlora"
    bnb = bitsandbytes() if qlora else None
    if bnb is not None:
        prepare_fake_bitsandbytes()
    tensors = checkpoint_tensors(spec, qlora)
    warmup = sum(
        math.prod(shape) // 2 if quant else stored.itemsize * math.prod(shape)
        for _, shape, quant in tensors
    )
    kept: list[Any] = []
    names: list[str] = []  # the tensor each tracker event belongs to
    tracker = Tracker()
    with FakeTensorMode(allow_non_fake_inputs=True), tracker:
        block = torch.empty(warmup // 2, dtype=torch.float16)
        del block
        for name, shape, quant in tensors:
            first = len(tracker.events)
            if not quant:
                kept.append(torch.empty(shape, dtype=stored))
            else:
                weight = torch.empty(shape, dtype=stored)  # the checkpoint's copy
                kept.append(_quantize(bnb, weight, settings.double_quant))
                del weight
            names += [name] * (len(tracker.events) - first)
    events: list[tuple[str, int, str]] = []
    # a storage's identity can be reused once it is freed: key each record by its number
    born = {r.born: (n, r) for n, r in enumerate(tracker.records)}
    died = {int(r.died): n for n, r in enumerate(tracker.records) if r.died != math.inf}
    labels = [""] * (len(tracker.events) - len(names)) + names
    for i in range(len(tracker.events)):
        if i in born:
            events.append((f"r{born[i][0]}", born[i][1].nbytes, labels[i]))
        elif i in died:
            events.append((f"r{died[i]}", 0, labels[i]))
    first_key = events[0][0] if events else ""
    events = [("warmup" if key == first_key else key, n, t) for key, n, t in events]
    return summarize(events, "replay")


def _quantize(bnb: Any, weight: Any, double_quant: bool) -> Any:
    """NF4 of ``weight`` as Params4bit._quantize does it; a stand-in of the same layout
    without bitsandbytes."""
    import torch

    if bnb is not None:
        return bnb.functional.quantize_4bit(
            weight, blocksize=NF4_BLOCK, compress_statistics=double_quant, quant_type="nf4"
        )
    numel = weight.numel()
    blocks = math.ceil(numel / NF4_BLOCK)
    packed = torch.empty((numel + 1) // 2, 1, dtype=torch.uint8)
    absmax = torch.empty(blocks, dtype=torch.float32)
    code = torch.empty(16, dtype=torch.float32)
    if not double_quant:
        return packed, absmax, code
    offset = torch.empty((), dtype=torch.float32)
    centred = torch.empty(blocks, dtype=torch.float32)
    nested = (
        torch.empty(blocks, dtype=torch.uint8),
        torch.empty(math.ceil(blocks / NF4_NESTED_BLOCK), dtype=torch.float32),
        torch.empty(256, dtype=torch.float32),
    )
    del centred, absmax
    return packed, code, offset, nested
