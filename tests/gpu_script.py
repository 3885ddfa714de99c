"""Load scripts/gpu_check.py as a module (it is a script, not part of the package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_gpu_check() -> ModuleType:
    module = sys.modules.get("gpu_check")
    if module is None:
        spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
        module = sys.modules["gpu_check"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module
