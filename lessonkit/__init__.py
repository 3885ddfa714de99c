"""lessonkit: the helper package of the GPU Survival Guide course.

Its subpackages are layers, each importing only from those before it:

    models -> memory -> hardware -> planning -> health -> charts -> widgets -> exercises -> cli

with the small shared pieces (``errors``, ``units``, ``options``, ``safe_repr``) at the top of
the package. See docs/architecture.md.

Importing it is cheap: the subpackages load on first use, and torch, transformers and
matplotlib are imported only by the functions that need them.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

# Public name -> the subpackage that exports it; loaded on first use.
_EXPORTS = {
    "ModelSpec": "models",
    "get_preset": "models",
    "preset_names": "models",
    "resolve_model": "models",
    "usual_recipe": "models",
    "MemoryReport": "memory",
    "estimate": "memory",
    "measure": "memory",
    "phase_words": "memory",
    "LessonkitError": "errors",
    "get_gpu": "hardware",
    "list_gpus": "hardware",
    "get_environment": "hardware",
    "list_environments": "hardware",
    "recommend": "planning",
    "oom_doctor": "planning",
    "check_gpu_health": "health",
}
# Subpackages and shared modules reachable as attributes after a plain ``import lessonkit``.
_SUBMODULES = (
    "models",
    "memory",
    "hardware",
    "planning",
    "health",
    "charts",
    "widgets",
    "exercises",
    "cli",
    "errors",
    "units",
    "options",
)

__all__ = [*sorted(_EXPORTS), "__version__"]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return import_module(f".{name}", __name__)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lessonkit' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(__all__) | set(_SUBMODULES))
