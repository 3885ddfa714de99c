"""Following every tensor storage of a training step: a small TorchDispatchMode.

Each storage an operator creates is recorded once (an allocation event) and a weakref finalizer
records when it is freed. The running total of live bytes gives the peak; the event log, replayed
afterwards, gives the composition at the peak once the caller has said which storages are weights,
gradients and optimizer state. Works the same on real and on fake tensors (FakeTensorMode).

Private, and needs torch: it is imported only by measure() (memory/measuring.py), after checking that
torch is installed.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

_LABELS: list[str] = []

# Backward formulas that make zeros and write into them: a plain step writes in place, but under
# any Python dispatch mode (this tracker, FakeTensorMode) autograd calls the out-of-place op
# instead (FunctionsManual.cpp's tensor-subclass branch), one more tensor of the result's size
# than a real run holds. The tracker runs the in-place op, as the step on a GPU does.
_WRITES_INTO_ZEROS = {
    "IndexBackward0": ("index_put", "index_put_"),
    "GatherBackward0": ("scatter_add", "scatter_add_"),
    "TopkBackward0": ("scatter", "scatter_"),
    "IndexSelectBackward0": ("index_add", "index_add_"),
}
_OUT_OF_PLACE = {out_of_place for out_of_place, _ in _WRITES_INTO_ZEROS.values()}
OFFLOADED = "offloaded"  # the label of host copies (activation offloading): not on the device


@contextlib.contextmanager
def label(name: str) -> Iterator[None]:
    """Storages created inside this block get the category ``name`` (e.g. "temporaries")."""
    _LABELS.append(name)
    try:
        yield
    finally:
        _LABELS.pop()


@dataclass
class Record:
    """One storage: its size, when it was created and freed (event numbers), and what made it."""

    nbytes: int
    born: int
    phase: str
    shape: tuple[int, ...]
    label: str | None = None
    copy_of_weight: bool = False
    died: float = math.inf
    key: int = 0


def plain_tensors(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The tensors that own storage: the tensor itself, or a DTensor's local tensors."""
    if is_traceable_wrapper_subclass(tensor):
        inner = (getattr(tensor, name) for name in tensor.__tensor_flatten__()[0])
        return [p for t in inner if isinstance(t, torch.Tensor) for p in plain_tensors(t)]
    return [tensor]


