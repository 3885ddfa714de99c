"""The health check's report: devices, problems with fix-it hints, and the verdict.

These types sit below both the check (``health``) and its probes (``probes``), which fill them.
"""

from __future__ import annotations

import html
import json
import textwrap
from dataclasses import asdict, dataclass, field
from typing import Any

from ..units import GiB
from .platforms import LOCAL, Platform

WIDTH = 100  # report lines wrap between words at this width


def wrap(line: str, width: int = WIDTH) -> str:
    """A long line broken between words, continuation lines indented under its text."""
    if len(line) <= width:
        return line
    body = line.lstrip(" ")
    indent = " " * (len(line) - len(body))
    hang = indent + ("  " if body.startswith(("- ", "[")) else "    ")
    return textwrap.fill(
        body,
        width,
        initial_indent=indent,
        subsequent_indent=hang,
        break_long_words=False,
        break_on_hyphens=False,
    )


STATUSES = ("ok", "warning", "no_gpu", "error")
SEVERITIES = ("error", "warning", "info")
SMOKE_SKIPPED = "skipped"  # Device.smoke_test with check_gpu_health(smoke_test=False)


@dataclass
class Problem:
    """Something wrong or missing, with what to do about it."""

    code: str
    severity: str  # "error", "warning" or "info"
    message: str
    hint: str

    def __str__(self) -> str:
        return f"[{self.severity}] {self.message}\n      fix: {self.hint}"


@dataclass
class Device:
    """One GPU as PyTorch (or, when PyTorch cannot, NVML) sees it."""

    index: int
    name: str
    backend: str  # "cuda", "rocm" or "mps"
    total_memory_bytes: int | None = None
    free_memory_bytes: int | None = None
    compute_capability: tuple[int, int] | None = None
    arch: str | None = None  # "sm_75" or "gfx942"
    native_bf16: bool | None = None
    tf32: bool | None = None
    multiprocessors: int | None = None
    kernels_in_wheel: bool | None = None  # the wheel has kernels for this arch
    smoke_test: str = "not run"  # "passed", "failed: ...", "skipped", "not run (...)"
    source: str = "torch"  # "torch" or "nvml"
    catalog_name: str | None = None

    @property
    def usable(self) -> bool:
        """PyTorch can run kernels on it: the smoke test passed, or was skipped on a device
        PyTorch sees whose architecture the wheel is not known to lack."""
        if self.smoke_test == "passed":
            return True
        return (
            self.smoke_test == SMOKE_SKIPPED
            and self.source == "torch"
            and self.kernels_in_wheel is not False
        )

    def label(self) -> str:
        mem = f"{self.total_memory_bytes / GiB:.1f} GiB" if self.total_memory_bytes else "? GiB"
        return f"{mem} {self.catalog_name or self.name}"


