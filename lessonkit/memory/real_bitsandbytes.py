"""bitsandbytes itself in measure(): its 4-bit layers on the GPU, or on CPU under FakeTensorMode.

bitsandbytes 0.50 runs ``Linear4bit`` (NF4) forward and backward and its 8-bit optimizers on
CPU, also on fake tensors, with two helps from here: the packed weight is made by
``bitsandbytes.functional.quantize_4bit`` on the fake weight and carries its QuantState as a
``Params4bit`` would (a tensor subclass cannot wrap a fake tensor), and the 8-bit quantization
maps, which bitsandbytes builds from Python values, are built outside FakeTensorMode.

Private, and needs torch: imported only by measure() through standins.py.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

NF4_BLOCK = 64


def bitsandbytes() -> Any:
    """The bitsandbytes module where it is installed and imports, else None. From 0.45 its
    4-bit layers and 8-bit optimizers run on CPU too (0.50.2 also under FakeTensorMode)."""
    import logging
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
            import bitsandbytes as bnb
    except Exception:  # not installed, or no binary for this platform
        return None
    return bnb


def quant_state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """The constants bitsandbytes keeps beside each 4-bit weight (absmax, code tables)."""
    out = []
    for module in model.modules():
        state = getattr(getattr(module, "weight", None), "quant_state", None)
        if state is None:
            continue
        nested = getattr(state, "state2", None)
        for t in (
            state.absmax,
            state.code,
            getattr(state, "offset", None),
            getattr(nested, "absmax", None),
            getattr(nested, "code", None),
        ):
            if isinstance(t, torch.Tensor):
                out.append(t)
    return out


def _fake_bnb_linear4bit(
    bnb: Any,
    child: nn.Module,
    in_f: int,
    out_f: int,
    compute_dtype: torch.dtype,
    double_quant: bool,
) -> nn.Module:
    """bitsandbytes Linear4bit (NF4) on fake CPU tensors: ``child``'s weight, in the compute
    dtype (as a 16-bit checkpoint is loaded), quantized by ``bitsandbytes.functional``; the
    packed weight carries its QuantState as a Params4bit does."""
    import bitsandbytes.functional as F

    weight = child.weight.detach()
    if weight.shape != (out_f, in_f):  # transformers' Conv1D stores the transpose
        weight = weight.t().contiguous()
    packed, state = F.quantize_4bit(
        weight.to(compute_dtype),
        blocksize=NF4_BLOCK,
        compress_statistics=double_quant,
        quant_type="nf4",
    )
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # the module itself (its placeholder weight) is not fake
        layer = bnb.nn.Linear4bit(
            in_f,
            out_f,
            bias=False,
            compute_dtype=compute_dtype,
            compress_statistics=double_quant,
            quant_type="nf4",
            device="meta",
        )
    layer.weight = nn.Parameter(packed, requires_grad=False)
    layer.weight.quant_state = state
    if child.bias is not None:
        layer.bias = nn.Parameter(child.bias.detach(), requires_grad=False)
    return layer


_QMAPS: dict[tuple[Any, ...], torch.Tensor] = {}


def prepare_fake_bitsandbytes() -> None:
    """bitsandbytes builds its 8-bit quantization maps from Python values (``tolist``), which
    fake tensors cannot give: build each map outside FakeTensorMode (same values)."""
    import bitsandbytes.functional as F
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    original = getattr(F.create_dynamic_map, "__wrapped__", F.create_dynamic_map)

    def create_dynamic_map(
        signed: bool = True, max_exponent_bits: int = 7, total_bits: int = 8
    ) -> torch.Tensor:
        key = (signed, max_exponent_bits, total_bits)
        if key not in _QMAPS:
            with unset_fake_temporarily():
                _QMAPS[key] = original(signed, max_exponent_bits, total_bits)
        return _QMAPS[key]

    create_dynamic_map.__wrapped__ = original  # type: ignore[attr-defined]
    F.create_dynamic_map = create_dynamic_map
    if "dynamic" not in F.name2qmap:
        F.name2qmap["dynamic"] = create_dynamic_map()


def _bnb_linear4bit(
    bnb: Any,
    child: nn.Module,
    in_f: int,
    out_f: int,
    compute_dtype: torch.dtype,
    double_quant: bool,
) -> nn.Module:
    """bitsandbytes Linear4bit (NF4) holding ``child``'s weight, quantized on its GPU."""
    weight = child.weight.detach()
    if weight.shape != (out_f, in_f):  # transformers' Conv1D stores the transpose
        weight = weight.t().contiguous()
    layer = bnb.nn.Linear4bit(
        in_f,
        out_f,
        bias=child.bias is not None,
        compute_dtype=compute_dtype,
        compress_statistics=double_quant,
        quant_type="nf4",
        device="meta",
    )
    layer.weight = bnb.nn.Params4bit(
        weight.cpu(), requires_grad=False, quant_type="nf4", compress_statistics=double_quant
    ).to(child.weight.device)
    if child.bias is not None:
        layer.bias = nn.Parameter(child.bias.detach(), requires_grad=False)
    return layer
