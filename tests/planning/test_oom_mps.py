"""An out-of-memory on a Mac's GPU (MPS), or on a one-GPU machine such as the DGX Spark, is
never answered with more GPUs, FSDP or DeepSpeed: such a device cannot be joined by another.
The messages are as PyTorch printed them in public bug reports (GB from PyTorch 2.0-2.2, GiB
later; private and shared pool; cut short after the variable's name; a torch.OutOfMemoryError
of PyTorch 2.5 and later)."""

from __future__ import annotations

import re

import pytest

from lessonkit import oom_doctor
from lessonkit.hardware.gpus import get_gpu

MPS_MESSAGES = {
    # an M1 MacBook Air with 16 GB (haoheliu/AudioLDM2#20)
    "m1-16gb": "RuntimeError: MPS backend out of memory (MPS allocated: 18.02 GB, other "
    "allocations: 107.10 MB, max allowed: 18.13 GB). Tried to allocate 4.50 MB on private pool. "
    "Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory allocations "
    "(may cause system failure).",
    # other allocations larger than PyTorch's own (Comfy-Org/ComfyUI#7440)
    "gib-other": "MPS backend out of memory (MPS allocated: 9.57 GiB, other allocations: "
    "17.35 GiB, max allowed: 27.20 GiB). Tried to allocate 292.50 MiB on private pool. Use "
    "PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory allocations (may "
    "cause system failure).",
    # a request of 256 bytes on the shared pool (pinokiocomputer/pinokio#941)
    "shared-pool": "MPS backend out of memory (MPS allocated: 16.00 GB, other allocations: "
    "3.31 GB, max allowed: 18.13 GB). Tried to allocate 256 bytes on shared pool. Use "
    "PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory allocations (may "
    "cause system failure).",
    # cut short after the variable, as a UI printed it (Comfy-Org/ComfyUI#2489)
    "cut-short": "RuntimeError: MPS backend out of memory (MPS allocated: 5.56 GB, other "
    "allocations: 1.10 GB, max allowed: 6.80 GB). Tried to allocate 768.00 MB on private pool. "
    "Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0",
    # a large Mac Studio (Comfy-Org/ComfyUI#11584), as torch.OutOfMemoryError
    "mac-studio": "torch.OutOfMemoryError: MPS backend out of memory (MPS allocated: 39.50 GiB, "
    "other allocations: 141.24 GiB, max allowed: 182.78 GiB). Tried to allocate 5.81 GiB on "
    "private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory "
    "allocations (may cause system failure).",
}
RUNS = {
    "7B full": dict(model="7B", method="full", batch_size=4, seq_len=1024),
    "7B lora": dict(model="7B", method="lora", batch_size=8, seq_len=2048),
    "13B full on 4 GPUs": dict(
        model="13B", method="full", batch_size=1, seq_len=512, n_gpus=4, zero_stage=3
    ),
    "8B offload": dict(
        model="llama-3.1-8b",
        method="full",
        batch_size=2,
        seq_len=1024,
        n_gpus=2,
        zero_stage=2,
        offload_optimizer=True,
    ),
    "1B full": dict(model="llama-3.2-1b", method="full", batch_size=16, seq_len=2048),
}
SEVERAL = re.compile(r"FSDP|DeepSpeed|ZeRO|--n-gpus|--zero-stage|more GPUs|\d+ GPUs", re.I)


def assert_one_device(diagnosis) -> None:
    for fix in diagnosis.fixes:
        assert not SEVERAL.search(fix.line()), fix.line()
        assert fix.change.get("n_gpus", 1) == 1 and not fix.change.get("zero_stage")
        assert not fix.change.get("offload_optimizer")
        if fix.report is not None:
            assert fix.report.settings["n_gpus"] == 1
            assert fix.report.settings.get("zero_stage", 0) == 0
    if diagnosis.report is not None:
        assert diagnosis.report.settings["n_gpus"] == 1


@pytest.mark.parametrize("message", MPS_MESSAGES.values(), ids=MPS_MESSAGES.keys())
@pytest.mark.parametrize("run", RUNS.values(), ids=RUNS.keys())
def test_an_mps_out_of_memory_is_never_offered_more_gpus(message, run):
    diagnosis = oom_doctor(message, **run)
    assert diagnosis.recognized and diagnosis.message.backend == "mps"
    assert_one_device(diagnosis)
    text = " ".join(str(diagnosis).split())
    if run.get("n_gpus", 1) > 1:  # said, and estimated on the one device
        assert "A Mac's GPU (MPS) is a single device" in text and "n_gpus=" in text


def test_the_same_run_on_a_cuda_gpu_is_offered_more_gpus():
    # the control: where GPUs can be added the doctor does offer them
    cuda = (
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.55 GiB "
        "of which 1.00 GiB is free. Process 1 has 22.54 GiB memory in use. Of the allocated "
        "memory 21.90 GiB is allocated by PyTorch, and 120.00 MiB is reserved by PyTorch but "
        "unallocated."
    )
    diagnosis = oom_doctor(cuda, model="7B", method="full", batch_size=1, seq_len=512)
    assert any(f.change.get("n_gpus", 1) > 1 for f in diagnosis.fixes)


def test_a_one_gpu_machine_named_by_gpu_is_never_offered_more_gpus():
    spark = get_gpu("DGX Spark")
    message = "CUDA out of memory. Tried to allocate 8.00 GiB."  # no figures: gpu= gives them
    diagnosis = oom_doctor(message, gpu="DGX Spark", **RUNS["13B full on 4 GPUs"])
    assert diagnosis.budget_bytes == spark.usable_bytes
    assert_one_device(diagnosis)
    assert "The DGX Spark (one GPU sharing its memory with the CPU) is a single device" in " ".join(
        str(diagnosis).split()
    )
