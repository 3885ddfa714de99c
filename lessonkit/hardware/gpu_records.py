"""What the charts and readouts read from a GPU record: sizes, usable memory, fit, labels, price.

A record may be a catalog GPU (hardware/gpus.py), a mapping or any object with the same field names;
missing fields fall back (``field``), so drawing never depends on the catalog being complete or
importable. Memory is in GiB (see charts/memory_charts.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..memory.report import MemoryReport
from ..units import GiB

# The kit's one "tight" rule: a run that fits with less than 5% of the usable memory left (95%
# or more used) is tight, since fragmentation or a longer batch can tip it into out-of-memory.
# The fit sentences, the recommender, the explorers and the health check all judge with it.
TIGHT_FRACTION = 0.05


def is_tight(peak_bytes: float, usable_bytes: float) -> bool:
    """The peak fits, with less than TIGHT_FRACTION of the usable memory left."""
    headroom = usable_bytes - peak_bytes
    return 0 <= headroom < TIGHT_FRACTION * usable_bytes


def fit_verdict(peak_bytes: float, usable_bytes: float) -> str:
    """'fits', 'fits, tight' or 'does not fit' (the one rule, see TIGHT_FRACTION)."""
    if peak_bytes > usable_bytes:
        return "does not fit"
    return "fits, tight" if is_tight(peak_bytes, usable_bytes) else "fits"


def used_text(peak_bytes: float, usable_bytes: float) -> str:
    """'97.6% used, tight' or '31.7% used': the share of the usable memory the peak takes."""
    share = peak_bytes / usable_bytes if usable_bytes > 0 else float("inf")
    text = f"{share:.1%} used"
    return text + (", tight" if is_tight(peak_bytes, usable_bytes) else "")


def field(record: Any, *names: str, default: Any = None) -> Any:
    """The first present attribute or key of ``record`` among ``names``."""
    for name in names:
        value = record.get(name) if isinstance(record, Mapping) else getattr(record, name, None)
        if value is not None:
            return value
    return default


def catalog_gpus() -> list[Any]:
    """The GPUs of lessonkit's catalog, or [] when it cannot be read."""
    try:
        from .gpus import list_gpus

        return list(list_gpus())
    except Exception:  # drawing must not depend on the catalog being importable
        return []


def gpu_memory_bytes(gpu: Any) -> float:
    value = field(gpu, "memory_bytes")
    if value is None:
        value = gpu_memory_gb(gpu) * GiB  # GPU memory comes in binary sizes: "80 GB" is 80 GiB
    return float(value)


def gpu_memory_gb(gpu: Any) -> float:
    """The size a card is sold as (80 for an "80 GB" A100)."""
    value = field(gpu, "memory_gb")
    if value is None:
        return float(field(gpu, "memory_bytes", default=0)) / GiB
    return float(value)


def gpu_usable_bytes(gpu: Any) -> float:
    """Memory one device offers to PyTorch (what a run's peak must fit in); nominal if unknown."""
    value = field(gpu, "usable_bytes")
    return float(value) if value is not None else gpu_memory_bytes(gpu)


def gpu_fits(gpu: Any, report: MemoryReport) -> bool:
    """The run's peak fits in the GPU's memory and current PyTorch wheels can run on it."""
    return bool(
        field(gpu, "current_wheels", default=True)
    ) and report.total_bytes <= gpu_usable_bytes(gpu)


def fit_note(gpu: Any, report: MemoryReport) -> str:
    """What changes on this GPU: no kernels in current wheels, or fp16 instead of bf16."""
    if not field(gpu, "current_wheels", default=True):
        return "no kernels in current PyTorch wheels"
    if field(gpu, "native_bf16", default=True) is False and "bf16" in str(
        report.settings.get("precision", "")
    ):
        return "no native bf16: runs in fp16 (same memory)"
    return ""


def usable_text(gpu: Any) -> str:
    """The usable memory as the catalog writes it ('79.2 GiB'), else computed in GiB."""
    text = field(gpu, "usable_text")
    return str(text) if text is not None else f"{gpu_usable_bytes(gpu) / GiB:.1f} GiB"


def headroom_text(gpu: Any, report: MemoryReport) -> str:
    """'+54.1 GiB free' or 'short by 1.5 GiB': the GPU's usable memory minus the run's peak."""
    room = gpu_usable_bytes(gpu) - report.total_bytes
    return f"+{room / GiB:,.1f} GiB free" if room >= 0 else f"short by {-room / GiB:,.1f} GiB"


def gpu_label(gpu: Any) -> str:
    return str(field(gpu, "short_name", "name", default="GPU"))


def price_text(gpu: Any) -> str:
    """'$0.34-0.60/h' from a GPU record's price per hour ('' when unknown)."""
    price = field(gpu, "price_per_hour")
    if price is None:
        return ""
    if isinstance(price, (int, float)):
        return f"${price:.2f}/h"
    low, high = field(price, "low"), field(price, "high")
    typical = field(price, "typical")
    if low is not None and high is not None and low != high:
        return f"${low:.2f}-{high:.2f}/h"
    value = typical if typical is not None else (low if low is not None else high)
    return f"${value:.2f}/h" if value is not None else ""
