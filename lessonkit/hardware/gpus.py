"""The GPU catalog: memory, bandwidth, compute and price of the GPUs people fine-tune on.

Figures live in ``data/gpus.json``, each record with its source and as-of date. Lookups forgive
spelling: ``get_gpu("a100")``, ``get_gpu("A100 80GB")``, ``get_gpu("h100-sxm")`` and the names
PyTorch reports (``"NVIDIA A100-SXM4-80GB"``, ``"Tesla T4"``) all work.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from ..errors import LessonkitError, normalise_name, unknown_name_message
from ..units import GiB

# Words that vendors put in front of a device name ("NVIDIA GeForce RTX 4090", "Tesla T4").
_VENDOR_WORDS = ("nvidia", "amd", "geforce", "tesla", "instinct", "radeon")


@dataclass(frozen=True)
class Price:
    """Dollars per GPU-hour: a range seen and a typical figure, with source and date."""

    low: float
    high: float
    typical: float
    source: str = ""
    as_of: str = ""

    @classmethod
    def from_dict(
        cls, data: dict[str, Any] | None, source: str = "", as_of: str = ""
    ) -> Price | None:
        if not data:
            return None
        return cls(
            low=float(data["low"]),
            high=float(data["high"]),
            typical=float(data["typical"]),
            source=data.get("source", source),
            as_of=data.get("as_of", as_of),
        )

    def __str__(self) -> str:
        if self.high == 0:
            return "free"
        if self.low == self.high:
            return f"${self.typical:.2f}/h"
        return f"${self.low:.2f}-{self.high:.2f}/h (typical ${self.typical:.2f})"


@dataclass(frozen=True)
class GPU:
    """One GPU model of the catalog.

    ``memory_gb`` is the datasheet figure. GPU memory comes in binary sizes, so it is read as GiB:
    an "80 GB" A100 has 80 GiB (81920 MiB) of memory chips and ``memory_bytes`` is
    ``memory_gb * 2**30``. ``usable_bytes`` is what one device offers to PyTorch
    (``total_memory``: less ECC and what the driver reserves), the figure a run's peak must fit in.
    """

    name: str
    vendor: str
    architecture: str
    memory_gb: float
    memory_type: str
    bandwidth_gbs: float
    usable_memory_gib: float
    usable_memory_source: str
    bf16_tflops: float
    tflops_note: str
    native_bf16: bool
    compute_capability: str
    form_factor: str
    price_per_hour: Price | None
    in_guide: bool
    source: str
    as_of: str
    unconfirmed: tuple[str, ...] = ()
    notes: str = ""
    aliases: tuple[str, ...] = ()
    visible_devices: int = 1
    caveat: str = ""  # one line a beginner needs before renting it (ARM host, ROCm)
    current_wheels: bool = True  # current PyTorch wheels carry kernels for it
    unified_memory: bool = False  # GPU and CPU share one memory (DGX Spark): see memory_text
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def memory_bytes(self) -> int:
        """Datasheet memory in bytes, read in binary units: memory_gb * 2**30."""
        return int(self.memory_gb * GiB)

    @property
    def usable_bytes(self) -> int:
        """Memory one device offers to PyTorch, in bytes."""
        return int(self.usable_memory_gib * GiB)

    @property
    def usable_text(self) -> str:
        """The usable memory as the catalog gives it, e.g. '79.2 GiB' or '14.75 GiB'."""
        gib = self.usable_memory_gib
        return f"{gib:.1f} GiB" if round(gib, 1) == gib else f"{gib:.2f} GiB"

    @property
    def label(self) -> str:
        """E.g. 'A100 80GB (79.2 GiB usable)'."""
        return f"{self.name} ({self.usable_text} usable)"

    @property
    def memory_text(self) -> str:
        """What a run can use, said plainly: '79.2 GiB usable', or on unified memory
        '101.3 GiB usable of 128 GB unified memory shared with the CPU'."""
        if not self.unified_memory:
            return f"{self.usable_text} usable"
        return (
            f"{self.usable_text} usable of {self.memory_gb:g} GB unified memory shared with the CPU"
        )

    @property
    def unified_memory_note(self) -> str:
        """On unified memory, what 'usable' means and how to read it ('' on other GPUs)."""
        if not self.unified_memory:
            return ""
        return (
            f"On {self.name} the GPU's memory is the computer's RAM: "
            "torch.cuda.get_device_properties(0).total_memory counts the whole pool the OS, "
            "your Python process and the page cache share, so the figure a run must fit in is "
            f"what torch.cuda.mem_get_info() reports free, about {self.usable_text} on an idle "
            "machine and less with a desktop or a data loader running."
        )

    def fits(self, report: Any) -> bool:
        """True when a MemoryReport's per-GPU peak fits in one device of this GPU and current
        PyTorch wheels can run on it (not a P100: no sm_60 kernels)."""
        return self.current_wheels and int(report.total_bytes) <= self.usable_bytes

    def to_dict(self) -> dict[str, Any]:
        price = self.price_per_hour
        return {
            "name": self.name,
            "vendor": self.vendor,
            "architecture": self.architecture,
            "memory_gb": self.memory_gb,
            "memory_bytes": self.memory_bytes,
            "memory_type": self.memory_type,
            "usable_memory_gib": self.usable_memory_gib,
            "usable_bytes": self.usable_bytes,
            "usable_memory_source": self.usable_memory_source,
            "bandwidth_gbs": self.bandwidth_gbs,
            "bf16_tflops": self.bf16_tflops,
            "tflops_note": self.tflops_note,
            "native_bf16": self.native_bf16,
            "compute_capability": self.compute_capability,
            "form_factor": self.form_factor,
            "price_per_hour": None
            if price is None
            else {
                "low": price.low,
                "high": price.high,
                "typical": price.typical,
                "source": price.source,
                "as_of": price.as_of,
            },
            "in_guide": self.in_guide,
            "visible_devices": self.visible_devices,
            "caveat": self.caveat,
            "current_wheels": self.current_wheels,
            "unified_memory": self.unified_memory,
            "source": self.source,
            "as_of": self.as_of,
            "unconfirmed": list(self.unconfirmed),
            "notes": self.notes,
        }

    def __str__(self) -> str:
        price = self.price_per_hour
        return (
            f"{self.name}: {self.memory_gb:g} GB {self.memory_type} "
            f"({self.usable_text} usable), {self.bandwidth_gbs:g} GB/s, "
            f"{self.bf16_tflops:g} dense TFLOPS, "
            f"native bf16 {'yes' if self.native_bf16 else 'no'}, "
            f"CC {self.compute_capability}, {price if price else 'price n/a'}"
        )


_GPU_FIELDS = set(GPU.__dataclass_fields__) - {
    "extra",
    "price_per_hour",
    "aliases",
    "unconfirmed",
}


def _gpu_from_dict(entry: dict[str, Any]) -> GPU:
    known = {k: v for k, v in entry.items() if k in _GPU_FIELDS}
    return GPU(
        **known,
        price_per_hour=Price.from_dict(entry.get("price_per_hour")),
        aliases=tuple(entry.get("aliases", ())),
        unconfirmed=tuple(entry.get("unconfirmed", ())),
        extra={
            k: v
            for k, v in entry.items()
            if k not in _GPU_FIELDS and k not in ("price_per_hour", "aliases", "unconfirmed")
        },
    )


@lru_cache(maxsize=1)
def _catalog() -> dict[str, GPU]:
    text = resources.files("lessonkit").joinpath("data/gpus.json").read_text()
    return {entry["name"]: _gpu_from_dict(entry) for entry in json.loads(text)["gpus"]}


@lru_cache(maxsize=1)
def _keys() -> dict[str, str]:
    keys: dict[str, str] = {}
    for name, gpu in _catalog().items():
        for alias in (name, *gpu.aliases):
            keys.setdefault(normalise_name(alias), name)
    return keys


def _strip_vendor(key: str) -> str:
    changed = True
    while changed:
        changed = False
        for word in _VENDOR_WORDS:
            if key.startswith(word) and len(key) > len(word):
                key, changed = key[len(word) :], True
    return key


def list_gpus(*, in_guide: bool | None = None, vendor: str | None = None) -> list[GPU]:
    """All catalog GPUs, smallest memory first (optionally only the guide's or one vendor's)."""
    gpus = sorted(_catalog().values(), key=lambda g: (g.usable_memory_gib, g.bf16_tflops))
    if in_guide is not None:
        gpus = [g for g in gpus if g.in_guide == in_guide]
    if vendor is not None:
        gpus = [g for g in gpus if g.vendor.lower() == vendor.lower()]
    return gpus


def gpu_names() -> list[str]:
    """Catalog names, in catalog order."""
    return list(_catalog())


def find_gpu(name: str, memory_bytes: float | None = None) -> GPU | None:
    """The catalog GPU for a (device) name, or None. ``memory_bytes`` breaks ties (A100 40/80GB)."""
    if not isinstance(name, str) or not name.strip():
        return None
    keys = _keys()
    key = normalise_name(name)
    for candidate in (key, _strip_vendor(key)):
        if candidate in keys:
            found = _catalog()[keys[candidate]]
            if memory_bytes is None or not _memory_disagrees(found, memory_bytes):
                return found
    # Longest alias that the name starts with ("a100sxm480gbmig..." -> "a100sxm480gb").
    stripped = _strip_vendor(key)
    matches = sorted(
        (
            (alias, target)
            for alias, target in keys.items()
            if len(alias) >= 2
            and stripped.startswith(alias)
            and not _splits_a_number(stripped, alias)
        ),
        key=lambda item: len(item[0]),
        reverse=True,
    )
    candidates = [_catalog()[target] for _, target in matches]
    if memory_bytes is not None and candidates:
        family = _family(candidates[0].name)
        same = [g for g in _catalog().values() if _family(g.name) == family]
        best = min(same, key=lambda g: abs(g.usable_bytes - memory_bytes))
        if not _memory_disagrees(best, memory_bytes):
            return best
    return candidates[0] if candidates else None


def _splits_a_number(key: str, prefix: str) -> bool:
    # "a1000" must not match "a100": the prefix may not end in the middle of a number.
    rest = key[len(prefix) :]
    return bool(rest) and prefix[-1].isdigit() and rest[0].isdigit()


def _family(name: str) -> str:
    return name.split()[0]


def _memory_disagrees(gpu: GPU, memory_bytes: float) -> bool:
    return abs(gpu.usable_bytes - memory_bytes) > 0.15 * gpu.usable_bytes


# A device's total_memory varies a little with the driver (a T4 prints 14.74 or 14.75 GiB):
# a message's figure this close to a card's usable memory is that card (0.1%: the A100 80GB's
# 79.2 and the H100 SXM's 79.1 GiB stay apart).
SAME_CARD_SHARE = 0.001


def card_with_total(total_bytes: float) -> GPU | None:
    """The catalog card a device reporting ``total_bytes`` to PyTorch is, by its usable memory
    (within SAME_CARD_SHARE), when the cards that close all have the same figure; else None.
    Its ``usable_bytes`` is then the one figure the course gives for that device."""
    close = [
        g
        for g in _catalog().values()
        if not g.unified_memory
        and abs(g.usable_bytes - total_bytes) <= SAME_CARD_SHARE * g.usable_bytes
    ]
    if not close or len({g.usable_bytes for g in close}) > 1:
        return None
    return min(close, key=lambda g: (not g.in_guide, g.price_per_hour is None, g.name))


def get_gpu(name: str | GPU) -> GPU:
    """A catalog GPU by name, forgiving case, spaces, dashes and vendor words.

    Raises LessonkitError with close matches for an unknown name.
    """
    if isinstance(name, GPU):
        return name
    if not isinstance(name, str):
        raise LessonkitError(f"A GPU is a name such as 'A100 80GB' or 'T4', got {name!r}.")
    found = find_gpu(name)
    if found is None:
        raise LessonkitError(unknown_name_message(name, gpu_names(), "GPU"))
    return found


def memory_units_note() -> str:
    """The course's unit convention, with what a '16 GB' T4 shows to PyTorch."""
    from ..units import MEMORY_UNITS

    t4 = get_gpu("T4")
    return (
        f"{MEMORY_UNITS} A '{t4.memory_gb:g} GB' {t4.name} has {t4.memory_gb:g} GiB of chips, "
        f"of which PyTorch can allocate about {t4.usable_text} (ECC and the driver keep the "
        f"rest): a run must fit in that usable figure."
    )
