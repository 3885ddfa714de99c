"""One training step's memory: estimated by arithmetic (``estimate``) and measured on a real
PyTorch step (``measure``), both as a ``MemoryReport`` with its ``Timeline``.

Layer 2 of lessonkit: imports the basics and ``lessonkit.models``, never the layers above it.
torch is imported only by the measuring modules, inside the functions that need it.
"""

from .cuda_snapshot import timeline_from_snapshot
from .estimating import estimate
from .measuring import measure
from .report import CATEGORIES, LABELS, PHASES, MemoryReport, phase_words
from .timeline import Timeline

__all__ = [
    "CATEGORIES",
    "LABELS",
    "PHASES",
    "MemoryReport",
    "Timeline",
    "estimate",
    "measure",
    "phase_words",
    "timeline_from_snapshot",
]
