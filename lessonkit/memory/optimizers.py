"""Optimizer state sizes and the temporaries of one optimizer step, per parameter tensor.

Sizes follow the implementations the estimate names: torch.optim.AdamW (foreach, fused,
for-loop), bitsandbytes AdamW8bit / PagedAdamW8bit (uint8 states with an fp32 absmax per 256
values; tensors under 4096 elements keep fp32 states), bitsandbytes PagedAdamW32bit (two fp32
states whatever the parameters' dtype, updated in place), torch.optim.SGD, transformers'
Adafactor (factored second moment, no first moment) and Lion (one momentum buffer).

bitsandbytes' paged optimizers (optim/optimizer.py, ``get_state_buffer``) put the state1/state2
buffers of every tensor of at least 1e5 elements in CUDA managed (unified) memory
(functional.py ``get_paged``: ``cget_managed_ptr``, i.e. cudaMallocManaged), outside torch's
caching allocator; smaller tensors' states, the 8-bit absmax and quantization maps stay in
torch's allocator. ``paged_state_bytes`` is that managed part.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# (numel, shape) of each trainable parameter tensor, repeated ``count`` times.
Tensors = Sequence[tuple[int, tuple[int, ...], int]]

OPT8_BLOCK = 256
OPT8_MIN_SIZE = 4096
OPT8_QMAPS = 2 * 256 * 4  # two shared 256-entry fp32 quantization maps
PAGED_MIN_SIZE = 100_000  # bitsandbytes pages the states of tensors of at least 1e5 elements
PAGED = ("paged-adamw-8bit", "paged-adamw-32bit")


def _adam8bit(numel: int) -> int:
    if numel < OPT8_MIN_SIZE:
        return 2 * 4 * numel
    return 2 * (numel + 4 * math.ceil(numel / OPT8_BLOCK))


def state_bytes(optimizer: str, tensors: Tensors, dtype_bytes: int, master: bool) -> int:
    """Bytes the optimizer keeps between steps for these tensors (before any sharding).

    ``dtype_bytes`` is the trainable parameters' dtype; ``master`` adds fp32 master copies of
    16-bit parameters and keeps the states in fp32 (precision "bf16-master").
    """
    total = 0
    sd = 4 if master else dtype_bytes
    big = False
    for numel, shape, count in tensors:
        each = 0
        if master and dtype_bytes != 4:
            each += 4 * numel
        if optimizer in ("adamw", "adamw-fused", "adamw-forloop"):
            each += 2 * sd * numel  # exp_avg, exp_avg_sq (the step counters stay on the CPU)
        elif optimizer in ("adamw-8bit", "paged-adamw-8bit"):
            each += _adam8bit(numel)
            big = big or numel >= OPT8_MIN_SIZE
        elif optimizer == "paged-adamw-32bit":
            each += 2 * 4 * numel  # state1, state2 in fp32 for any parameter dtype
        elif optimizer == "sgd-momentum" or optimizer == "lion":
            each += sd * numel
        elif optimizer == "adafactor":
            factored = len(shape) >= 2
            n = (math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]) if factored else numel
            each += 4 * n + 4  # fp32 (it upcasts 16-bit gradients), plus an RMS scalar
        total += each * count
    if big:
        total += OPT8_QMAPS
    return total


def paged_state_bytes(optimizer: str, tensors: Tensors) -> int:
    """Bytes of those states that a paged bitsandbytes optimizer keeps in CUDA managed memory:
    state1 and state2 of each tensor of at least 1e5 elements (0 for any other optimizer)."""
    if optimizer not in PAGED:
        return 0
    total = 0
    for numel, _, count in tensors:
        if numel < PAGED_MIN_SIZE:
            continue
        if optimizer == "paged-adamw-32bit" or numel < OPT8_MIN_SIZE:
            total += 2 * 4 * numel * count
        else:
            total += 2 * numel * count  # uint8 state1, state2 (the absmax stays in torch's pool)
    return total


def step_temporaries(optimizer: str, tensors: Tensors, dtype_bytes: int, master: bool) -> int:
    """Peak bytes the optimizer step allocates on top of weights, gradients and states."""
    if not tensors:
        return 0
    sd = 4 if master else dtype_bytes
    all_numel = sum(numel * count for numel, _, count in tensors)
    largest, shape = max((numel, shape) for numel, shape, _ in tensors)
    extra = 0
    if master and dtype_bytes != 4:
        extra = 4 * all_numel  # fp32 copies of the gradients for the master step
    if optimizer == "adamw":
        return extra + sd * all_numel  # foreach: sqrt(exp_avg_sq) for every tensor at once
    if optimizer == "adamw-forloop":
        return extra + 2 * sd * largest  # sqrt and the division, one tensor at a time
    if optimizer == "lion":
        return extra + 3 * sd * largest
    if optimizer == "adafactor":
        # fp32 copies of a 16-bit parameter and its gradient, the squared gradient and the
        # update, and the row and column factors, for the largest tensor
        upcast = 2 * 4 * largest if dtype_bytes != 4 else 0
        factors = 4 * (shape[0] + shape[-1]) if len(shape) >= 2 else 0
        return extra + upcast + 2 * 4 * largest + factors
    return extra  # fused AdamW, bitsandbytes' AdamW (8- and 32-bit), SGD: in place