@dataclass
class HealthReport:
    """The result of ``check_gpu_health``: facts, problems with hints, and a verdict."""

    model: str = "7B"
    status: str = "no_gpu"
    backend: str = "cpu"  # "cuda", "rocm", "mps", "cpu" or "none" (no torch)
    platform: Platform = LOCAL
    versions: dict[str, str | None] = field(default_factory=dict)
    devices: list[Device] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    verdict: list[str] = field(default_factory=list)
    nvml: dict[str, Any] = field(default_factory=dict)

    # ----- convenience -------------------------------------------------------------------
    @property
    def gpus(self) -> list[Device]:
        return self.devices

    @property
    def driver_version(self) -> str | None:
        return self.versions.get("driver")

    @property
    def usable_devices(self) -> list[Device]:
        return [d for d in self.devices if d.usable]

    @property
    def has_usable_gpu(self) -> bool:
        return bool(self.usable_devices)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def add(self, code: str, severity: str, message: str, hint: str) -> None:
        if not any(p.code == code and p.message == message for p in self.problems):
            self.problems.append(Problem(code, severity, message, hint))

    def codes(self) -> list[str]:
        return [p.code for p in self.problems]

    # ----- output -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        devices = []
        for d in self.devices:
            item = asdict(d)
            item["compute_capability"] = (
                list(d.compute_capability) if d.compute_capability else None
            )
            item["usable"] = d.usable
            devices.append(item)
        return {
            "status": self.status,
            "backend": self.backend,
            "model": self.model,
            "platform": self.platform.to_dict(),
            "versions": dict(self.versions),
            "devices": devices,
            "problems": [asdict(p) for p in self.problems],
            "verdict": list(self.verdict),
            "nvml": dict(self.nvml),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def _device_lines(self) -> list[str]:
        lines = []
        for d in self.devices:
            parts = [f"[{d.index}] {d.name}"]
            if d.total_memory_bytes:
                free = (
                    f", {d.free_memory_bytes / GiB:.1f} GiB free"
                    if d.free_memory_bytes is not None
                    else ""
                )
                parts.append(f"{d.total_memory_bytes / GiB:.1f} GiB total{free}")
            if d.compute_capability:
                parts.append(
                    f"compute capability {d.compute_capability[0]}.{d.compute_capability[1]}"
                )
            elif d.arch:
                parts.append(d.arch)
            if d.native_bf16 is not None:
                parts.append(f"native bf16 {'yes' if d.native_bf16 else 'no (use fp16)'}")
            if d.tf32 is not None:
                parts.append(f"TF32 {'yes' if d.tf32 else 'no'}")
            if d.multiprocessors:
                parts.append(f"{d.multiprocessors} SMs")
            parts.append(f"smoke test {d.smoke_test}")
            if d.source != "torch":
                parts.append(f"seen by {d.source} only")
            lines.append("  " + ", ".join(parts))
        return lines or ["  none"]

    def _version_line(self) -> str:
        v = self.versions
        parts = [f"torch {v['torch']}" if v.get("torch") else "torch not installed"]
        if v.get("cuda"):
            parts.append(f"CUDA build {v['cuda']}")
        if v.get("hip"):
            parts.append(f"ROCm/HIP build {v['hip']}")
        if v.get("torch") and not v.get("cuda") and not v.get("hip"):
            parts.append("CPU-only build (no CUDA, no ROCm)")
        if v.get("driver"):
            parts.append(
                f"driver {v['driver']}"
                + (f" (CUDA {v['driver_cuda']})" if v.get("driver_cuda") else "")
            )
        elif self.nvml.get("error"):
            parts.append(f"NVML: {self.nvml['error']}")
        parts.append(f"Python {v.get('python', '?')}")
        return ", ".join(parts)

    def __str__(self) -> str:
        lines = [
            f"GPU health check: {self.status.upper()}",
            f"Where: {self.platform}",
            f"Backend: {self.backend}; {self._version_line()}",
            "Devices:",
            *self._device_lines(),
        ]
        if self.problems:
            lines.append("Problems:")
            lines += [f"  {p}" for p in self.problems]
        if self.verdict:
            lines.append(f"What you can fine-tune ({self.model}):")
            lines += [f"  - {line}" for line in self.verdict]
        return "\n".join(wrap(line) for text in lines for line in text.split("\n"))

    def _repr_html_(self) -> str:
        colour = {"ok": "#1a7f37", "warning": "#9a6700", "no_gpu": "#57606a", "error": "#cf222e"}
        esc = html.escape
        rows = "".join(f"<li>{esc(line.strip())}</li>" for line in self._device_lines())
        problems = "".join(
            f"<li><b>{esc(p.severity)}</b>: {esc(p.message)}<br><i>Fix:</i> {esc(p.hint)}</li>"
            for p in self.problems
        )
        verdict = "".join(f"<li>{esc(line)}</li>" for line in self.verdict)
        return (
            f"<div class='lessonkit-health'><b style='color:{colour.get(self.status, '#000')}'>"
            f"GPU health check: {esc(self.status.upper())}</b><br>"
            f"<small>Where: {esc(str(self.platform))}<br>Backend: {esc(self.backend)}; "
            f"{esc(self._version_line())}</small><p>Devices:</p><ul>{rows}</ul>"
            + (f"<p>Problems:</p><ul>{problems}</ul>" if problems else "")
            + (
                f"<p>What you can fine-tune ({esc(self.model)}):</p><ul>{verdict}</ul>"
                if verdict
                else ""
            )
            + "</div>"
        )
