"""measure_loading(): transformers' own from_pretrained, followed under the tracker on CPU.

The model (random weights, real tensors) is saved as a safetensors checkpoint in the dtype it
is loaded in and loaded back with ``from_pretrained`` (``device_map={"": "cpu"}``; for QLoRA a
``BitsAndBytesConfig`` with NF4, bitsandbytes quantizing each weight on CPU) inside the storage
tracker of memory/tracking.py. Every tensor the loader reads, copies, quantizes and frees is
seen in the order the loader does it. Two things differ from a GPU and are put back: the
warm-up block (``caching_allocator_warmup`` runs on CUDA devices only), whose size comes from
transformers' own ``get_total_byte_count``; and threads (a non-quantized load reads its tensors
in 4 worker threads, which a dispatch mode does not see), turned off by
``HF_DEACTIVATE_ASYNC_LOAD`` (each tensor still ends as the parameter it was read into).

Real tensors: for small models only (up to MAX_MEASURED_BYTES of weights). Private; needs
torch, transformers and, for QLoRA, bitsandbytes.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

from ..errors import LessonkitError
from ..models.spec import ModelSpec
from .loading import Loading, summarize

MAX_MEASURED_BYTES = 256 * 2**20


@contextlib.contextmanager
def _sequential_loading() -> Iterator[None]:
    before = os.environ.get("HF_DEACTIVATE_ASYNC_LOAD")
    os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["HF_DEACTIVATE_ASYNC_LOAD"]
        else:
            os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = before


@contextlib.contextmanager
def _warmup_size() -> Iterator[list[int]]:
    """The bytes ``caching_allocator_warmup`` would allocate were the device map's devices a
    GPU: transformers' own ``get_total_byte_count`` on the model about to be loaded."""
    import torch
    import transformers.modeling_utils as modeling

    original = modeling.caching_allocator_warmup
    sizes: list[int] = []

    def warmup(model: Any, device_map: dict[str, Any], quantizer: Any) -> None:
        on_gpu = dict.fromkeys(device_map, torch.device("cuda"))
        counts = modeling.get_total_byte_count(model, on_gpu, quantizer)
        sizes.append(int(sum(counts.values())))
        original(model, device_map, quantizer)

    modeling.caching_allocator_warmup = warmup  # type: ignore[assignment]
    try:
        yield sizes
    finally:
        modeling.caching_allocator_warmup = original


def measure_loading(spec: ModelSpec, settings: Any) -> Loading:
    """Load a checkpoint of ``spec`` as ``settings`` (a RunSettings) would, on CPU, and return
    what the tracker saw (see the module doc)."""
    import torch
    import transformers

    from .tracking import Tracker

    stored = torch.bfloat16 if settings.precision in ("bf16", "bf16-master") else torch.float32
    if spec.n_params * stored.itemsize > MAX_MEASURED_BYTES:
        raise LessonkitError(
            f"measure_loading loads real weights on CPU: at most "
            f"{MAX_MEASURED_BYTES / 2**20:.0f} MiB of them, and {spec.name} has "
            f"{spec.n_params * stored.itemsize / 2**30:.2f} GiB. Use estimate_loading()."
        )
    kwargs: dict[str, Any] = {"dtype": stored, "device_map": {"": "cpu"}}
    if settings.method == "qlora":
        kwargs["quantization_config"] = transformers.BitsAndBytesConfig(  # type: ignore[no-untyped-call]
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=settings.double_quant,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        config = spec.to_hf_config()
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=stored)  # type: ignore[no-untyped-call]
        model.save_pretrained(folder)
        del model
        tracker = Tracker()
        with _sequential_loading(), _warmup_size() as warmups, tracker:
            model = transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs)
        warmup = warmups[0]
    # the warm-up block first, as on a GPU; each record keyed by its number (a storage's
    # identity can be reused once it is freed)
    events: list[tuple[str, int, str]] = [("warmup", 2 * (warmup // 2), ""), ("warmup", 0, "")]
    born = {r.born: n for n, r in enumerate(tracker.records)}
    died = {int(r.died): n for n, r in enumerate(tracker.records) if r.died != math.inf}
    for i in range(len(tracker.events)):
        if i in born:
            events.append((f"r{born[i]}", tracker.records[born[i]].nbytes, ""))
        elif i in died:
            events.append((f"r{died[i]}", 0, ""))
    del model
    return summarize(events, "measure")
