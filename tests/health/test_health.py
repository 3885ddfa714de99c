"""The health check on this machine and under every simulated failure (fake torch and pynvml)."""

from __future__ import annotations

import json
import sys
import types
from types import SimpleNamespace

import pytest

import lessonkit.health.check as health
from lessonkit import check_gpu_health, get_gpu
from lessonkit.health.platforms import LOCAL, Platform, detect_platform
from lessonkit.health.probes import TORCH_INSTALL, _kernels_in_wheel
from lessonkit.units import GiB

# A T4 as PyTorch reports it: the catalog's usable memory (total_memory), not the box's 16 GB.
T4 = dict(
    name="Tesla T4",
    total_memory=get_gpu("T4").usable_bytes,
    major=7,
    minor=5,
    multi_processor_count=40,
)
A100 = dict(
    name="NVIDIA A100-SXM4-80GB",
    total_memory=int(79.15 * GiB),
    major=8,
    minor=0,
    multi_processor_count=108,
)
P100 = dict(
    name="Tesla P100-PCIE-16GB",
    total_memory=int(15.9 * GiB),
    major=6,
    minor=0,
    multi_processor_count=56,
)
WHEEL_ARCHS = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]
NO_KERNEL = "CUDA error: no kernel image is available for execution on the device"


class FakeTensor:
    def __init__(self, n: int, value: float, fail: str | None):
        self.n, self.value, self.fail = n, value, fail

    def __matmul__(self, other: FakeTensor) -> FakeTensor:
        if self.fail:
            raise RuntimeError(self.fail)
        return FakeTensor(self.n, self.value * other.value * self.n, None)

    def sum(self) -> FakeTensor:
        return FakeTensor(1, self.value * self.n * self.n, None)

    def item(self) -> float:
        return self.value


def fake_torch(
    devices=(),
    *,
    cuda="12.6",
    hip=None,
    available=None,
    warning=None,
    init_error=None,
    smoke_error=None,
    arch_list=WHEEL_ARCHS,
    bad_fork=False,
    mps=False,
    free_fraction=0.97,
) -> types.ModuleType:
    """A stand-in for torch with exactly the attributes the health check uses."""
    devices = [SimpleNamespace(**d) for d in devices]
    available = bool(devices) if available is None else available

    def is_available():
        if warning:
            import warnings

            warnings.warn(warning, UserWarning, stacklevel=2)
        return available

    def init():
        if init_error:
            raise RuntimeError(init_error)
        if not available and cuda:
            raise RuntimeError("Found no NVIDIA driver on your system.")

    torch = types.ModuleType("torch")
    torch.__version__ = f"2.13.0+cu{cuda.replace('.', '')}" if cuda else "2.13.0+cpu"
    torch.version = SimpleNamespace(cuda=cuda, hip=hip)
    torch.cuda = SimpleNamespace(
        is_available=is_available,
        init=init,
        device_count=lambda: len(devices),
        get_device_properties=lambda i: devices[i],
        mem_get_info=lambda i=0: (
            int(devices[i].total_memory * free_fraction),
            devices[i].total_memory,
        ),
        get_arch_list=lambda: list(arch_list),
        _is_in_bad_fork=lambda: bad_fork,
        get_total_memory=None,  # never called: it does not exist in real torch
    )
    torch.backends = SimpleNamespace(mps=SimpleNamespace(is_available=lambda: mps))
    torch.mps = SimpleNamespace(recommended_max_memory=lambda: 21 * GiB)
    torch.ones = lambda shape, device=None: FakeTensor(shape[0], 1.0, smoke_error)
    return torch


def fake_pynvml(devices=(), *, init_error=None, driver="550.54.15", cuda_driver=12040):
    """A stand-in for pynvml: NVML errors are classes named like nvidia-ml-py's."""
    nvml = types.ModuleType("pynvml")
    for name in (
        "NVMLError_LibraryNotFound",
        "NVMLError_LibRmVersionMismatch",
        "NVMLError_DriverNotLoaded",
        "NVMLError_NoPermission",
    ):
        setattr(nvml, name, type(name, (Exception,), {}))

    def init():
        if init_error:
            raise getattr(nvml, init_error)("NVML failed")

    nvml.nvmlInit = init
    nvml.nvmlShutdown = lambda: None
    nvml.nvmlSystemGetDriverVersion = lambda: driver
    nvml.nvmlSystemGetCudaDriverVersion = lambda: cuda_driver
    nvml.nvmlDeviceGetCount = lambda: len(devices)
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetName = lambda h: devices[h]["name"].encode()
    nvml.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(
        total=int(devices[h]["total_memory"] * 1.01),
        free=devices[h]["total_memory"],
        used=int(devices[h]["total_memory"] * 0.01),
    )
    return nvml


