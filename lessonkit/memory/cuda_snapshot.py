"""A Timeline from a real CUDA memory snapshot (``torch.cuda.memory._snapshot()``).

Record a step on a GPU and draw it like a measured or estimated one::

    torch.cuda.memory._record_memory_history(max_entries=200_000)   # stacks="python" (default)
    ... one training step ...
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    charts.memory_timeline(timeline_from_snapshot(snapshot))

The snapshot is read as PyTorch documents it (``torch.cuda.memory._snapshot``): ``segments``
with their ``blocks`` (state ``active_allocated``, ``active_awaiting_free`` or ``inactive``) at
the moment of the snapshot, and ``device_traces``, one list per device of what the allocator did
(``alloc``, ``free_requested``, ``free_completed``, ``segment_alloc``, ...), each with ``addr``,
``size`` and the Python ``frames`` that made it. The live bytes are those allocated and not yet
free_completed (what ``torch.cuda.memory_allocated`` counts). Memory allocated before the trace
began (the weights and, in a steady state, the optimizer states) is the snapshot's allocated
total less what the trace added; it is one band, "allocated before the trace".

Each allocation's phase and category come from its frames: code under ``torch/optim`` is the
optimizer (what it keeps is optimizer state, the rest temporaries), code under
``torch/autograd`` the backward (what outlives the trace is gradients, the rest activations'
gradients, drawn as activations), anything else the forward (activations). Pass ``classify`` to
decide yourself. Pure Python: no torch needed to read a saved snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import LessonkitError
from .timeline import MAX_POINTS, Timeline, from_moments

BEFORE = "before_trace"  # the band of memory allocated before the trace began
BEFORE_LABEL = "Allocated before the trace (weights, states)"


def _frames_text(entry: Mapping[str, Any]) -> list[tuple[str, str]]:
    frames = entry.get("frames") or []
    return [
        (str(f.get("filename", "")).replace("\\", "/"), str(f.get("name", "")))
        for f in frames
        if isinstance(f, Mapping)
    ]


def default_phase(entry: Mapping[str, Any]) -> str:
    """forward, backward or optimizer, from the Python frames of an allocation."""
    frames = _frames_text(entry)
    if any("torch/optim/" in path for path, _ in frames):
        return "optimizer"
    if any(
        "torch/autograd/" in path or name in ("backward", "_engine_run_backward")
        for path, name in frames
    ):
        return "backward"
    return "forward"


def default_category(phase: str, survives: bool) -> str:
    """The category of an allocation made in ``phase``; ``survives``: still live at the end."""
    if phase == "optimizer":
        return "optimizer" if survives else "temporaries"
    if phase == "backward":
        return "gradients" if survives else "activations"
    return "activations"


def _trace(snapshot: Mapping[str, Any], device: int | None) -> tuple[int, list[Any]]:
    traces = snapshot.get("device_traces")
    if not isinstance(traces, Sequence) or not traces:
        raise LessonkitError(
            "A snapshot needs 'device_traces' (record them first with "
            "torch.cuda.memory._record_memory_history())."
        )
    if device is None:
        device = max(range(len(traces)), key=lambda i: len(traces[i] or []))
    if not 0 <= device < len(traces):
        raise LessonkitError(f"device must be between 0 and {len(traces) - 1}, got {device}.")
    return device, list(traces[device] or [])


def _allocated_now(snapshot: Mapping[str, Any], device: int) -> int:
    total = 0
    for segment in snapshot.get("segments") or []:
        if segment.get("device", device) != device:
            continue
        for block in segment.get("blocks") or []:
            if str(block.get("state", "")).startswith("active"):
                total += int(block.get("size", 0))
    return total


def timeline_from_snapshot(
    snapshot: Mapping[str, Any],
    device: int | None = None,
    classify: Callable[[Mapping[str, Any], bool], tuple[str, str]] | None = None,
    max_points: int = MAX_POINTS,
) -> Timeline:
    """The live allocated bytes of a recorded CUDA trace, by phase and category (module doc).

    ``classify(entry, survives)`` may return (phase, category) for an ``alloc`` entry;
    ``survives`` says whether it is still allocated at the end of the trace.
    """
    if not isinstance(snapshot, Mapping):
        raise LessonkitError(
            f"Expected the dict torch.cuda.memory._snapshot() returns, got "
            f"{type(snapshot).__name__}."
        )
    device, trace = _trace(snapshot, device)
    live: dict[int, tuple[int, Mapping[str, Any]]] = {}  # address -> (size, alloc entry)
    allocs: list[tuple[int, Mapping[str, Any]]] = []
    freed_before = 0  # frees of what was allocated before the trace
    for entry in trace:
        action, addr = entry.get("action"), entry.get("addr")
        if action == "alloc":
            live[addr] = (int(entry.get("size", 0)), entry)
            allocs.append((id(entry), entry))
        elif action == "free_completed":
            if addr in live:
                del live[addr]
            else:
                freed_before += int(entry.get("size", 0))
    survivors = {id(entry) for _, entry in live.values()}  # allocated, never freed
    net = sum(size for size, _ in live.values())
    before = max(0, _allocated_now(snapshot, device) - net + freed_before)
    kinds: dict[int, tuple[str, str]] = {}
    for key, entry in allocs:
        survives = key in survivors
        if classify is not None:
            kinds[key] = classify(entry, survives)
        else:
            phase = default_phase(entry)
            kinds[key] = (phase, default_category(phase, survives))
    levels: dict[str, int] = {BEFORE: before}
    owner: dict[int, tuple[int, str]] = {}  # address -> (size, category) of live allocations
    moments: list[tuple[str, dict[str, int]]] = []
    phase = "forward"
    for entry in trace:
        action, addr = entry.get("action"), entry.get("addr")
        if action == "alloc":
            phase, category = kinds[id(entry)]
            size = int(entry.get("size", 0))
            owner[addr] = (size, category)
            levels[category] = levels.get(category, 0) + size
        elif action == "free_completed":
            size, category = owner.pop(addr, (int(entry.get("size", 0)), BEFORE))
            levels[category] -= size
        else:
            continue
        moments.append((phase, dict(levels)))
    if not moments:
        raise LessonkitError(
            "The snapshot's trace has no allocations on this device: record "
            "with torch.cuda.memory._record_memory_history() before the step."
        )
    return from_moments(moments, "snapshot", max_points=max_points)