def storage_keys(tensors: Iterable[torch.Tensor]) -> set[int]:
    """Identities of the storages of ``tensors`` (shared by all views of a storage)."""
    return {p.untyped_storage()._cdata for t in tensors for p in plain_tensors(t)}


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of distinct storages among ``tensors`` (shared storages counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        for p in plain_tensors(t):
            seen[p.untyped_storage()._cdata] = p.untyped_storage().nbytes()
    return sum(seen.values())


class Tracker(TorchDispatchMode):
    """Records storage allocations and frees of every operator run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "setup"
        self.records: list[Record] = []
        self.live: dict[int, Record] = {}
        self.events: list[tuple[int, int]] = []  # (change in bytes, index into self.phases)
        self.phases: list[str] = []
        self.weight_keys: set[int] = set()
        self.ignored: set[int] = set()  # storages that live off the device (not counted)
        self._refs: dict[int, weakref.ref[Any]] = {}
        self.host_live = self.host_peak = 0  # storages made under label(OFFLOADED)
        self._host_keys: set[int] = set()
        self._fresh_zeros: int | None = None  # storage of zeros a backward formula just made

    # ----- recording ----------------------------------------------------------------------
    def add(
        self,
        tensor: torch.Tensor,
        phase: str | None = None,
        label_: str | None = None,
        copy_of_weight: bool = False,
    ) -> None:
        """Start following ``tensor``'s storage (no-op when already followed)."""
        if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
            return
        if is_traceable_wrapper_subclass(tensor):  # DTensor: follow the local tensors
            for inner in plain_tensors(tensor):
                self.add(inner, phase, label_, copy_of_weight)
            return
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.live or key in self.ignored:
            return
        nbytes = storage.nbytes()
        if nbytes == 0:
            return
        if (label_ or (_LABELS[-1] if _LABELS else None)) == OFFLOADED:
            self._add_host(storage, nbytes)
            return
        record = Record(
            nbytes=nbytes,
            born=len(self.events),
            phase=phase or self.phase,
            shape=tuple(tensor.shape),
            label=label_ or (_LABELS[-1] if _LABELS else None),
            copy_of_weight=copy_of_weight,
            key=key,
        )
        self.live[key] = record
        self.records.append(record)
        self.events.append((nbytes, self._phase_index()))
        self._refs[id(record)] = weakref.ref(storage, self._free_when_gone(record))

    def _add_host(self, storage: torch.UntypedStorage, nbytes: int) -> None:
        """A host (CPU RAM) copy of a saved activation: counted apart from the device."""
        key = storage._cdata
        if key in self._host_keys:
            return
        self._host_keys.add(key)
        self.host_live += nbytes
        self.host_peak = max(self.host_peak, self.host_live)
        ref: weakref.ref[Any] = weakref.ref(storage, lambda r: self._free_host(r, key, nbytes))
        self._refs[id(ref)] = ref

    def _free_when_gone(self, record: Record) -> Callable[[Any], None]:
        """The weakref callback that records ``record``'s storage being freed."""
        return lambda _ref: self._free(record)

    def _free_host(self, ref: weakref.ref[Any], key: int, nbytes: int) -> None:
        self.host_live -= nbytes
        self._host_keys.discard(key)
        self._refs.pop(id(ref), None)

    def _resized(self, storage: torch.UntypedStorage) -> None:
        """A storage resized in place (FSDP frees and re-allocates parameters this way):
        recorded as a free of the old size and an allocation of the new one."""
        record = self.live.get(storage._cdata)
        if record is not None:
            if record.nbytes == storage.nbytes():
                return
            self._free(record)
        if storage.nbytes():
            record = Record(
                nbytes=storage.nbytes(),
                born=len(self.events),
                phase=self.phase,
                shape=(storage.nbytes(),),
                label=_LABELS[-1] if _LABELS else None,
                key=storage._cdata,
            )
            self.live[record.key] = record
            self.records.append(record)
            self.events.append((record.nbytes, self._phase_index()))
            self._refs[id(record)] = weakref.ref(storage, self._free_when_gone(record))

    def __enter__(self) -> Tracker:
        original = self._original_resize = torch.UntypedStorage.resize_

        def resize_(storage: torch.UntypedStorage, size: int) -> Any:
            out = original(storage, size)
            self._resized(storage)
            return out

        torch.UntypedStorage.resize_ = resize_  # type: ignore[assignment]  # not seen by dispatch modes
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        torch.UntypedStorage.resize_ = self._original_resize
        return super().__exit__(*exc)

    def _free(self, record: Record) -> None:
        if record.died != math.inf:
            return
        if self.live.get(record.key) is record:
            del self.live[record.key]
        self._refs.pop(id(record), None)
        record.died = len(self.events)
        self.events.append((-record.nbytes, self._phase_index()))

    def _phase_index(self) -> int:
        if not self.phases or self.phases[-1] != self.phase:
            self.phases.append(self.phase)
        return len(self.phases) - 1

    def set_phase(self, phase: str) -> None:
        """Start a phase; a zero event marks its start so that an empty phase has a level."""
        self.phase = phase
        self.events.append((0, self._phase_index()))

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        func = self._as_plain_step_runs(func, args)
        out = func(*args, **(kwargs or {}))
        self._note_fresh_zeros(func, out)
        copy_of_weight = False
        if func in _COPY_OPS and args and isinstance(args[0], torch.Tensor):
            copy_of_weight = bool(storage_keys([args[0]]) & self.weight_keys)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.add(t, copy_of_weight=copy_of_weight)
        return out

    def _as_plain_step_runs(self, func: Any, args: tuple[Any, ...]) -> Any:
        """The in-place op a plain step runs where the dispatch mode made autograd call the
        out-of-place one on the zeros its backward formula just made (see _WRITES_INTO_ZEROS)."""
        if self._fresh_zeros is None or func.overloadpacket.__name__ not in _OUT_OF_PLACE:
            return func
        node = torch._C._current_autograd_node()
        pair = _WRITES_INTO_ZEROS.get(type(node).__name__) if node is not None else None
        target = args[0] if args else None
        if pair is None or func.overloadpacket.__name__ != pair[0]:
            return func
        if not isinstance(target, torch.Tensor) or (
            target.untyped_storage()._cdata != self._fresh_zeros
        ):
            return func
        self._fresh_zeros = None
        return getattr(getattr(torch.ops.aten, pair[1]), func._overloadname)

    def _note_fresh_zeros(self, func: Any, out: Any) -> None:
        """Remember the zeros a backward formula of _WRITES_INTO_ZEROS makes."""
        if func is not torch.ops.aten.new_zeros.default or not isinstance(out, torch.Tensor):
            return
        node = torch._C._current_autograd_node()
        if node is not None and type(node).__name__ in _WRITES_INTO_ZEROS:
            self._fresh_zeros = out.untyped_storage()._cdata

    # ----- reading --------------------------------------------------------------------------
    def peaks(self) -> tuple[list[tuple[str, int]], int]:
        """The peak of each phase occurrence, in order, and the event number of the overall
        peak among the phases other than "setup" and "end"."""
        total, best, best_at = 0, -1, -1
        levels = [0] * len(self.phases)
        for i, (delta, phase_idx) in enumerate(self.events):
            before = total
            total += delta
            levels[phase_idx] = max(levels[phase_idx], before, total)
            if self.phases[phase_idx] not in ("setup", "end") and total > best:
                best, best_at = total, i
        return list(zip(self.phases, levels, strict=True)), best_at

    def alive_at(self, event: int) -> list[Record]:
        """Records live just after event number ``event``."""
        return [r for r in self.records if r.born <= event < r.died]

    def composition(
        self, event: int, groups: dict[str, set[int]], vocab_size: int
    ) -> dict[str, int]:
        """Bytes by category of the storages live just after ``event``.

        ``groups`` maps a category to the storage keys it owns at the end of the step (weights,
        gradients, optimizer); other storages are classified by how they were made.
        """
        out: dict[str, int] = {}
        for record in self.alive_at(event):
            category = self._category(record, groups, vocab_size)
            out[category] = out.get(category, 0) + record.nbytes
        return out

    def moments(
        self, groups: dict[str, set[int]], vocab_size: int
    ) -> Iterator[tuple[str, dict[str, int]]]:
        """(phase, bytes by category) after each event of the step's phases (not "setup" or
        "end"), in order: the live storages, categorised as ``composition`` does."""
        change: dict[int, tuple[str, int]] = {}
        for record in self.records:
            category = self._category(record, groups, vocab_size)
            change[record.born] = (category, record.nbytes)
            if record.died != math.inf:
                change[int(record.died)] = (category, -record.nbytes)
        live: dict[str, int] = {}
        for i, (_, phase_idx) in enumerate(self.events):
            if i in change:
                category, delta = change[i]
                live[category] = live.get(category, 0) + delta
            phase = self.phases[phase_idx]
            if phase not in ("setup", "end"):
                yield phase, dict(live)

    def _category(self, record: Record, groups: dict[str, set[int]], vocab_size: int) -> str:
        if self.live.get(record.key) is record:
            for category, keys in groups.items():
                if record.key in keys:
                    return category
        if record.label:
            return record.label
        if record.copy_of_weight:
            return "temporaries"
        if len(record.shape) >= 2 and record.shape[-1] == vocab_size:
            return "logits"
        if record.phase == "optimizer":
            return "temporaries"
        return "activations"


_COPY_OPS = {torch.ops.aten._to_copy.default}


@contextlib.contextmanager
def offloaded_activations(active: bool, simulate: bool) -> Iterator[None]:
    """Activation offloading as ``torch.autograd.graph.save_on_cpu`` does it: every tensor
    saved for backward is copied to host memory in forward and copied back when backward
    needs it (but where ``kept_on_device`` says otherwise: ``head_on_device``). On a GPU
    (``simulate=False``) that is save_on_cpu(pin_memory=True) itself. On CPU the device and
    the host are one memory, where save_on_cpu copies nothing: the same two hooks then make
    the copies explicitly, and the host copies are labelled OFFLOADED so that the tracker
    keeps them off the device's figures."""
    if not active:
        yield
        return
    if not simulate:
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            yield
        return

    def pack(tensor: torch.Tensor) -> tuple[torch.device, torch.Tensor]:
        with label(OFFLOADED):
            host = torch.empty_like(tensor)
            host.copy_(tensor)
        return tensor.device, host

    def unpack(packed: tuple[torch.device, torch.Tensor]) -> torch.Tensor:
        _, host = packed
        device = torch.empty_like(host)
        device.copy_(host)
        return device

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield


@contextlib.contextmanager
def kept_on_device(active: bool = True) -> Iterator[None]:
    """Saved-tensor hooks that keep every tensor as it is, inside an offloading region: the
    NoOpManager of torchtune's and TRL's activation offloading (only the innermost hooks
    run)."""
    if not active:
        yield
        return
    with torch.autograd.graph.saved_tensors_hooks(lambda tensor: tensor, lambda tensor: tensor):
        yield


@contextlib.contextmanager
def head_on_device(head: torch.nn.Module, active: bool) -> Iterator[None]:
    """What torchtune's and TRL's ``get_act_offloading_ctx_manager`` do to the output head:
    ``kept_on_device`` from the start of its forward to the end, so that what lm_head saves
    stays on the device (bringing it back right away would cost more than it saves)."""
    if not active:
        yield
        return
    regions: list[Any] = []

    def enter(*_args: Any) -> None:
        regions.append(kept_on_device())
        regions[-1].__enter__()

    def leave(*_args: Any) -> None:
        regions.pop().__exit__(None, None, None)

    handles = [
        head.register_forward_pre_hook(enter),
        head.register_forward_hook(leave, always_call=True),
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def fsdp_buffers_are_temporaries(active: bool) -> Iterator[None]:
    """Label what FSDP allocates to gather parameters and reduce gradients as temporaries."""
    if not active:
        yield
        return
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    names = ("unshard", "wait_for_unshard", "post_backward")
    originals = {name: getattr(FSDPParamGroup, name) for name in names}

    def labelled(method: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with label("temporaries"):
                return method(*args, **kwargs)

        return wrapper

    for name, method in originals.items():
        setattr(FSDPParamGroup, name, labelled(method))
    try:
        yield
    finally:
        for name, method in originals.items():
            setattr(FSDPParamGroup, name, method)
