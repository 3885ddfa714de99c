"""A stand-in for ``torch`` to run a student's GPU check as if on a given GPU, or on none.

It offers today's CUDA API (``get_device_properties``, ``mem_get_info``, ...) and nothing else:
``torch.cuda.get_total_memory``, which the guide's snippet calls, never existed.
"""

from __future__ import annotations

import io
import sys
import threading
import types
from collections.abc import Callable
from contextlib import redirect_stdout
from typing import Any

from .. import safe_repr


def fake_torch(
    total_memory: int | None, name: str = "Tesla T4", capability: tuple[int, int] = (7, 5)
) -> types.ModuleType:
    """A torch stand-in with today's CUDA API and no ``get_total_memory`` (it never existed)."""
    torch: Any = types.ModuleType("torch")  # Any: the attributes are set here, not declared
    cuda: Any = types.ModuleType("torch.cuda")

    def no_gpu(*_args: object, **_kwargs: object) -> Any:
        raise RuntimeError("No CUDA GPUs are available")

    cuda.is_available = lambda: total_memory is not None
    cuda.device_count = lambda: 0 if total_memory is None else 1
    if total_memory is not None:
        total = total_memory
        props = types.SimpleNamespace(
            name=name,
            total_memory=total,
            major=capability[0],
            minor=capability[1],
            multi_processor_count=40,
        )
        cuda.get_device_name = lambda device=0: name
        cuda.get_device_properties = lambda device=0: props
        cuda.mem_get_info = lambda device=0: (total - 300 * 2**20, total)
        cuda.get_device_capability = lambda device=0: capability
    else:
        cuda.get_device_name = cuda.get_device_properties = cuda.mem_get_info = no_gpu
        cuda.get_device_capability = no_gpu
    torch.cuda = cuda
    torch._lessonkit_spec = (total_memory, name, capability)  # to make it again in a child
    result: types.ModuleType = torch
    return result


def torch_spec(torch: types.ModuleType) -> tuple[int | None, str, tuple[int, int]]:
    """The arguments ``fake_torch`` made this stand-in with (to make it again in a child)."""
    spec: tuple[int | None, str, tuple[int, int]] = torch.__dict__["_lessonkit_spec"]
    return spec


def fake_torch_from_spec(spec: tuple[Any, ...]) -> types.ModuleType:
    """``fake_torch(*spec)``, for a spec from ``torch_spec``."""
    total_memory, name, (major, minor) = spec
    return fake_torch(total_memory, name, (major, minor))


class TimeLimitExceeded(Exception):
    """The function did not return within its time limit."""


class StudentExit(Exception):
    """The function ended with SystemExit (``sys.exit()``, ``exit()``) or KeyboardInterrupt:
    reported as what it did, not passed on to stop the notebook."""

    def __init__(self, original: BaseException) -> None:
        self.original = original
        what = type(original).__name__
        if isinstance(original, SystemExit):
            code = "" if original.code is None else safe_repr.short_repr(original.code, 40)
            text = (
                f"called sys.exit({code}): a check should print what it finds and return, "
                "not end the program"
            )
        else:
            text = f"raised {what}"
        super().__init__(text)


# The most a function may print that is kept (a health check prints a few lines).
MAX_PRINTED = 4_000


class _CappedText(io.StringIO):
    """A stdout that keeps the first ``limit`` characters written to it."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self._room = limit

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        kept = text[: max(self._room, 0)]
        self._room -= len(kept)
        super().write(kept)
        return len(text)


def run_with_fake_torch(
    fn: Callable[[], Any], torch: types.ModuleType, *, time_limit: float | None = None
) -> str:
    """Call ``fn()`` with ``torch`` bound to the fake (global name and import); its printout
    (the first MAX_PRINTED characters).

    What ``fn`` raises is raised here, SystemExit and KeyboardInterrupt as StudentExit. With a
    ``time_limit`` (seconds) it runs in a thread of its own and TimeLimitExceeded is raised when
    it has not returned by then; the thread is asked to stop at its next Python line.
    """
    closure = fn.__closure__
    if closure and "torch" in fn.__code__.co_freevars:  # torch imported in an enclosing function
        cells = list(closure)
        cells[fn.__code__.co_freevars.index("torch")] = types.CellType(torch)
        closure = tuple(cells)
    patched = types.FunctionType(
        fn.__code__, {**fn.__globals__, "torch": torch}, fn.__name__, fn.__defaults__, closure
    )
    outcome: dict[str, BaseException] = {}
    stop = threading.Event()

    def stop_when_asked(frame: Any, event: str, arg: Any) -> Any:
        if stop.is_set():
            raise TimeLimitExceeded("stopped: it ran past its time limit")
        return stop_when_asked

    def call() -> None:
        if time_limit is not None:
            sys.settrace(stop_when_asked)
        try:
            patched()
        except BaseException as err:  # handed to the caller, whatever it is
            if time_limit is None and isinstance(err, KeyboardInterrupt):
                raise  # Ctrl-C in this very thread: the user's, not the function's
            outcome["error"] = err
        finally:
            if time_limit is not None:
                sys.settrace(None)

    saved = sys.modules.get("torch"), sys.modules.get("torch.cuda")
    sys.modules["torch"], sys.modules["torch.cuda"] = torch, torch.cuda
    out = _CappedText(MAX_PRINTED)
    try:
        with redirect_stdout(out):
            if time_limit is None:
                call()
            else:
                worker = threading.Thread(target=call, name="lessonkit-exercise", daemon=True)
                worker.start()
                worker.join(max(time_limit, 0.0))
                if worker.is_alive():
                    stop.set()
                    raise TimeLimitExceeded(
                        f"did not finish within {time_limit:.1f} s (an endless loop, or waiting "
                        "for input?)"
                    )
    finally:
        for key, module in zip(("torch", "torch.cuda"), saved, strict=True):
            if module is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = module
    error = outcome.get("error")
    if isinstance(error, Exception):
        raise error
    if error is not None:
        raise StudentExit(error) from None
    return out.getvalue()
