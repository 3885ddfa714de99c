"""ZeRO-3 as FSDP1 for measure(): PyTorch's ``FullyShardedDataParallel`` on a simulated process
group, wrapped as the usual transformer auto-wrap policy does it (one unit per decoder layer,
plus the root), with ``use_orig_params=True`` and the defaults of torch's FSDP1 otherwise
(FULL_SHARD, ``BackwardPrefetch.BACKWARD_PRE``, ``forward_prefetch=False``,
``limit_all_gathers=True``).

Private, and needs torch: used by standins.Parallel inside measure() only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


def wrap(model: nn.Module, param_dtype: torch.dtype | None) -> nn.Module:
    """``model`` wrapped in FSDP1: each decoder layer (the modules of the model's ModuleLists)
    one unit, the rest (embeddings, final norm, lm_head) the root's. With ``param_dtype``
    (the "-mixed" precisions) FSDP1's ``MixedPrecision(param_dtype, reduce_dtype=fp32)``."""
    import warnings

    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    layer_classes = {
        type(layer)
        for module in model.modules()
        if isinstance(module, nn.ModuleList)
        for layer in module
    }
    mixed = (
        MixedPrecision(param_dtype=param_dtype, reduce_dtype=torch.float32)
        if param_dtype is not None
        else None
    )
    with warnings.catch_warnings():  # FSDP1's deprecation notice; frozen and trained tensors mixed
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", UserWarning)
        return FullyShardedDataParallel(
            model,
            auto_wrap_policy=ModuleWrapPolicy(layer_classes),
            use_orig_params=True,
            mixed_precision=mixed,
            device_id=torch.device("cpu"),
        )


def handles(model: nn.Module) -> list[Any]:
    """The flat-parameter handle of every FSDP1 unit of ``model``."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return [
        unit._handle
        for unit in FullyShardedDataParallel.fsdp_modules(model)
        if unit._handle is not None
    ]


def local_shards(model: nn.Module) -> list[torch.Tensor]:
    """This rank's shard of each flat parameter (in the parameters' dtype): the weights. Before
    the first forward (FSDP1's lazy init) the flat parameter is its shard."""
    flat = [handle.flat_param for handle in handles(model)]
    return [getattr(param, "_local_shard", param) for param in flat]


def trainable_parameters(model: nn.Module) -> int:
    """The trained tensors' elements, counted whole (a rank's views hold only its part)."""
    import math

    total = 0
    for handle in handles(model):
        flat = handle.flat_param
        for param, shape in zip(flat._params, flat._shapes, strict=True):
            total += math.prod(shape) if param.requires_grad else 0
    return total


def flat_gradients(model: nn.Module) -> list[torch.Tensor]:
    """Each flat parameter's gradient: sharded after a synchronised backward, unsharded (the
    whole unit's, frozen tensors included) while no_sync accumulates."""
    return [h.flat_param.grad for h in handles(model) if h.flat_param.grad is not None]


class NoSync:
    """FSDP1's ``no_sync()`` entered before a micro-batch that does not reduce, left before
    the one that does."""

    def __init__(self) -> None:
        self.context: Any = None

    def set(self, model: nn.Module, synchronize: bool) -> None:
        if not synchronize and self.context is None:
            self.context = model.no_sync()  # type: ignore[operator]
            self.context.__enter__()
        elif synchronize and self.context is not None:
            self.context.__exit__(None, None, None)
            self.context = None


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors share a storage, by the storage itself: FSDP1 compares data
    pointers, which are all 0 under FakeTensorMode."""
    from torch.distributed.tensor import DTensor

    a, b = (t._local_tensor if isinstance(t, DTensor) else t for t in (a, b))
    return bool(a.untyped_storage()._cdata == b.untyped_storage()._cdata)


def _catch_all_reshard(state: Any) -> None:
    """FSDP1's end-of-backward reshard of a unit whose post-backward hook did not run (a unit
    without gradients: LoRA's frozen root), with the check that it is still gathered made on
    the storage (``_runtime_utils._catch_all_reshard`` compares data pointers)."""
    from torch.distributed.fsdp import _runtime_utils

    handle = state._handle
    if not handle:
        return
    resharded = (
        _same_storage(handle.flat_param, handle.flat_param._local_shard)
        and not handle._skipped_use_sharded_views
    )
    if not resharded:
        free = _runtime_utils._should_free_in_backward(state, handle)
        _runtime_utils._reshard(state, handle, free)


@contextlib.contextmanager
def tracked() -> Iterator[None]:
    """FSDP1 as a real run would behave, under the tracker and FakeTensorMode: what it
    allocates to gather a unit and to reduce its gradient labelled temporaries (the gathered
    flat parameter, the low-precision shard, the reduce-scatter buffers), and its checks of
    shared storage made on the storage rather than on data pointers."""
    from torch.distributed.fsdp import _flat_param, _runtime_utils
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    from .tracking import label

    def labelled(method: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with label("temporaries"):
                return method(*args, **kwargs)

        return wrapper

    replaced: list[tuple[Any, str, Any]] = []
    for owner, name in [
        (FlatParamHandle, "pre_unshard"),
        (FlatParamHandle, "unshard"),
        (_runtime_utils, "_reduce_grad"),
    ]:
        replaced.append((owner, name, labelled(getattr(owner, name))))
    replaced.append((_flat_param, "_same_storage", _same_storage))
    replaced.append((_runtime_utils, "_catch_all_reshard", _catch_all_reshard))
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in replaced]
    for owner, name, new in replaced:
        setattr(owner, name, new)
    try:
        yield
    finally:
        for owner, name, method in originals:
            setattr(owner, name, method)
