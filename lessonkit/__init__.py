"""lessonkit: the helper package of the GPU Survival Guide course.

Importing it is cheap: torch, transformers and matplotlib are imported only by the functions
that need them.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

# Public name -> module that defines it; loaded on first use.
_EXPORTS = {
    "ModelSpec": "models", "get_preset": "models", "preset_names": "models",
    "resolve_model": "models",
    "MemoryReport": "report",
    "LessonkitError": "errors",
    "estimate": "vram",
    "measure": "measuring",
    "check_gpu_health": "health",
    "get_gpu": "gpus", "list_gpus": "gpus",
    "get_environment": "environments", "list_environments": "environments",
    "recommend": "recommender",
    "oom_doctor": "oom",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lessonkit' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__