@pytest.fixture
def machine(monkeypatch):
    """Install a fake torch/pynvml and platform; returns a function that runs the check."""

    def run(
        torch=None,
        nvml=None,
        platform=LOCAL,
        model="7B",
        no_torch=False,
        no_nvml=False,
        smoke_test=True,
    ):
        monkeypatch.setitem(sys.modules, "torch", None if no_torch else torch)
        monkeypatch.setitem(sys.modules, "pynvml", None if no_nvml else nvml)
        monkeypatch.setattr(health, "detect_platform", lambda: platform)
        return check_gpu_health(model, smoke_test=smoke_test)

    return run


KAGGLE = Platform("kaggle", "Kaggle Notebooks", ("env KAGGLE_KERNEL_RUN_TYPE",), ("kaggle",))
COLAB = Platform("colab", "Google Colab", ("module google.colab",), ("colab-free", "colab-paid"))


# ----- this machine -----------------------------------------------------------------------
def test_this_machine_gives_a_report_that_says_what_to_do_next():
    report = check_gpu_health()
    assert report.status in health.STATUSES
    text = " ".join(str(report).split())
    if not report.has_usable_gpu:
        assert report.status in ("no_gpu", "error")
        assert "T4" in text and "QLoRA" in text  # what the free GPU can do, from the calculator
    json.loads(report.to_json())
    assert "<div" in report._repr_html_()


# ----- simulated machines -----------------------------------------------------------------
def test_healthy_t4_on_colab(machine):
    report = machine(fake_torch([T4]), fake_pynvml([T4]), platform=COLAB)
    assert report.status == "ok", report.problems
    (d,) = report.devices
    assert d.total_memory_bytes == T4["total_memory"] and d.compute_capability == (7, 5)
    assert d.native_bf16 is False and d.tf32 is False and d.multiprocessors == 40
    assert d.smoke_test == "passed" and d.kernels_in_wheel is True and d.catalog_name == "T4"
    assert report.driver_version == "550.54.15" and report.versions["driver_cuda"] == "12.4"
    assert report.platform.key == "colab"


def test_no_torch(machine):
    report = machine(no_torch=True, nvml=fake_pynvml(init_error="NVMLError_LibraryNotFound"))
    assert report.status == "error" and report.backend == "none"
    assert "no_torch" in report.codes()
    assert "pip install torch" in report.problems[0].hint


def test_cpu_only_wheel_without_gpu_is_no_gpu_with_next_steps(machine):
    report = machine(fake_torch(cuda=None), fake_pynvml(init_error="NVMLError_LibraryNotFound"))
    assert report.status == "no_gpu" and report.codes() == ["no_gpu"]
    assert "CPU-only" in report.problems[0].message
    assert "Colab" in report.problems[0].hint


def test_no_gpu_on_colab_says_how_to_switch_the_runtime(machine):
    report = machine(
        fake_torch(cuda="12.6"), fake_pynvml(init_error="NVMLError_LibraryNotFound"), platform=COLAB
    )
    assert report.status == "no_gpu"
    assert "Change runtime type" in report.problems[0].hint


def test_cpu_only_wheel_on_a_gpu_machine_is_an_error_naming_the_gpu(machine):
    report = machine(fake_torch(cuda=None), fake_pynvml([A100]))
    assert report.status == "error" and "cpu_only_wheel" in report.codes()
    problem = report.problems[0]
    assert "A100" in problem.message and "download.pytorch.org/whl/cu" in problem.hint
    assert TORCH_INSTALL in problem.hint and "12.4" in problem.hint  # the driver's CUDA
    assert report.devices[0].source == "nvml" and not report.has_usable_gpu


def test_driver_too_old(machine):
    warning = (
        "CUDA initialization: The NVIDIA driver on your system is too old (found version 11040)."
    )
    report = machine(
        fake_torch(cuda="12.8", available=False, warning=warning, init_error=warning),
        fake_pynvml([T4], cuda_driver=11040),
    )
    assert report.status == "error" and "driver_too_old" in report.codes()
    problem = next(p for p in report.problems if p.code == "driver_too_old")
    assert "12.8" in problem.hint and "found version 11040" in problem.message
    # No CUDA tag that current PyTorch releases no longer publish: the selector picks one.
    assert "cu118" not in problem.hint and TORCH_INSTALL in problem.hint
    assert report.devices and report.devices[0].source == "nvml"


