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
writes KB, MB, GB for the same binary units). A figure too large to be one (more digits than
any memory size, a GPU number or process id) is left out and named in ``OOMMessage.unreadable``.
A log of any length is read as a stream by planning/oom_logs.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .oom_logs import LogFindings, OOMLogReader

BODY_WORDS = 4000  # characters of an error's text read, its spaces folded
MAX_DIGITS = 20  # a size with more digits before its point is no memory size: unreadable
MAX_BYTES = 2**70  # nor is one above this (a zebibyte)
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
# A size starts where no digit or point precedes it, so that a run of digits is tried once.
_SIZE = r"(?<![\d.])(\d+(?:\.\d+)?)\s?(bytes|[KMGT]i?B)\b"
# torchrun's "[rank0]: " at the start of a line, repeated ("[default0]:[rank0]: "); spaces and
# tabs only, never a newline, so that each line start is tried once.
_RANK_PREFIX = re.compile(r"^[ \t]*(?:\[[A-Za-z]*\d*\]:[ \t]*)+", re.M)


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
    other_processes: list[tuple[int | None, int]] = field(default_factory=list)  # (pid, bytes)
    alloc_conf_hint: str | None = None  # what the message suggests setting
    mps_other_bytes: int | None = None
    wrapped_by: list[str] = field(default_factory=list)  # Trainer, torchrun, ...
    last_batch_size: int | None = None  # auto_find_batch_size's last try
    unreadable: list[str] = field(default_factory=list)  # figures in the text that were not read

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
        data: dict[str, Any] = {name: getattr(self, name) for name in names}
        data["unreadable"] = list(self.unreadable)
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


def whole_number(digits: str, max_digits: int) -> int | None:
    """The number a run of digits writes, or None when it has more than ``max_digits``."""
    return int(digits) if len(digits) <= max_digits else None


def _size(number: str, unit: str) -> int | None:
    """Bytes of a figure such as ('2.5', 'GiB'); None when it is too large to be a size."""
    whole = number.split(".")[0]
    if len(whole) > MAX_DIGITS:
        return None
    value = round(float(number) * _UNITS[unit.lower()])
    return value if value < MAX_BYTES else None


def _value(msg: OOMMessage, name: str, pattern: str, text: str) -> int | None:
    """The size in the first match of ``pattern`` (SIZE marks it), in bytes; a size that
    cannot be read is None, and named (``name``) in ``msg.unreadable``."""
    match = re.search(pattern.replace("SIZE", _SIZE), text)
    if match is None:
        return None
    value = _size(match.group(1), match.group(2))
    if value is None and name not in msg.unreadable:
        msg.unreadable.append(name)
    return value


def _find(msg: OOMMessage, name: str, pattern: str, text: str) -> None:
    """Set the figure ``name`` of ``msg`` from the first match of ``pattern`` (see _value)."""
    setattr(msg, name, _value(msg, name, pattern, text))


def exception_text(error: Any) -> str:
    """The text of an exception and the ones it was raised from (type name and message), or of
    anything else as str(); never raises."""
    parts: list[str] = []
    seen: set[int] = set()
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
    """The last out-of-memory error in ``error`` (an exception, a message, a log of any length,
    or an OOMMessage already read), or None."""
    if isinstance(error, OOMMessage):
        return error
    text = exception_text(error)
    if not isinstance(text, str) or not text:
        return None
    reader = OOMLogReader()
    reader.feed_text(text)
    return from_log(reader.close())


def read_log(pieces: Iterable[str]) -> OOMMessage | None:
    """The last out-of-memory error of a log given in pieces of text (e.g. read from a pipe)."""
    reader = OOMLogReader()
    for piece in pieces:
        reader.feed(piece)
    return from_log(reader.close())


def from_log(found: LogFindings | None) -> OOMMessage | None:
    """The OOMMessage of what a log reader found (planning/oom_logs.py), or None."""
    if found is None:
        return None
    plain = _RANK_PREFIX.sub(" ", found.body)
    message = _read(" ".join(plain[:BODY_WORDS].split()))
    message.wrapped_by = list(found.wrapped_by)
    if found.batch_tried:
        message.last_batch_size = found.last_batch_size
        if found.last_batch_size is None:
            message.unreadable.append("last_batch_size")
    return message


