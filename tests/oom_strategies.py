"""Hypothesis strategies for the OOM doctor's fuzz tests: out-of-memory messages in every wording
PyTorch uses, with figures of any size and shape, inside logs of noise, and run settings that
are right, wrong or hostile."""

from __future__ import annotations

import math
from unittest import mock

from hypothesis import strategies as st

UNITS = ["bytes", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB"]
UNIT_BYTES = {
    "bytes": 1,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
    "KB": 2**10,
    "MB": 2**20,
    "GB": 2**30,
    "TB": 2**40,
}

# A figure as PyTorch prints it (two decimals and a unit), or one that no PyTorch prints.
clean_number = st.floats(0, 9999, allow_nan=False).map(lambda x: f"{x:.2f}")
odd_number = st.one_of(
    st.text("0123456789", min_size=1, max_size=600),
    st.text("0123456789.", min_size=1, max_size=40),
    st.sampled_from(["nan", "inf", "-1", "-0.5", "1e400", "0x10", "", " ", "١٢", "½"]),
)
number = st.one_of(clean_number, odd_number)
size = st.builds(
    lambda n, unit, space: f"{n}{' ' if space else ''}{unit}",
    number,
    st.one_of(st.sampled_from(UNITS), st.sampled_from(["XB", "gib", "", "GiBs", "Gb"])),
    st.booleans(),
)
device = st.one_of(st.integers(0, 16).map(str), st.text("0123456789", min_size=1, max_size=300))

NEW = (
    "{kind} out of memory. Tried to allocate {0}. GPU {dev} has a total {capacity} of {1} of "
    "which {2} is free. Process {pid} has {3} memory in use. Including non-PyTorch memory, this "
    "process has {4} memory in use. Of the allocated memory {5} is allocated by PyTorch, with "
    "{6} allocated in private pools (e.g., CUDA Graphs), and {7} is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)
OLD = (
    "CUDA out of memory. Tried to allocate {0} (GPU {dev}; {1} total capacity; {2} already "
    "allocated; {3} free; {4} reserved in total by PyTorch) If reserved memory is >> allocated "
    "memory try setting max_split_size_mb to avoid fragmentation."
)
MPS = (
    "MPS backend out of memory (MPS allocated: {0}, other allocations: {1}, max allowed: {2}). "
    "Tried to allocate {3} on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable "
    "upper limit for memory allocations (may cause system failure)."
)
FIXED = [
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "RuntimeError: No executable batch size found, reached zero.",
    "OutOfMemoryError",
    "torch.OutOfMemoryError: ",
    "DefaultCPUAllocator: can't allocate memory: you tried to allocate 123456789 bytes.",
]


@st.composite
def message(draw: st.DrawFn) -> str:
    """One out-of-memory message, whole or cut short, in any wording, with any figures."""
    kind = draw(st.sampled_from(["new", "old", "mps", "fixed"]))
    sizes = draw(st.lists(size, min_size=8, max_size=8))
    if kind == "new":
        text = NEW.format(
            *sizes,
            kind=draw(st.sampled_from(["CUDA", "HIP", "XPU", "cuda"])),
            dev=draw(device),
            pid=draw(device),
            capacity=draw(st.sampled_from(["capacity", "capacty"])),
        )
    elif kind == "old":
        text = OLD.format(*sizes, dev=draw(device))
    elif kind == "mps":
        text = MPS.format(*sizes)
    else:
        text = draw(st.sampled_from(FIXED))
        if "batch size" in text:
            tries = draw(st.lists(number, max_size=4))
            text = "".join(f"Decreasing batch size to: {n}\n" for n in tries) + text
    if draw(st.booleans()):
        text = text[: draw(st.integers(0, len(text)))]
    return text


# Long runs built from a few characters: what made the reading quadratic, at sizes hypothesis
# does not have to generate character by character.
RUNS = ["\n", " ", "\t", "[rank0]:", "[rank0]:\n", "9", "OutOfMemoryError ", "GPU ", "\r\n"]
noise = st.one_of(
    st.text(max_size=200),
    st.builds(lambda piece, count: piece * count, st.sampled_from(RUNS), st.integers(0, 20_000)),
    st.just("step 10/1000 | loss 1.23 | lr 2e-5\n" * 50),
)


@st.composite
def log(draw: st.DrawFn) -> str:
    """A log: noise, messages (the last one counts), rank prefixes, a Trainer traceback."""
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        parts.append(draw(noise))
        if draw(st.booleans()):
            prefix = draw(st.sampled_from(["", "[rank0]: ", "[default0]:[rank1]: ", "E  "]))
            parts.append(prefix + draw(message()))
    if draw(st.booleans()):
        parts.insert(0, '  File "transformers/trainer.py", line 2245, in _inner_training_loop\n')
    return draw(st.sampled_from(["\n", "", " "])).join(parts)


odd_value = st.one_of(
    st.none(),
    st.integers(-3, 10**6),
    st.just(10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.just("x" * 100_000),
    st.builds(mock.MagicMock),
    st.just(object()),
    st.lists(st.integers(), max_size=3),
)
settings = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(
            st.sampled_from(["7B", "gpt2", "llama-3-8b", "70B", "1.5B", "nosuch-model", ""]),
            odd_value,
        ),
        "method": st.one_of(st.sampled_from(["full", "lora", "qlora", "LoRA", "x"]), odd_value),
        "precision": st.one_of(st.sampled_from(["bf16", "fp32", "bf16-mixed", "fp8"]), odd_value),
        "batch_size": st.one_of(st.integers(1, 64), odd_value),
        "seq_len": st.one_of(st.integers(1, 8192), odd_value),
        "gradient_checkpointing": st.one_of(st.booleans(), odd_value),
        "n_gpus": st.one_of(st.integers(1, 8), odd_value),
        "zero_stage": st.one_of(st.integers(0, 3), odd_value),
        "gpu": st.one_of(st.sampled_from(["T4", "A100 80GB", "t5", "H100 SXM"]), odd_value),
        "no_such_setting": odd_value,
    },
)


def expected_bytes(figure: str) -> int | None:
    """What a clean figure such as '2.50 GiB' stands for, in bytes."""
    value, unit = figure.split(" ")
    number = float(value) * UNIT_BYTES[unit]
    return round(number) if math.isfinite(number) else None