def test_cuda_unknown_error(machine):
    text = "CUDA unknown error - this may be due to an incorrectly set up environment"
    report = machine(
        fake_torch(cuda="12.6", available=False, warning=text, init_error=text), fake_pynvml([A100])
    )
    assert report.status == "error" and "cuda_unknown_error" in report.codes()
    assert "CUDA_VISIBLE_DEVICES" in report.problems[0].hint


def test_fork_reinit_error(machine):
    report = machine(fake_torch([T4], bad_fork=True), fake_pynvml([T4]))
    assert report.status == "error" and "fork" in report.codes()
    assert "spawn" in report.problems[0].hint


def test_kaggle_p100_without_kernels(machine):
    torch = fake_torch([P100], smoke_error=NO_KERNEL)
    report = machine(torch, fake_pynvml([P100]), platform=KAGGLE)
    assert report.status == "error"
    (d,) = report.devices
    assert d.kernels_in_wheel is False and d.smoke_test.startswith("failed")
    problem = next(p for p in report.problems if p.code == "no_kernel_image")
    assert "sm_60" in problem.message and "T4 x2" in problem.hint


def test_nvml_missing_is_only_information(machine):
    report = machine(fake_torch([A100]), no_nvml=True)
    assert report.status == "ok" and report.codes() == ["nvml_missing"]
    assert "nvidia-ml-py" in report.problems[0].hint and report.driver_version is None


def test_nvml_mismatch_with_working_cuda_is_a_warning_to_reboot(machine):
    report = machine(fake_torch([A100]), fake_pynvml(init_error="NVMLError_LibRmVersionMismatch"))
    assert report.status == "warning" and "nvml_mismatch" in report.codes()
    assert "Reboot" in report.problems[0].hint


def test_apple_mps(machine):
    report = machine(fake_torch(cuda=None, mps=True), no_nvml=True)
    assert report.backend == "mps" and report.status == "warning"
    assert report.devices[0].smoke_test == "passed" and report.has_usable_gpu
    assert "QLoRA" in report.problems[0].message


def test_two_t4_on_kaggle_are_both_reported_and_used_in_the_verdict(machine):
    report = machine(fake_torch([T4, T4]), fake_pynvml([T4, T4]), platform=KAGGLE)
    assert report.status == "ok" and len(report.devices) == 2
    assert any("2 x" in line for line in report.verdict), report.verdict


def test_mixed_gpus_and_memory_in_use_are_warnings(machine):
    report = machine(fake_torch([A100, T4], free_fraction=0.5), fake_pynvml([A100, T4]))
    assert report.status == "warning"
    assert {"mixed_gpus", "memory_in_use"} <= set(report.codes())


def test_rocm_device(machine):
    mi300 = dict(
        name="AMD Instinct MI300X",
        total_memory=int(191.5 * GiB),
        major=9,
        minor=4,
        multi_processor_count=304,
        gcnArchName="gfx942:sramecc+:xnack-",
    )
    report = machine(
        fake_torch([mi300], cuda=None, hip="6.4", arch_list=["gfx90a", "gfx942"]),
        fake_pynvml(init_error="NVMLError_LibraryNotFound"),
    )
    assert report.backend == "rocm" and report.status == "ok", report.problems
    d = report.devices[0]
    assert (
        d.arch == "gfx942" and d.kernels_in_wheel and d.native_bf16 and d.catalog_name == "MI300X"
    )


def test_torch_that_fails_to_import(machine, monkeypatch):
    def broken_import(name, *args, **kwargs):
        if name == "torch":
            raise OSError("libcudnn.so.9: cannot open shared object file")
        return real_import(name, *args, **kwargs)

    import builtins

    real_import = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", broken_import)
    report = machine(fake_torch([T4]), fake_pynvml([T4]))
    assert report.status == "error" and "torch_import_failed" in report.codes()
    assert "libcudnn" in report.problems[0].message and "Reinstall" in report.problems[0].hint


def test_a_probe_that_blows_up_still_gives_a_report(machine):
    torch = fake_torch([T4])
    torch.cuda.get_device_properties = lambda i: 1 / 0
    report = machine(torch, fake_pynvml([T4]))
    assert "check_failed" in report.codes() and report.status == "no_gpu"


