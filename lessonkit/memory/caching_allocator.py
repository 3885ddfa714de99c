"""PyTorch's CUDA caching allocator, replayed on a list of allocations and frees.

What ``torch.cuda.memory_reserved`` holds after a sequence of tensors is made and freed: the
allocator never gives a segment back to the driver (until ``empty_cache``), so what it reserved
at the highest point of a phase stays reserved afterwards. The rules, as
c10/cuda/CUDACachingAllocator.cpp states them (constants in lessonkit/data/cuda_constants.json
under ``caching_allocator``):

- every request is rounded up to 512 bytes;
- requests up to 1 MiB come from the small pool, whose segments are 2 MiB; larger ones from the
  large pool, whose new segments are 20 MiB for requests under 10 MiB and otherwise the request
  rounded up to 2 MiB;
- a request takes the smallest free block of its pool that holds it (best fit), splitting off
  the rest where that is at least 512 bytes (small pool) or more than 1 MiB (large pool);
- a freed block merges with free neighbours of its segment; a new segment is made only when no
  free block holds the request.

Pure Python, no torch: estimate() and measure_loading() (memory/loading.py) replay their own
allocation streams through it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .step_notes import cuda_constants


def _constant(name: str) -> int:
    return int(cuda_constants()["caching_allocator"][name])


@dataclass(eq=False)  # a block is itself: list.index and `in` compare identity, quickly
class _Block:
    segment: int
    offset: int
    size: int
    free: bool = True


@dataclass
class CachingAllocator:
    """A replay of the caching allocator: ``malloc(key, nbytes)``, ``free(key)``, and the
    figures torch.cuda reports (``allocated``, ``reserved``, their peaks)."""

    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    _blocks: dict[int, list[_Block]] = field(default_factory=dict)  # by segment, in order
    _pools: dict[int, bool] = field(default_factory=dict)  # segment -> small pool
    _live: dict[object, _Block] = field(default_factory=dict)
    # the free blocks of each pool (small or large): where a request is looked for
    _free: dict[bool, set[_Block]] = field(default_factory=lambda: {True: set(), False: set()})

    def __post_init__(self) -> None:
        self.round = _constant("round_bytes")
        self.small_request = _constant("small_request_bytes")
        self.small_segment = _constant("small_segment_bytes")
        self.mid_request = _constant("mid_request_bytes")
        self.mid_segment = _constant("mid_segment_bytes")
        self.large_round = _constant("large_round_bytes")

    def malloc(self, key: object, nbytes: int) -> None:
        """Allocate ``nbytes`` for ``key`` (a tensor storage's identity)."""
        size = max(self.round, -(-nbytes // self.round) * self.round)
        small = size <= self.small_request
        fits = [b for b in self._free[small] if b.size >= size]
        if fits:
            block = min(fits, key=lambda b: (b.size, b.segment, b.offset))
            self._free[small].discard(block)
        else:
            if small:
                segment_size = self.small_segment
            elif size < self.mid_request:
                segment_size = self.mid_segment
            else:
                segment_size = -(-size // self.large_round) * self.large_round
            segment = len(self._pools)
            block = _Block(segment, 0, segment_size)
            self._blocks[segment], self._pools[segment] = [block], small
            self.reserved += segment_size
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        remaining = block.size - size
        if (remaining >= self.round) if small else (remaining > self.small_request):
            blocks = self._blocks[block.segment]
            rest = _Block(block.segment, block.offset + size, remaining)
            blocks.insert(blocks.index(block) + 1, rest)
            self._free[small].add(rest)
            block.size = size
        block.free = False
        self._live[key] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key: object) -> None:
        """Free ``key``'s block; it merges with free neighbours and stays reserved."""
        block = self._live.pop(key)
        block.free = True
        self.allocated -= block.size
        free = self._free[self._pools[block.segment]]
        free.add(block)
        blocks = self._blocks[block.segment]
        i = blocks.index(block)
        if i + 1 < len(blocks) and blocks[i + 1].free:
            merged = blocks.pop(i + 1)
            free.discard(merged)
            block.size += merged.size
        if i > 0 and blocks[i - 1].free:
            blocks[i - 1].size += block.size
            free.discard(blocks.pop(i))


def replay(events: Iterable[tuple[object, int]]) -> CachingAllocator:
    """The allocator after ``events``: (key, bytes) allocates, (key, 0) frees that key."""
    allocator = CachingAllocator()
    for key, nbytes in events:
        if nbytes:
            allocator.malloc(key, nbytes)
        else:
            allocator.free(key)
    return allocator
