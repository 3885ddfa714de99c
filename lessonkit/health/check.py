"""The GPU health check: what this machine has, what is wrong with it, and what it can fine-tune.

``check_gpu_health()`` never raises. Each probe is wrapped: a missing torch, a CPU-only wheel, an
old driver, "CUDA unknown error", a wheel without kernels for the GPU, a missing or mismatched
NVML, Apple MPS or several GPUs each end up as a report with a status and a fix-it hint.

Memory comes from ``torch.cuda.get_device_properties(i).total_memory`` and
``torch.cuda.mem_get_info(i)`` (free as the driver sees it, other processes included; this creates
a CUDA context). There is no ``torch.cuda.get_total_memory``. Native bf16 is compute capability
>= 8.0: ``torch.cuda.is_bf16_supported()`` says True on a T4 through emulation. The driver version
is read through NVML (``pynvml`` from nvidia-ml-py), which creates no CUDA context.
"""

from __future__ import annotations

import platform as _pyplatform
import warnings
from collections.abc import Callable
from typing import Any

from ..errors import safe_text
from ..safe_repr import describe_error
from . import probes
from .platforms import detect_platform
from .report import SEVERITIES, SMOKE_SKIPPED, STATUSES, Device, HealthReport, Problem
from .verdict import health_verdict

__all__ = [
    "SEVERITIES",
    "SMOKE_SKIPPED",
    "STATUSES",
    "Device",
    "HealthReport",
    "Problem",
    "check_gpu_health",
    "describe_error",
    "safe_text",
]


# ----- the check ----------------------------------------------------------------------------
def check_gpu_health(model: Any = "7B", *, smoke_test: bool = True) -> HealthReport:
    """Check this machine's GPUs and say what ``model`` can be fine-tuned on them. Never raises."""
    try:
        return _check(model, smoke_test)
    except Exception as err:  # the last line of defence: a report, never a traceback
        report = HealthReport(model=safe_text(model, name=True), status="error")
        report.add(
            "check_failed",
            "error",
            f"The health check failed: {describe_error(err)}",
            "Please report this with the output of `python -m torch.utils.collect_env`.",
        )
        return report


def _check(model: Any, smoke_test: bool) -> HealthReport:
    report = HealthReport(model=safe_text(model, name=True))
    report.versions["python"] = _pyplatform.python_version()
    steps: tuple[tuple[str, Callable[[], object]], ...] = (
        ("platform", lambda: setattr(report, "platform", detect_platform())),
        ("nvml", lambda: probes.probe_nvml(report)),
        ("torch", lambda: probes.probe_torch(report, smoke_test=smoke_test)),
        ("devices", lambda: probes.review_devices(report)),
    )
    for name, step in steps:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                step()
        except Exception as err:  # a probe must never take the whole check down
            report.add(
                "check_failed",
                "warning",
                f"The {name} probe failed: {describe_error(err)}",
                "Please report this with the output of `python -m torch.utils.collect_env`.",
            )
    report.status = _status(report)
    try:
        report.verdict = health_verdict(report, model)
    except Exception as err:
        report.verdict = [f"No verdict: {describe_error(err)}"]
    return report


def _status(report: HealthReport) -> str:
    severities = {p.severity for p in report.problems}
    if report.has_usable_gpu:
        return "warning" if severities & {"error", "warning"} else "ok"
    return "error" if "error" in severities else "no_gpu"