def _read(body: str) -> OOMMessage:
    lower = body.lower()
    if lower.startswith("mps backend out of memory"):
        msg = OOMMessage("mps", "mps", body[:600])
        _find(msg, "allocated_bytes", r"MPS allocated: SIZE", body)
        _find(msg, "mps_other_bytes", r"other allocations: SIZE", body)
        _find(msg, "total_bytes", r"max allowed: SIZE", body)
        _find(msg, "tried_bytes", r"Tried to allocate SIZE", body)
        if "PYTORCH_MPS_HIGH_WATERMARK_RATIO" in body:
            msg.alloc_conf_hint = "PYTORCH_MPS_HIGH_WATERMARK_RATIO"
        return msg
    if lower.startswith("no executable batch size"):
        return OOMMessage("cuda", "batch-search", body[:200])
    if lower.startswith("defaultcpuallocator"):
        msg = OOMMessage("cpu", "cpu", body[:300])
        _find(msg, "tried_bytes", r"you tried to allocate SIZE", body)
        return msg
    if lower.startswith("cuda error: out of memory"):
        return OOMMessage("cuda", "driver", body[:200])
    if lower.startswith("cublas_status_alloc_failed"):
        return OOMMessage("cuda", "cublas", body[:200])
    backend_match = re.search(r"\b(CUDA|HIP|XPU) out of memory", body, re.I)
    backend = backend_match.group(1).lower() if backend_match else "cuda"
    end = body.find("See documentation")
    msg = OOMMessage(backend, "bare", body[: end if end > 0 else 1200].strip())
    _find(msg, "tried_bytes", r"Tried to allocate SIZE", body)
    device = re.search(r"\bGPU (\d+)", body)
    if device:
        msg.device = whole_number(device.group(1), 6)
        if msg.device is None:
            msg.unreadable.append("device")
    if re.search(r"has a total capac", body):
        msg.wording = "pytorch-2.1+"
        _find(msg, "total_bytes", r"total capac(?:i)?ty of SIZE", body)
        _find(msg, "free_bytes", r"of which SIZE is free", body)
        _find(msg, "process_bytes", r"this process has SIZE memory in use", body)
        for pid, number, unit in re.findall(
            r"Process (\d+) has " + _SIZE + r" memory in use", body
        ):
            held = _size(number, unit)
            if held is None or whole_number(pid, 12) is None:
                msg.unreadable.append("other_processes")
            if held is not None:
                msg.other_processes.append((whole_number(pid, 12), held))
        _find(msg, "allocated_bytes", r"Of the allocated memory SIZE is allocated by PyTorch", body)
        _find(msg, "private_pool_bytes", r"with SIZE allocated in private pools", body)
        unallocated = _value(
            msg, "reserved_bytes", r"SIZE is reserved by PyTorch but unallocated", body
        )
        if msg.allocated_bytes is not None and unallocated is not None:
            msg.reserved_bytes = msg.allocated_bytes + unallocated
    elif re.search(r"total capacity;", body):
        msg.wording = "pytorch-2.0-"
        _find(msg, "total_bytes", r"SIZE total capacity", body)
        _find(msg, "allocated_bytes", r"SIZE already allocated", body)
        _find(msg, "free_bytes", r"SIZE free;", body)
        _find(msg, "reserved_bytes", r"SIZE reserved in total by PyTorch", body)
        if msg.reserved_bytes is None and "reserved_bytes" not in msg.unreadable:
            _find(msg, "reserved_bytes", r"SIZE cached\)", body)  # PyTorch 1.3 and earlier
    hint = re.search(r"(PYTORCH_(?:CUDA_|HIP_)?ALLOC_CONF=[\w:.]+)", body)
    if hint:
        msg.alloc_conf_hint = hint.group(1)
    elif "max_split_size_mb" in body:
        msg.alloc_conf_hint = "max_split_size_mb"
    return msg
