"""The tracker counts the backward of ops that write into fresh zeros as a plain step runs them.

Under any Python dispatch mode autograd's formulas for indexing, gather, top-k and index_select
add the incoming gradient into new zeros out of place; a plain step (on a GPU, or on CPU with no
mode) does it in place. The tracker must count the plain step: the input's gradient, the
incoming gradient and nothing else of their size.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from lessonkit.memory.tracking import Tracker

ROWS, WIDTH = 1000, 256
SIZE = ROWS * WIDTH * 4  # bytes of one fp32 (ROWS, WIDTH) tensor


def _reversed_rows() -> torch.Tensor:
    # made inside the caller's mode: a real index cannot enter FakeTensorMode
    return torch.arange(ROWS - 1, -1, -1)


def _index(x: torch.Tensor) -> torch.Tensor:
    return x[_reversed_rows()]


def _gather(x: torch.Tensor) -> torch.Tensor:
    return x.gather(0, _reversed_rows()[:, None].expand(ROWS, WIDTH))


def _index_select(x: torch.Tensor) -> torch.Tensor:
    return x.index_select(0, _reversed_rows())


def _topk(x: torch.Tensor) -> torch.Tensor:
    return x.topk(WIDTH, dim=1).values  # every column: the output has the input's size


OPS = {"index": _index, "gather": _gather, "index_select": _index_select, "topk": _topk}


def _backward_peak(op: Callable[[torch.Tensor], torch.Tensor], fake: bool) -> int:
    """Bytes above what is live before the backward: its peak, as the tracker counts it."""
    modes = FakeTensorMode() if fake else None
    if modes is not None:
        modes.__enter__()
    try:
        x = torch.randn(ROWS, WIDTH, requires_grad=True)
        y = op(x)
        grad = torch.ones_like(y)
        tracker = Tracker()
        with tracker:
            tracker.set_phase("backward")
            y.backward(grad)
            tracker.set_phase("end")
        del y, grad
        levels, _ = tracker.peaks()
        return dict(levels)["backward"]
    finally:
        if modes is not None:
            modes.__exit__(None, None, None)


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("fake", [False, True], ids=["real", "fake"])
def test_backward_counts_the_in_place_write(name: str, fake: bool) -> None:
    # the zeros made for x's gradient, written in place: one tensor of x's size, no copy
    assert _backward_peak(OPS[name], fake) == SIZE, name


def test_plain_step_writes_in_place() -> None:
    """The premise, checked on the real thing: with no dispatch mode, the backward of indexing
    allocates only the zeros of the gradient (CPU allocations seen by the profiler)."""
    x = torch.randn(ROWS, WIDTH, requires_grad=True)
    y = _index(x)
    grad = torch.ones_like(y)
    with torch.profiler.profile(profile_memory=True) as prof:
        y.backward(grad)
    allocated = [e.self_cpu_memory_usage for e in prof.events() if e.self_cpu_memory_usage > 0]
    assert sum(allocated) == SIZE
