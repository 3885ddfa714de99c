"""The machine you are on: its GPUs, drivers and platform, checked without a traceback
(``check_gpu_health``), and what it can fine-tune; a stand-in ``torch`` to try a GPU check as if
on a T4 (``fake_torch``).

Layer 5 of lessonkit: imports the basics, models, memory, hardware and planning.
"""

from .check import Device, HealthReport, Problem, check_gpu_health
from .fake_torch import fake_torch, run_with_fake_torch
from .platforms import Platform, detect_platform

__all__ = [
    "Device",
    "HealthReport",
    "Platform",
    "Problem",
    "check_gpu_health",
    "detect_platform",
    "fake_torch",
    "run_with_fake_torch",
]