def test_bad_model_gives_a_verdict_line_not_an_exception(machine):
    report = machine(fake_torch([T4]), fake_pynvml([T4]), model="no-such-model")
    assert report.status == "ok" and "no-such-model" in " ".join(report.verdict)


def test_the_verdict_on_a_t4_follows_from_the_calculator(machine):
    report = machine(fake_torch([T4]), fake_pynvml([T4]))
    text = " ".join(report.verdict)
    assert "QLoRA" in text and "fits" in text and "full fine-tuning" in text


def test_outputs_are_complete(machine):
    report = machine(fake_torch([T4]), fake_pynvml([T4]), platform=COLAB)
    data = json.loads(report.to_json())
    assert data["status"] == "ok" and data["devices"][0]["compute_capability"] == [7, 5]
    text = str(report)
    assert max(len(line) for line in text.splitlines()) <= 100  # wrapped between words
    assert not any(line.endswith(("-", "_")) for line in text.splitlines())
    text = " ".join(text.split())
    assert f"{T4['total_memory'] / GiB:.1f} GiB total" in text
    assert "native bf16 no" in text and "Google Colab" in text
    assert "Tesla T4" in report._repr_html_()


# ----- pieces -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("arch", "archs", "expected"),
    [
        ("sm_75", ["sm_75", "sm_80"], True),
        ("sm_60", ["sm_75", "sm_80"], False),
        ("sm_86", ["sm_80"], True),
        ("sm_90", ["sm_80", "compute_80"], True),
        ("sm_90", ["sm_80", "sm_86"], False),
        ("gfx942", ["gfx90a", "gfx942"], True),
        ("sm_75", [], None),
    ],
)
def test_kernels_in_wheel(arch, archs, expected):
    assert _kernels_in_wheel(arch, archs) is expected


