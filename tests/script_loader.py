"""Load the repository's scripts and tools (scripts/, tools/) as modules: they are files to run,
not part of the package, and several tests call their functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative_path: str) -> ModuleType:
    """A fresh module from ``relative_path`` (e.g. 'tools/present.py'), named after its file and
    registered in sys.modules under that name before it runs (dataclasses look it up there)."""
    path = ROOT / relative_path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = sys.modules[path.stem] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_gpu_check() -> ModuleType:
    """scripts/gpu_check.py, loaded once and shared (its tests patch it through sys.modules)."""
    module = sys.modules.get("gpu_check")
    if module is None:
        module = sys.modules["gpu_check"] = load_script("scripts/gpu_check.py")
    return module
