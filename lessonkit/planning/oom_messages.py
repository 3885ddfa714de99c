"""Reading the out-of-memory messages PyTorch prints, in every wording it has used.

``parse_oom`` takes an exception, a message, a traceback or a whole log and returns an
``OOMMessage`` with the figures of the last out-of-memory error in it, or None when it finds
none. The wordings (from PyTorch's c10/cuda/CUDACachingAllocator.cpp and its MPS allocator):

- PyTorch 2.1 and later, CUDA: "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total
  capacity of 14.75 GiB of which 1.04 GiB is free. [Process 123 has 1.0 GiB memory in use.]
  [Including non-PyTorch memory, this process has 13.7 GiB memory in use.] Of the allocated
  memory 13.4 GiB is allocated by PyTorch, [with X allocated in private pools (e.g., CUDA
  Graphs),] and 197 MiB is reserved by PyTorch but unallocated. If reserved but unallocated
  memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ..." (2.1 spelled
  "capacty" and suggested max_split_size_mb; the process lines need NVML, so ROCm and Windows
  have none);
- ROCm: the same with "HIP out of memory" (and PYTORCH_HIP_ALLOC_CONF in some releases);
- PyTorch 2.0 and earlier: "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total
  capacity; 14.56 GiB already allocated; 3.12 MiB free; 14.74 GiB reserved in total by PyTorch)";
- Apple MPS: "MPS backend out of memory (MPS allocated: ..., other allocations: ..., max allowed:
  ...). Tried to allocate ... on private pool.";
- with no figures: "CUDA error: out of memory" (the driver, outside the caching allocator),
  CUBLAS_STATUS_ALLOC_FAILED, and accelerate's "No executable batch size found, reached zero."
  (Trainer(auto_find_batch_size=True) after halving the batch down to nothing).
Sizes are printed by PyTorch's format_size in binary units (KiB, MiB, GiB; the MPS allocator
writes KB, MB, GB for the same binary units).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

MAX_TEXT = 2_000_000  # characters of a log read (its end, where the last error is)
_UNITS = {
    "bytes": 1,
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 2**10,
    "mb": 2**20,
    "gb": 2**30,
    "tb": 2**40,
}
_SIZE = r"(\d+(?:\.\d+)?)\s?(bytes|[KMGT]i?B)\b"
_ANCHOR = re.compile(
    r"(CUDA|HIP|XPU) out of memory|MPS backend out of memory|CUDA error: out of memory|"
    r"CUBLAS_STATUS_ALLOC_FAILED|No executable batch size found, reached zero|"
    r"DefaultCPUAllocator: can't allocate memory|OutOfMemoryError",
    re.I,
)
_RANK_PREFIX = re.compile(r"^(?:\s*\[[A-Za-z]*\d*\]:)+", re.M)  # torchrun's "[rank0]: "


@dataclass
class OOMMessage:
    """The figures of one out-of-memory error (bytes; None where the message does not say)."""

    backend: str  # "cuda", "hip", "xpu", "mps", "cpu"
    wording: str  # see WORDINGS
    text: str  # the error's sentence(s), as read
    tried_bytes: int | None = None
    device: int | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    process_bytes: int | None = None  # this process, including non-PyTorch memory
    allocated_bytes: int | None = None  # allocated by PyTorch (tensors)
    reserved_bytes: int | None = None  # reserved by PyTorch's caching allocator
    private_pool_bytes: int | None = None  # CUDA graphs' pools (newer wording)
    other_processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, bytes)
    alloc_conf_hint: str | None = None  # what the message suggests setting
    mps_other_bytes: int | None = None
    wrapped_by: list[str] = field(default_factory=list)  # Trainer, torchrun, ...
    last_batch_size: int | None = None  # auto_find_batch_size's last try

    @property
    def reserved_unallocated_bytes(self) -> int | None:
        if self.reserved_bytes is None or self.allocated_bytes is None:
            return None
        return max(0, self.reserved_bytes - self.allocated_bytes)

    @property
    def used_bytes(self) -> int | None:
        """Memory in use on the device, by every process (total minus free)."""
        if self.total_bytes is None or self.free_bytes is None:
            return None
        return max(0, self.total_bytes - self.free_bytes)

    def to_dict(self) -> dict[str, Any]:
        names = (
            "backend",
            "wording",
            "tried_bytes",
            "device",
            "total_bytes",
            "free_bytes",
            "process_bytes",
            "allocated_bytes",
            "reserved_bytes",
            "private_pool_bytes",
            "alloc_conf_hint",
            "mps_other_bytes",
            "wrapped_by",
            "last_batch_size",
        )
        data = {name: getattr(self, name) for name in names}
        data["reserved_unallocated_bytes"] = self.reserved_unallocated_bytes
        data["other_processes"] = [list(p) for p in self.other_processes]
        return data


WORDINGS = {
    "pytorch-2.1+": "PyTorch 2.1 or later",
    "pytorch-2.0-": "PyTorch 2.0 or earlier",
    "mps": "PyTorch on Apple MPS",
    "driver": "the CUDA driver (no figures)",
    "cublas": "cuBLAS (no figures)",
    "batch-search": "Trainer(auto_find_batch_size=True) / accelerate (no figures)",
    "cpu": "the CPU allocator (the computer's RAM, not the GPU's)",
    "bare": "an out-of-memory error without figures",
}


def _size(number: str, unit: str) -> int:
    return int(round(float(number) * _UNITS[unit.lower()]))


def _find(pattern: str, text: str) -> int | None:
    match = re.search(pattern.replace("SIZE", _SIZE), text)
    return None if match is None else _size(match.group(1), match.group(2))


def exception_text(error: Any) -> str:
    """The text of an exception and the ones it was raised from (type name and message), or of
    anything else as str(); never raises."""
    parts, seen = [], set()
    while isinstance(error, BaseException) and id(error) not in seen and len(parts) < 6:
        seen.add(id(error))
        try:
            parts.append(f"{type(error).__module__}.{type(error).__qualname__}: {error}")
        except Exception:
            parts.append(type(error).__qualname__)
        error = error.__cause__ or error.__context__
    if parts:
        return "\n".join(reversed(parts))
    if isinstance(error, bytes):
        return error.decode("utf-8", "replace")
    try:
        return str(error)
    except Exception:
        return ""


def parse_oom(error: Any) -> OOMMessage | None:
    """The last out-of-memory error in ``error`` (an exception, a message, a log), or None."""
    text = exception_text(error)
    if not isinstance(text, str) or not text:
        return None
    text = text[-MAX_TEXT:]
    plain = _RANK_PREFIX.sub(" ", text)
    anchors = list(_ANCHOR.finditer(plain))
    if not anchors:
        return None
    # the last error that names its kind; a bare "OutOfMemoryError" only when none does
    named = [a for a in anchors if a.group(0).lower() != "outofmemoryerror"]
    start = (named or anchors)[-1].start()
    body = " ".join(plain[start : start + 4000].split())
    found = _read(body)
    found.wrapped_by = _wrappers(text)
    tries = re.findall(r"Decreasing batch size to:? (\d+)", text)
    if tries:
        found.last_batch_size = int(tries[-1])
    return found


def _read(body: str) -> OOMMessage:
    lower = body.lower()
    if lower.startswith("mps backend out of memory"):
        msg = OOMMessage("mps", "mps", body[:600])
        msg.allocated_bytes = _find(r"MPS allocated: SIZE", body)
        msg.mps_other_bytes = _find(r"other allocations: SIZE", body)
        msg.total_bytes = _find(r"max allowed: SIZE", body)
        msg.tried_bytes = _find(r"Tried to allocate SIZE", body)
        if "PYTORCH_MPS_HIGH_WATERMARK_RATIO" in body:
            msg.alloc_conf_hint = "PYTORCH_MPS_HIGH_WATERMARK_RATIO"
        return msg
    if lower.startswith("no executable batch size"):
        return OOMMessage("cuda", "batch-search", body[:200])
    if lower.startswith("defaultcpuallocator"):
        msg = OOMMessage("cpu", "cpu", body[:300])
        tried = re.search(r"you tried to allocate (\d+) bytes", body)
        msg.tried_bytes = int(tried.group(1)) if tried else None
        return msg
    if lower.startswith("cuda error: out of memory"):
        return OOMMessage("cuda", "driver", body[:200])
    if lower.startswith("cublas_status_alloc_failed"):
        return OOMMessage("cuda", "cublas", body[:200])
    backend_match = re.search(r"\b(CUDA|HIP|XPU) out of memory", body, re.I)
    backend = backend_match.group(1).lower() if backend_match else "cuda"
    end = body.find("See documentation")
    msg = OOMMessage(backend, "bare", body[: end if end > 0 else 1200].strip())
    msg.tried_bytes = _find(r"Tried to allocate SIZE", body)
    device = re.search(r"\bGPU (\d+)", body)
    msg.device = int(device.group(1)) if device else None
    if re.search(r"has a total capac", body):
        msg.wording = "pytorch-2.1+"
        msg.total_bytes = _find(r"total capac(?:i)?ty of SIZE", body)
        msg.free_bytes = _find(r"of which SIZE is free", body)
        msg.process_bytes = _find(r"this process has SIZE memory in use", body)
        msg.other_processes = [
            (int(pid), _size(n, u))
            for pid, n, u in re.findall(r"Process (\d+) has " + _SIZE + r" memory in use", body)
        ]
        msg.allocated_bytes = _find(r"Of the allocated memory SIZE is allocated by PyTorch", body)
        msg.private_pool_bytes = _find(r"with SIZE allocated in private pools", body)
        unallocated = _find(r"SIZE is reserved by PyTorch but unallocated", body)
        if msg.allocated_bytes is not None and unallocated is not None:
            msg.reserved_bytes = msg.allocated_bytes + unallocated
    elif re.search(r"total capacity;", body):
        msg.wording = "pytorch-2.0-"
        msg.total_bytes = _find(r"SIZE total capacity", body)
        msg.allocated_bytes = _find(r"SIZE already allocated", body)
        msg.free_bytes = _find(r"SIZE free;", body)
        msg.reserved_bytes = _find(r"SIZE reserved in total by PyTorch", body)
        if msg.reserved_bytes is None:
            msg.reserved_bytes = _find(r"SIZE cached\)", body)  # PyTorch 1.3 and earlier
    hint = re.search(r"(PYTORCH_(?:CUDA_|HIP_)?ALLOC_CONF=[\w:.]+)", body)
    if hint:
        msg.alloc_conf_hint = hint.group(1)
    elif "max_split_size_mb" in body:
        msg.alloc_conf_hint = "max_split_size_mb"
    return msg


def _wrappers(text: str) -> list[str]:
    found = []
    if re.search(r"transformers[/\\]trainer\.py|_inner_training_loop|Trainer\.train\b", text):
        found.append("Trainer")
    if re.search(r"No executable batch size found|find_executable_batch_size", text):
        found.append("auto_find_batch_size")
    if re.search(r"\[rank\d+\]:|ChildFailedError", text):
        found.append("torchrun")
    return found
