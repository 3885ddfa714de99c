"""A stand-in for ``torch`` to run a student's GPU check as if on a given GPU, or on none.

It offers today's CUDA API (``get_device_properties``, ``mem_get_info``, ...) and nothing else:
``torch.cuda.get_total_memory``, which the guide's snippet calls, never existed.
"""

from __future__ import annotations

import io
import sys
import types
from contextlib import redirect_stdout
from typing import Any, Callable


def fake_torch(total_memory: int | None, name: str = "Tesla T4",
               capability: tuple[int, int] = (7, 5)) -> types.ModuleType:
    """A torch stand-in with today's CUDA API and no ``get_total_memory`` (it never existed)."""
    torch = types.ModuleType("torch")
    cuda = types.ModuleType("torch.cuda")
    available = total_memory is not None

    def no_gpu(*_args: object, **_kwargs: object) -> Any:
        raise RuntimeError("No CUDA GPUs are available")

    cuda.is_available = lambda: available
    cuda.device_count = lambda: 1 if available else 0
    if available:
        props = types.SimpleNamespace(name=name, total_memory=total_memory, major=capability[0],
                                      minor=capability[1], multi_processor_count=40)
        cuda.get_device_name = lambda device=0: name
        cuda.get_device_properties = lambda device=0: props
        cuda.mem_get_info = lambda device=0: (total_memory - 300 * 2**20, total_memory)
        cuda.get_device_capability = lambda device=0: capability
    else:
        cuda.get_device_name = cuda.get_device_properties = cuda.mem_get_info = no_gpu
        cuda.get_device_capability = no_gpu
    torch.cuda = cuda
    return torch


def run_with_fake_torch(fn: Callable[[], Any], torch: types.ModuleType) -> str:
    """Call ``fn()`` with ``torch`` bound to the fake (global name and import); its printout."""
    closure = fn.__closure__
    if closure and "torch" in fn.__code__.co_freevars:  # torch imported in an enclosing function
        cells = list(closure)
        cells[fn.__code__.co_freevars.index("torch")] = types.CellType(torch)
        closure = tuple(cells)
    patched = types.FunctionType(fn.__code__, {**fn.__globals__, "torch": torch},
                                 fn.__name__, fn.__defaults__, closure)
    saved = sys.modules.get("torch"), sys.modules.get("torch.cuda")
    sys.modules["torch"], sys.modules["torch.cuda"] = torch, torch.cuda
    out = io.StringIO()
    try:
        with redirect_stdout(out):
            patched()
    finally:
        for key, module in zip(("torch", "torch.cuda"), saved):
            if module is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = module
    return out.getvalue()