@pytest.mark.parametrize(
    ("environ", "modules", "paths", "key"),
    [
        ({}, ["google.colab"], [], "colab"),
        ({"COLAB_RELEASE_TAG": "release-colab_20261101-060000_RC00"}, [], ["/content"], "colab"),
        ({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, [], ["/kaggle/working"], "kaggle"),
        (
            {"SM_CURRENT_HOST": "algo-1"},
            [],
            ["/opt/ml/input/config/resourceconfig.json"],
            "sagemaker",
        ),
        ({}, [], ["/opt/ml/metadata/resource-metadata.json"], "sagemaker"),
        ({"AZUREML_RUN_ID": "x"}, [], [], "azure-ml"),
        ({"HOME": "/home/me"}, ["numpy"], [], "local"),
    ],
)
def test_platform_detection(environ, modules, paths, key):
    platform = detect_platform(environ, modules, exists=lambda p: p in paths)
    assert platform.key == key
    if key != "local":
        assert platform.signals


def test_the_guides_nonexistent_api_and_emulated_bf16_are_never_called():
    import ast
    import inspect

    import lessonkit.health.probes as probes

    for module in (probes, health):
        attributes = {
            node.attr
            for node in ast.walk(ast.parse(inspect.getsource(module)))
            if isinstance(node, ast.Attribute)
        }
        assert not attributes & {"get_total_memory", "total_mem", "is_bf16_supported"}


def test_never_raises_even_when_the_check_itself_breaks(machine, monkeypatch):
    monkeypatch.setattr(health, "_status", lambda report: 1 / 0)
    report = machine(fake_torch([T4]), fake_pynvml([T4]))
    assert report.status == "error" and report.codes() == ["check_failed"]
    assert "ZeroDivisionError" in report.problems[0].message


# ----- the smoke test switched off ------------------------------------------------------------
def test_without_the_smoke_test_a_t4_is_still_usable(machine):
    report = machine(fake_torch([T4]), fake_pynvml([T4]), platform=COLAB, smoke_test=False)
    (d,) = report.devices
    assert d.smoke_test == "skipped" and d.usable and report.has_usable_gpu
    assert report.status == "ok" and report.codes() == ["smoke_test_skipped"]
    assert report.problems[0].severity == "info"
    assert "smoke test skipped" in str(report)
    text = " ".join(report.verdict)
    assert "no usable GPU" not in text and "QLoRA" in text and "fits" in text
    assert report.to_dict()["devices"][0]["usable"] is True


def test_without_the_smoke_test_a_gpu_the_wheel_lacks_is_not_usable(machine):
    report = machine(fake_torch([P100]), fake_pynvml([P100]), platform=KAGGLE, smoke_test=False)
    (d,) = report.devices
    assert d.smoke_test == "skipped" and d.kernels_in_wheel is False and not d.usable
    assert report.status == "error" and "no_kernel_image" in report.codes()
    problem = next(p for p in report.problems if p.code == "no_kernel_image")
    assert "sm_60" in problem.message and "skipped" in problem.message and "T4 x2" in problem.hint


def test_devices_seen_only_by_nvml_are_never_usable():
    device = health.Device(0, "Tesla T4", "cuda", source="nvml", smoke_test="skipped")
    assert not device.usable


# ----- never raises -------------------------------------------------------------------------
class Unprintable:
    """A model object whose repr, str and name all raise."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    __str__ = __repr__

    @property
    def name(self) -> str:
        raise RuntimeError("no name")


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


def test_the_last_resort_survives_a_model_that_cannot_be_printed(machine, monkeypatch):
    def broken(report):
        raise UnprintableError()

    monkeypatch.setattr(health, "_status", broken)
    report = machine(fake_torch([T4]), fake_pynvml([T4]), model=Unprintable())
    assert report.status == "error" and report.codes() == ["check_failed"]
    assert report.model == "<Unprintable object>"
    assert "UnprintableError" in report.problems[0].message
    assert str(report) and report.to_json() and report._repr_html_()


@pytest.mark.parametrize(
    "model",
    [
        Unprintable(),
        None,
        float("nan"),
        -7,
        1e30,
        [],
        {},
        {"model_type": "llama"},
        b"7B",
        object(),
        "",
        "x" * 10_000,
    ],
)
@pytest.mark.parametrize("smoke_test", [True, False, "yes"])
def test_never_raises_for_hostile_arguments(machine, model, smoke_test):
    report = machine(fake_torch([T4]), fake_pynvml([T4]), model=model, smoke_test=smoke_test)
    assert report.status in health.STATUSES and isinstance(report.model, str)
    assert report.verdict and str(report) and report.to_json() and report._repr_html_()


def test_never_raises_when_a_probe_error_cannot_be_printed(machine):
    torch = fake_torch([T4])

    def properties(i):
        raise UnprintableError()

    torch.cuda.get_device_properties = properties
    report = machine(torch, fake_pynvml([T4]))
    assert "check_failed" in report.codes() and "UnprintableError" in str(report)


# ----- a driver that is there but broken ------------------------------------------------------
BROKEN_DRIVER = {
    "NVMLError_LibRmVersionMismatch": ("nvml_mismatch", "Reboot"),
    "NVMLError_DriverNotLoaded": ("driver_not_loaded", "modprobe nvidia"),
    "NVMLError_NoPermission": ("nvml_no_permission", "/dev/nvidia"),
}


@pytest.mark.parametrize("kind", list(BROKEN_DRIVER))
@pytest.mark.parametrize("torch_build", ["cpu", "cuda", "none"])
def test_a_broken_driver_is_named_with_its_fix_not_called_missing(machine, kind, torch_build):
    torch = {
        "cpu": fake_torch(cuda=None),
        "cuda": fake_torch(
            cuda="12.6", available=False, warning="Found no NVIDIA driver on your system."
        ),
        "none": None,
    }[torch_build]
    report = machine(torch, fake_pynvml(init_error=kind), platform=COLAB, no_torch=torch is None)
    code, fix = BROKEN_DRIVER[kind]
    problem = next(p for p in report.problems if p.code == code)
    assert problem.severity == "error" and fix in problem.hint
    assert "installed but does not work" in problem.message
    text = str(report).lower()
    assert "no nvidia driver" not in text and "found no nvidia gpu or driver" not in text
    assert "no_gpu" not in report.codes() and report.status == "error"
    assert "Change runtime type" not in problem.hint  # not the Colab no-GPU hint


def test_missing_nvml_library_is_still_no_driver(machine):
    report = machine(fake_torch(cuda=None), fake_pynvml(init_error="NVMLError_LibraryNotFound"))
    assert "no NVIDIA driver was found" in report.problems[0].message


def test_without_nvidia_ml_py_the_report_does_not_claim_there_is_no_driver(machine):
    report = machine(fake_torch(cuda=None), no_nvml=True)
    assert report.codes() == ["no_gpu"]
    assert "no NVIDIA driver" not in report.problems[0].message
    assert "nvidia-ml-py is not installed" in report.problems[0].message
