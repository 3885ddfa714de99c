"""The probes behind the health check: NVML, torch's CUDA/ROCm/MPS backends, one tiny kernel.

Each probe fills a HealthReport and turns known failures into Problems with fix-it hints; the
caller (health.check_gpu_health) catches anything unexpected.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from typing import Any

from ..units import GB, GiB
from .report import SMOKE_SKIPPED, Device, HealthReport

TORCH_INSTALL = "https://pytorch.org/get-started/locally/"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ----- NVML ---------------------------------------------------------------------------------
_NVML_ERRORS = {
    "NVMLError_LibraryNotFound": "no NVIDIA driver found (libnvidia-ml.so is missing)",
    "NVMLError_DriverNotLoaded": "the NVIDIA driver is installed but not loaded",
    "NVMLError_LibRmVersionMismatch": "driver/library version mismatch (driver updated without a reboot)",
    "NVMLError_FunctionNotFound": "this NVML library lacks a function nvidia-ml-py needs (old driver)",
    "NVMLError_NoPermission": "no permission to query the GPU through NVML",
}
# NVML failures that mean a driver is installed but cannot be used: the problem's code and fix.
_NVML_BROKEN_DRIVER = {
    "NVMLError_LibRmVersionMismatch": (
        "nvml_mismatch",
        "Reboot the machine: the NVIDIA driver was updated but the old kernel module is still "
        "loaded (or unload and reload the nvidia kernel modules).",
    ),
    "NVMLError_DriverNotLoaded": (
        "driver_not_loaded",
        "Load the kernel module (`sudo modprobe nvidia`, or reboot); if that fails, `sudo dmesg | "
        "grep -i nvidia` says why: often Secure Boot refusing an unsigned module (enroll its key "
        "or turn Secure Boot off), or a driver built for another kernel (reinstall it for this "
        "one).",
    ),
    "NVMLError_NoPermission": (
        "nvml_no_permission",
        "Give this user access to the GPU device files (/dev/nvidia*: add the user to the group "
        "that owns them, often `video`, and log in again); in a container, start it with the "
        "GPUs passed in (`docker run --gpus all`, the NVIDIA Container Toolkit).",
    ),
}


def probe_nvml(report: HealthReport) -> None:
    """Driver version and per-GPU memory through NVML, without creating a CUDA context."""
    try:
        import pynvml
    except ImportError:
        report.nvml = {"available": False, "error": "nvidia-ml-py is not installed"}
        return
    try:
        pynvml.nvmlInit()
    except Exception as err:
        kind = type(err).__name__
        report.nvml = {
            "available": False,
            "error": _NVML_ERRORS.get(kind, f"{kind}: {err}"),
            "error_kind": kind,
        }
        if kind in _NVML_BROKEN_DRIVER:  # a driver is there, but broken: not "no driver"
            report.nvml.update(driver_broken=True, fix=_NVML_BROKEN_DRIVER[kind][1])
        return
    try:
        info: dict[str, Any] = {"available": True, "devices": []}
        report.versions["driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
        try:
            cuda = int(pynvml.nvmlSystemGetCudaDriverVersion())
            report.versions["driver_cuda"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        except Exception:
            pass
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            info["devices"].append(
                {
                    "index": i,
                    "name": _text(pynvml.nvmlDeviceGetName(handle)),
                    "total": int(mem.total),
                    "free": int(mem.free),
                    "used": int(mem.used),
                }
            )
        report.nvml = info
    except Exception as err:
        kind = type(err).__name__
        report.nvml = {
            "available": False,
            "error": _NVML_ERRORS.get(kind, f"{kind}: {err}"),
            "error_kind": kind,
        }
        if kind in _NVML_BROKEN_DRIVER:
            report.nvml.update(driver_broken=True, fix=_NVML_BROKEN_DRIVER[kind][1])
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _nvml_gpus(report: HealthReport) -> list[dict[str, Any]]:
    return list(report.nvml.get("devices", [])) if report.nvml.get("available") else []


# ----- torch --------------------------------------------------------------------------------
def probe_torch(report: HealthReport, *, smoke_test: bool = True) -> None:
    """Versions, backend and devices as torch sees them, turning each known failure into a hint."""
    try:
        import torch
    except ImportError as err:
        report.backend = "none"
        report.add(
            "no_torch",
            "error",
            f"PyTorch is not installed ({err}).",
            f"Install it: `pip install torch` (pick the command for your system at {TORCH_INSTALL}).",
        )
        return
    except Exception as err:  # e.g. OSError: a CUDA library of the wheel fails to load
        report.backend = "none"
        report.add(
            "torch_import_failed",
            "error",
            f"PyTorch is installed but fails to import: {type(err).__name__}: {err}",
            "Reinstall it in a fresh environment (`pip install --force-reinstall torch`); "
            "mixing pip and conda CUDA libraries or LD_LIBRARY_PATH overrides are common causes.",
        )
        return
    version = getattr(torch, "version", None)
    report.versions.update(
        torch=str(getattr(torch, "__version__", "?")),
        cuda=getattr(version, "cuda", None),
        hip=getattr(version, "hip", None),
    )
    if report.versions["hip"]:
        report.backend = "rocm"
    elif report.versions["cuda"]:
        report.backend = "cuda"
    else:
        report.backend = "cpu"
        if _mps(report, torch, smoke_test):
            return
        _cpu_only_wheel(report)
        return
    _cuda(report, torch, smoke_test)


def _cpu_only_wheel(report: HealthReport) -> None:
    nvml = _nvml_gpus(report)
    if nvml:
        names = ", ".join(sorted({d["name"] for d in nvml}))
        report.add(
            "cpu_only_wheel",
            "error",
            f"This PyTorch ({report.versions['torch']}) is a CPU-only build, but the NVIDIA driver "
            f"{report.versions.get('driver', '')} sees {len(nvml)} GPU(s): {names}.",
            "Install a CUDA build of PyTorch with the pip command from the selector at "
            f"{TORCH_INSTALL} (`--index-url https://download.pytorch.org/whl/cuXXX`): "
            "its CUDA version must not exceed what the driver supports, CUDA "
            f"{report.versions.get('driver_cuda', '?')}.",
        )
        for d in nvml:
            report.devices.append(
                Device(
                    index=d["index"],
                    name=d["name"],
                    backend="cuda",
                    total_memory_bytes=d["total"],
                    free_memory_bytes=d["free"],
                    source="nvml",
                    smoke_test="not run (CPU-only PyTorch)",
                )
            )
        return
    if report.nvml.get("driver_broken"):
        return  # review_devices reports the broken driver with its fix
    report.add(
        "no_gpu",
        "info",
        f"No GPU: this PyTorch ({report.versions['torch']}) is a CPU-only build and "
        f"{_nvml_finding(report)}.",
        _no_gpu_hint(report),
    )


def _nvml_finding(report: HealthReport) -> str:
    """What NVML said about the driver, for a report of no GPU."""
    if report.nvml.get("available"):
        return "NVML sees no GPU"
    if report.nvml.get("error_kind") == "NVMLError_LibraryNotFound":
        return "no NVIDIA driver was found"
    return f"NVML could not look for a GPU ({report.nvml.get('error', 'not run')})"


def _no_gpu_hint(report: HealthReport) -> str:
    from ..hardware.environments import get_environment

    for key in report.platform.environments:
        hint = get_environment(key).hints.get("no_gpu")
        if hint:
            return hint
    return (
        "Training on CPU is far too slow for LLMs: use a free T4 on Google Colab or Kaggle, "
        "or rent a GPU (see the verdict below for what fits and what it costs)."
    )


def _mps(report: HealthReport, torch: Any, smoke_test: bool) -> bool:
    mps = getattr(getattr(torch, "backends", None), "mps", None)
    try:
        available = bool(mps is not None and mps.is_available())
    except Exception:
        available = False
    if not available:
        return False
    report.backend = "mps"
    total = None
    with contextlib.suppress(Exception):
        total = int(torch.mps.recommended_max_memory())
    device = Device(
        index=0,
        name="Apple MPS (unified memory)",
        backend="mps",
        total_memory_bytes=total,
        native_bf16=None,
        arch="mps",
    )
    device.smoke_test = _smoke(torch, "mps") if smoke_test else SMOKE_SKIPPED
    report.devices.append(device)
    report.add(
        "mps",
        "warning",
        "Apple MPS backend: no CUDA, so bitsandbytes QLoRA, fused optimizers and FlashAttention "
        "are unavailable, and memory is shared with the system (the calculator's CUDA figures "
        "are a guide only).",
        "Fine-tune small models (up to about 3B) with LoRA in fp16/bf16 on `device='mps'` "
        "(bf16 needs macOS 14 or later); for 7B and larger use a free Colab/Kaggle T4 or rent "
        "a CUDA GPU.",
    )
    return True


_CUDA_FAILURES = (
    # (code, pattern in torch's warning/error text, message, hint)
    (
        "fork",
        r"re-initialize CUDA in forked subprocess",
        "CUDA was initialised before this process forked: CUDA cannot be used in a forked child.",
        "Use the 'spawn' start method (`multiprocessing.set_start_method('spawn')`, or "
        "`torch.multiprocessing.spawn`), or don't touch CUDA in the parent before forking "
        "(e.g. DataLoader workers must not use CUDA).",
    ),
    (
        "driver_too_old",
        r"driver on your system is too old",
        "The NVIDIA driver is too old for this PyTorch's CUDA build.",
        "Update the NVIDIA driver to one that supports CUDA {cuda} (NVIDIA's CUDA release notes "
        "list the minimum driver), or install a PyTorch build for a CUDA version this driver "
        f"supports: pick it in the selector at {TORCH_INSTALL} (its `--index-url` names the CUDA "
        "version; older PyTorch releases cover older CUDA versions).",
    ),
    (
        "cuda_unknown_error",
        r"unknown error",
        "CUDA reported 'unknown error' when starting.",
        "Restart the Python process (kernel/runtime). Common causes: CUDA_VISIBLE_DEVICES changed after "
        "CUDA started, a GPU lost after suspend, or a driver in a bad state (check `nvidia-smi`; "
        "reboot if it fails too).",
    ),
    (
        "no_driver",
        r"no NVIDIA driver|NVIDIA driver on your system|libcuda",
        "PyTorch found no NVIDIA driver.",
        "Install the NVIDIA driver (and reboot), or switch to a GPU runtime.",
    ),
)


def _classify(text: str, cuda: str | None) -> tuple[str, str, str] | None:
    for code, pattern, message, hint in _CUDA_FAILURES:
        if re.search(pattern, text, re.I):
            return code, message, hint.format(cuda=cuda or "?")
    return None


def _cuda(report: HealthReport, torch: Any, smoke_test: bool) -> None:
    cuda = torch.cuda
    texts: list[str] = []
    try:
        if getattr(cuda, "_is_in_bad_fork", lambda: False)():
            texts.append("Cannot re-initialize CUDA in forked subprocess")
    except Exception:
        pass
    available = False
    if not texts:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                available = bool(cuda.is_available())
            except Exception as err:
                texts.append(str(err))
        texts += [str(w.message) for w in caught]
    if available:
        try:
            cuda.init()
        except Exception as err:
            available = False
            texts.append(str(err))
    if not available:
        if not texts:
            try:
                cuda.init()  # gives the reason is_available() keeps to itself
            except Exception as err:
                texts.append(str(err))
        _cuda_unavailable(report, " ".join(texts))
        return
    try:
        count = int(cuda.device_count())
    except Exception as err:
        _cuda_unavailable(report, str(err))
        return
    for i in range(count):
        report.devices.append(_device(report, torch, i, smoke_test))


def _cuda_unavailable(report: HealthReport, text: str) -> None:
    nvml = _nvml_gpus(report)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    found = _classify(text, report.versions.get("cuda"))
    if found and found[0] == "no_driver" and not nvml:
        found = None
    if found:
        code, message, hint = found
        detail = f" ({text.strip()[:300]})" if text.strip() else ""
        report.add(code, "error", message + detail, hint)
    elif nvml and visible is not None and visible.strip() in ("", "-1"):
        report.add(
            "cuda_hidden",
            "error",
            f"CUDA_VISIBLE_DEVICES={visible!r} hides all {len(nvml)} GPU(s) that NVML sees.",
            "Unset CUDA_VISIBLE_DEVICES (or list the GPUs to use) before starting Python.",
        )
    elif nvml:
        report.add(
            "cuda_unavailable",
            "error",
            f"NVML sees {len(nvml)} GPU(s) but PyTorch cannot use them"
            + (f": {text.strip()[:300]}" if text.strip() else "."),
            "Check `nvidia-smi`, that the driver supports this PyTorch's CUDA "
            f"{report.versions.get('cuda')}, and restart the Python process.",
        )
    elif not report.nvml.get("driver_broken"):  # a broken driver: review_devices reports it
        report.add(
            "no_gpu",
            "info",
            "No GPU: PyTorch has CUDA support but found no NVIDIA GPU or driver on this machine.",
            _no_gpu_hint(report),
        )
    for d in nvml:
        report.devices.append(
            Device(
                index=d["index"],
                name=d["name"],
                backend=report.backend,
                total_memory_bytes=d["total"],
                free_memory_bytes=d["free"],
                source="nvml",
                smoke_test="not run (CUDA unavailable)",
            )
        )


def _device(report: HealthReport, torch: Any, i: int, smoke_test: bool) -> Device:
    cuda = torch.cuda
    props = cuda.get_device_properties(i)
    device = Device(
        index=i,
        name=str(props.name),
        backend=report.backend,
        total_memory_bytes=int(props.total_memory),
        multiprocessors=getattr(props, "multi_processor_count", None),
    )
    major, minor = int(props.major), int(props.minor)
    gcn = getattr(props, "gcnArchName", None)
    if report.backend == "rocm" and gcn:
        device.arch = str(gcn).split(":")[0]
        # bf16 matrix cores: CDNA (MI100 gfx908 and later) and RDNA 3/4 (gfx11xx, gfx12xx)
        device.native_bf16 = device.arch.startswith(
            ("gfx908", "gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")
        )
    else:
        device.compute_capability = (major, minor)
        device.arch = f"sm_{major}{minor}"
        device.native_bf16 = (major, minor) >= (8, 0)
        device.tf32 = (major, minor) >= (8, 0)
    try:
        free, _total = cuda.mem_get_info(i)
        device.free_memory_bytes = int(free)
    except Exception as err:
        report.add(
            "mem_get_info",
            "warning",
            f"GPU {i}: cannot read free memory ({err}).",
            "Restart the Python process; if it persists check `nvidia-smi`.",
        )
    try:
        device.kernels_in_wheel = _kernels_in_wheel(device.arch, list(cuda.get_arch_list()))
    except Exception:
        device.kernels_in_wheel = None
    device.smoke_test = _smoke(torch, f"cuda:{i}") if smoke_test else SMOKE_SKIPPED
    try:
        from ..hardware.gpus import find_gpu

        found = find_gpu(device.name, device.total_memory_bytes)
        device.catalog_name = found.name if found else None
    except Exception:
        pass
    return device


def _kernels_in_wheel(arch: str | None, arch_list: list[str]) -> bool | None:
    """Whether a wheel built for ``arch_list`` runs kernels on ``arch`` (None: cannot tell)."""
    if not arch or not arch_list:
        return None
    if arch.startswith("gfx"):
        return any(a.split(":")[0] == arch for a in arch_list)
    cap = int(arch[3:])
    for entry in arch_list:
        kind, _, number = entry.partition("_")
        if not number.isdigit():
            continue
        built = int(number)
        # sm_XY cubins run on the same major with minor >= Y; compute_XY PTX is JIT-compiled upward.
        if kind == "sm" and built // 10 == cap // 10 and built <= cap:
            return True
        if kind == "compute" and built <= cap:
            return True
    return False


def _smoke(torch: Any, device: str) -> str:
    """Run one tiny matmul on ``device``: 'passed' or 'failed: <reason>'."""
    try:
        a = torch.ones((64, 64), device=device)
        value = float((a @ a).sum().item())
        if value != 64.0**3:
            return f"failed: wrong result {value:g} (expected {64**3})"
        return "passed"
    except Exception as err:
        first_line = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        return f"failed: {type(err).__name__}: {first_line}"


# ----- after the probes ---------------------------------------------------------------------
def _no_kernel_hint(report: HealthReport, d: Device) -> str:
    from ..hardware.environments import get_environment

    hint = (
        f"This PyTorch ({report.versions.get('torch')}) has no kernels for {d.arch}. "
        f"Install a wheel whose `torch.cuda.get_arch_list()` includes {d.arch}, or use a "
        "newer GPU."
    )
    for key in report.platform.environments:
        hint = get_environment(key).hints.get("no_kernel_image", hint)
    return hint


def review_devices(report: HealthReport) -> None:
    """Problems that need all the facts: kernels, smoke tests, memory in use, mixed GPUs, NVML."""
    torch_devices = [d for d in report.devices if d.source == "torch"]
    for d in torch_devices:
        if d.smoke_test.startswith("failed") and "no kernel image" in d.smoke_test:
            report.add(
                "no_kernel_image",
                "error",
                f"GPU {d.index} ({d.name}, {d.arch}) cannot run PyTorch kernels: "
                "'no kernel image is available for execution on the device'.",
                _no_kernel_hint(report, d),
            )
        elif d.smoke_test.startswith("failed"):
            report.add(
                "smoke_test_failed",
                "error",
                f"GPU {d.index} ({d.name}) failed a one-kernel test: {d.smoke_test[8:]}",
                "Restart the Python process; check `nvidia-smi` for errors (Xid) and other "
                "processes; reboot if it persists.",
            )
        elif d.kernels_in_wheel is False and d.smoke_test == SMOKE_SKIPPED:
            report.add(
                "no_kernel_image",
                "error",
                f"GPU {d.index} ({d.name}, {d.arch}) is not among this PyTorch's "
                "architectures (torch.cuda.get_arch_list()): its kernels would fail with 'no "
                "kernel image is available for execution on the device' (smoke test skipped).",
                _no_kernel_hint(report, d),
            )
        elif d.kernels_in_wheel is False:
            report.add(
                "arch_not_in_wheel",
                "warning",
                f"GPU {d.index} ({d.arch}) is not in this wheel's architectures; kernels may be "
                "JIT-compiled slowly or fail later.",
                "Install a PyTorch build that lists this architecture in torch.cuda.get_arch_list().",
            )
        elif d.smoke_test == SMOKE_SKIPPED:
            report.add(
                "smoke_test_skipped",
                "info",
                f"GPU {d.index} ({d.name}): smoke test skipped, so it counts as usable "
                "without a kernel having run on it.",
                "Run the check with the smoke test (the default) to run one tiny kernel "
                "on each GPU.",
            )
        if d.total_memory_bytes and d.free_memory_bytes is not None:
            used = d.total_memory_bytes - d.free_memory_bytes
            if used > 0.1 * d.total_memory_bytes + 1 * GiB:
                report.add(
                    "memory_in_use",
                    "warning",
                    f"GPU {d.index}: {used / GB:.1f} GB of {d.total_memory_bytes / GB:.1f} GB is "
                    "already in use (other processes, or this one's tensors and cache).",
                    "Free it: stop other notebooks/processes (`nvidia-smi` lists them), `del` "
                    "old models and run `torch.cuda.empty_cache()`, or restart the kernel.",
                )
    kinds = {(d.name, d.total_memory_bytes) for d in torch_devices}
    if len(kinds) > 1:
        report.add(
            "mixed_gpus",
            "warning",
            f"{len(torch_devices)} GPUs of different kinds: "
            + ", ".join(sorted({d.name for d in torch_devices}))
            + ".",
            "Multi-GPU training runs at the pace (and memory) of the smallest GPU: set "
            "CUDA_VISIBLE_DEVICES to GPUs of one kind.",
        )
    nvml = _nvml_gpus(report)
    if torch_devices and len(nvml) > len(torch_devices):
        report.add(
            "gpus_hidden",
            "info",
            f"NVML sees {len(nvml)} GPUs; PyTorch uses {len(torch_devices)} "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}).",
            "Intended? Otherwise unset or widen CUDA_VISIBLE_DEVICES before starting Python.",
        )
    kind = report.nvml.get("error_kind")
    if report.backend == "cuda" and torch_devices:
        if kind == "NVMLError_LibRmVersionMismatch":
            report.add(
                "nvml_mismatch",
                "warning",
                f"NVML: {report.nvml['error']}; nvidia-smi and NVML-based tools fail.",
                "Reboot so the loaded kernel module matches the installed driver.",
            )
        elif report.nvml.get("error") == "nvidia-ml-py is not installed":
            report.add(
                "nvml_missing",
                "info",
                "nvidia-ml-py is not installed: the driver version is unknown.",
                "`pip install nvidia-ml-py` (or `pip install lessonkit[gpu]`).",
            )
        elif report.nvml.get("error"):
            report.add(
                "nvml_failed",
                "info",
                f"NVML: {report.nvml['error']}.",
                "The check used PyTorch alone; update the driver or nvidia-ml-py if you need "
                "NVML-based tools (nvidia-smi, gpustat).",
            )
    elif report.nvml.get("driver_broken") and kind in _NVML_BROKEN_DRIVER:
        code, fix = _NVML_BROKEN_DRIVER[kind]
        report.add(
            code,
            "error",
            f"An NVIDIA driver is installed but does not work, so no GPU can be used: NVML "
            f"says {report.nvml['error']}.",
            fix,
        )
