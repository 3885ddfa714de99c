"""CPU stand-ins for bitsandbytes where it is not installed (with its storage layout), the
optimizers measure() uses, and several GPUs simulated in one process. bitsandbytes itself, where
installed, runs through memory/real_bitsandbytes.py (on CPU too).

Private, and needs torch: it is imported only by measure() (memory/measuring.py), after checking that
torch is installed.

- ``Linear4bitStandIn``: bitsandbytes ``Linear4bit`` (NF4, blocks of 64): the weight packed two
  4-bit values per byte, an fp32 absmax per block of 64 (or, with double quantization, a uint8
  absmax per block plus an fp32 constant per 256 blocks), each weight's code tables (16 fp32 NF4
  values; with double quantization a 256-entry fp32 map and an fp32 offset); the bias cast to the
  compute dtype; the forward and the backward each dequantize the weight into a temporary of the
  compute dtype and the output comes back in the input's dtype, as bitsandbytes does.
- ``AdamW8bitStandIn``: bitsandbytes ``AdamW8bit`` / ``PagedAdamW8bit``: uint8 state1 and state2
  per parameter plus one fp32 absmax per block of 256 for each, fp32 states for tensors under
  ``min_8bit_size`` (4096) elements, and two shared 256-entry fp32 quantization maps. Its step
  updates in place and allocates nothing, like bitsandbytes' fused kernel; its arithmetic is not
  bitsandbytes' (only the memory is).
- ``Lion``: one momentum state per parameter (Chen et al. 2023), applied one tensor at a time.
- ``MasterWeightsAdamW``: bf16 parameters and gradients, fp32 master copies and fp32 AdamW states
  in the optimizer; each step makes fp32 copies of the gradients, steps the masters and copies
  them back into the bf16 parameters.
- ``Parallel``: DDP and ZeRO-1/2/3 on several GPUs, simulated in one process for rank 0.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from ..errors import LessonkitError
from . import fsdp1_wrapping, tracking
from .real_bitsandbytes import _bnb_linear4bit, _fake_bnb_linear4bit, bitsandbytes

NF4_BLOCK = 64
NF4_NESTED_BLOCK = 256
OPT8_BLOCK = 256
OPT8_MIN_SIZE = 4096
_LEGACY = [False]  # the stand-in keeps each 4-bit layer's input (bitsandbytes before 0.43.2)


def nf4_bytes(numel: int, double_quant: bool) -> int:
    """Bytes of one weight of ``numel`` elements stored as NF4 (packed values and constants)."""
    blocks = math.ceil(numel / NF4_BLOCK)
    constants = blocks + 4 * math.ceil(blocks / NF4_NESTED_BLOCK) if double_quant else 4 * blocks
    return (numel + 1) // 2 + constants


def adam8bit_state_bytes(numel: int) -> int:
    """Bytes of the two 8-bit AdamW states of a tensor (without the shared quantization maps)."""
    if numel < OPT8_MIN_SIZE:
        return 2 * 4 * numel
    return 2 * (numel + 4 * math.ceil(numel / OPT8_BLOCK))


def make_optimizer(params: list[torch.Tensor], name: str, precision: str, on_gpu: bool) -> Any:
    """The optimizer a run with these settings uses (stand-ins where the real one is GPU-only)."""
    lr = 1e-4

    def adamw(ps: list[torch.Tensor]) -> Any:
        if name == "adamw-fused":
            return torch.optim.AdamW(ps, lr=lr, fused=True)
        return torch.optim.AdamW(ps, lr=lr, foreach=name != "adamw-forloop")

    if name in ("adamw", "adamw-fused", "adamw-forloop"):
        if precision == "bf16-master":
            return MasterWeightsAdamW(params, adamw, lr=lr)
        return adamw(params)
    if name in ("adamw-8bit", "paged-adamw-8bit", "paged-adamw-32bit"):
        bnb = bitsandbytes()
        if bnb is None and name == "paged-adamw-32bit":
            raise LessonkitError(
                "optimizer='paged-adamw-32bit' is measured with bitsandbytes' PagedAdamW32bit: "
                "install bitsandbytes, or measure optimizer='adamw-fused' (the same two states "
                "in the parameters' dtype)."
            )
        if bnb is not None:  # on CPU too (paged states fall back to ordinary ones there)
            import warnings

            cls = {
                "adamw-8bit": bnb.optim.AdamW8bit,
                "paged-adamw-8bit": bnb.optim.PagedAdamW8bit,
                "paged-adamw-32bit": bnb.optim.PagedAdamW32bit,
            }[name]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return cls(params, lr=lr)
        return AdamW8bitStandIn(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, foreach=True)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, foreach=True)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(
            params, lr=lr, scale_parameter=False, relative_step=False, warmup_init=False
        )
    return Lion(params, lr=lr)


@contextlib.contextmanager
def legacy_bnb_saves_input(active: bool) -> Iterator[None]:
    """bitsandbytes before 0.43.2: ``MatMul4Bit.forward`` kept ``ctx.tensors = (A, B)``, the
    layer's input beside the packed weight, when a gradient was needed (the line PR #1270
    changed to ``(None, B)``). Restores that line around the current forward."""
    bnb = bitsandbytes() if active else None
    if bnb is None:
        _LEGACY[0] = active  # the stand-in keeps the input the same way
        try:
            yield
        finally:
            _LEGACY[0] = False
        return
    fn = bnb.autograd._functions.MatMul4Bit
    original = fn.forward

    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = original(ctx, a, b, *args, **kwargs)
        if any(ctx.needs_input_grad[:2]):
            ctx.tensors = (a, b)
        return out

    fn.forward = staticmethod(forward)
    try:
        yield
    finally:
        fn.forward = original


def state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor an optimizer keeps on the accelerator between steps.

    torch's AdamW keeps its step counters on the CPU unless fused (or capturable), so on a GPU
    they take no GPU memory: they are left out here too.
    """
    if hasattr(optimizer, "state_tensors"):
        return optimizer.state_tensors()
    step_on_device = bool(optimizer.defaults.get("fused") or optimizer.defaults.get("capturable"))
    out = [
        value
        for state in optimizer.state.values()
        for key, value in state.items()
        if isinstance(value, torch.Tensor) and (key != "step" or step_on_device)
    ]
    return out + list(getattr(optimizer, "qmaps", {}).values())


def off_device_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Optimizer tensors that ``state_tensors`` leaves out (step counters kept on the CPU)."""
    kept = {id(t) for t in state_tensors(optimizer)}
    every = [
        v
        for state in optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    ]
    inner = getattr(optimizer, "inner", None)
    return [t for t in every if id(t) not in kept] + (
        off_device_tensors(inner) if inner is not None else []
    )


class _Dequantized(torch.autograd.Function):
    """y = x @ W.T with W dequantized in forward and again in backward (never saved)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: Linear4bitStandIn) -> torch.Tensor:
        ctx.layer = layer
        if _LEGACY[0] and ctx.needs_input_grad[0]:
            ctx.kept_input = x.to(layer.compute_dtype)  # bitsandbytes before 0.43.2
        weight = layer.dequantize()
        return (x.to(weight.dtype) @ weight.t()).to(x.dtype)  # back to the input's dtype

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, None]:
        weight = ctx.layer.dequantize()
        return grad_out.to(weight.dtype) @ weight, None


class Linear4bitStandIn(nn.Module):
    """A frozen linear layer stored like bitsandbytes NF4 (see the module docstring)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: nn.Parameter | None,
        compute_dtype: torch.dtype,
        double_quant: bool,
        device: Any = None,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.compute_dtype = compute_dtype
        numel = in_features * out_features
        blocks = math.ceil(numel / NF4_BLOCK)
        self.register_buffer(
            "packed", torch.zeros(((numel + 1) // 2, 1), dtype=torch.uint8, device=device)
        )
        if double_quant:
            self.register_buffer("absmax", torch.zeros(blocks, dtype=torch.uint8, device=device))
            self.register_buffer(
                "nested_absmax",
                torch.zeros(
                    math.ceil(blocks / NF4_NESTED_BLOCK), dtype=torch.float32, device=device
                ),
            )
            self.register_buffer(
                "nested_code", torch.zeros(256, dtype=torch.float32, device=device)
            )
            self.register_buffer("offset", torch.zeros((), dtype=torch.float32, device=device))
        else:
            self.register_buffer("absmax", torch.zeros(blocks, dtype=torch.float32, device=device))
        self.register_buffer("code", torch.zeros(16, dtype=torch.float32, device=device))
        self.bias = bias
        if bias is not None:
            bias.requires_grad_(False)
            bias.data = bias.data.to(compute_dtype)  # bitsandbytes casts it at its forward

    def dequantize(self) -> torch.Tensor:
        """The weight in the compute dtype: a fresh temporary, as bitsandbytes makes it."""
        with tracking.label("temporaries"):
            weight = torch.zeros(
                (self.out_features, self.in_features),
                dtype=self.compute_dtype,
                device=self.packed.device,  # type: ignore[arg-type]
            )
            # Touch the packed values so the result depends on them (the memory is what matters).
            weight.view(-1)[: self.packed.numel()].copy_(self.packed.view(-1))
        return weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _Dequantized.apply(x, self)
        return out + self.bias if self.bias is not None else out


def quantize_linears(
    model: nn.Module,
    compute_dtype: torch.dtype,
    double_quant: bool,
    real: bool = False,
    fake: bool = False,
) -> int:
    """Replace every frozen linear layer inside the decoder blocks by a Linear4bitStandIn
    (or, with ``real`` and bitsandbytes installed, by bitsandbytes' Linear4bit: on the GPU,
    or with ``fake`` on CPU under FakeTensorMode, quantized there by bitsandbytes itself).

    Embeddings, norms and ``lm_head`` stay as they are (as in transformers' default). Works on a
    peft model too: LoRA's own ``lora_A``/``lora_B`` layers are left alone. Returns the count.
    """
    bnb = bitsandbytes() if real else None
    from transformers.pytorch_utils import Conv1D

    count = 0
    for name, module in list(model.named_modules()):
        if ".layers." not in f".{name}." and ".h." not in f".{name}.":
            continue
        for child_name, child in list(module.named_children()):
            if child_name.startswith("lora_") or "lora_" in name:
                continue
            if isinstance(child, nn.Linear):
                in_f, out_f = child.in_features, child.out_features
            elif isinstance(child, Conv1D):
                in_f, out_f = child.weight.shape
            else:
                continue
            if bnb is not None and fake:
                setattr(
                    module,
                    child_name,
                    _fake_bnb_linear4bit(bnb, child, in_f, out_f, compute_dtype, double_quant),
                )
            elif bnb is not None:
                setattr(
                    module,
                    child_name,
                    _bnb_linear4bit(bnb, child, in_f, out_f, compute_dtype, double_quant),
                )
            else:
                setattr(
                    module,
                    child_name,
                    Linear4bitStandIn(
                        in_f,
                        out_f,
                        child.bias,
                        compute_dtype,
                        double_quant,
                        device=child.weight.device,
                    ),
                )
            count += 1
    return count


class AdamW8bitStandIn(torch.optim.Optimizer):
    """bitsandbytes AdamW8bit's state layout, for CPU (see the module docstring)."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-4) -> None:
        super().__init__(params, dict(lr=lr))
        self.qmaps: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    self._init_state(p, state)
                state["step"] += 1
                p.add_(p.grad, alpha=-group["lr"])

    def _init_state(self, p: torch.Tensor, state: dict[str, Any]) -> None:
        state["step"] = 0
        n = p.numel()
        if n < OPT8_MIN_SIZE:
            state["state1"] = torch.zeros_like(p, dtype=torch.float32)
            state["state2"] = torch.zeros_like(p, dtype=torch.float32)
            return
        if not self.qmaps:
            self.qmaps = {
                k: torch.zeros(256, dtype=torch.float32, device=p.device)
                for k in ("dynamic", "udynamic")
            }
        blocks = math.ceil(n / OPT8_BLOCK)
        state["state1"] = torch.zeros_like(p, dtype=torch.uint8)
        state["qmap1"] = self.qmaps["dynamic"]
        state["state2"] = torch.zeros_like(p, dtype=torch.uint8)
        state["qmap2"] = self.qmaps["udynamic"]
        state["absmax1"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
        state["absmax2"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)


class Lion(torch.optim.Optimizer):
    """Lion (sign of an interpolated momentum), one state per parameter, one tensor at a time."""

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                exp_avg = state["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                update = exp_avg * beta1 + p.grad * (1 - beta1)
                p.add_(update.sign_(), alpha=-group["lr"])
                exp_avg.mul_(beta2).add_(p.grad, alpha=1 - beta2)


class MasterWeightsAdamW(torch.optim.Optimizer):
    """AdamW on fp32 master copies of bf16 parameters (see the module docstring)."""

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        make_inner: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
        lr: float = 1e-4,
    ) -> None:
        params = list(params)
        super().__init__(params, dict(lr=lr))
        # fp32 parameters (e.g. LoRA adapters kept in fp32) are their own masters.
        self.masters = [
            p if p.dtype == torch.float32 else p.detach().float().requires_grad_(True)
            for p in params
        ]
        self.inner = make_inner(self.masters)

    def state_tensors(self) -> list[torch.Tensor]:
        """The master copies and the inner optimizer's states."""
        params = {id(p) for group in self.param_groups for p in group["params"]}
        return [m for m in self.masters if id(m) not in params] + state_tensors(self.inner)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:
        params = [p for group in self.param_groups for p in group["params"]]
        copies = [(p, m) for p, m in zip(params, self.masters, strict=True) if m is not p]
        for p, master in copies:
            master.grad = None if p.grad is None else p.grad.float()
        self.inner.step()
        for p, master in copies:
            p.copy_(master)
            master.grad = None


# ----- several GPUs, simulated in one process (rank 0's share) --------------------------------
class Parallel:
    """How a step is spread over ``n_gpus``: DDP (ZeRO-0), ZeRO-1/2 or ZeRO-3 (FSDP2).

    - ZeRO-0 with several GPUs: DDP's gradient buckets, a second copy of the gradients
      (``gradient_as_bucket_view=False``, the default), allocated once up front.
    - ZeRO-1: full parameters and gradients; the optimizer steps rank 0's shard, a
      ``ceil(numel / n)`` slice of every trainable tensor (a view: the update lands in place).
    - ZeRO-2: as ZeRO-1, but each gradient is reduced to rank 0's slice as soon as it is ready
      and the full gradient is freed (no bucket buffers are modelled).
    - ZeRO-3: FSDP2 ``fully_shard`` on every decoder layer and the root, with a fake process
      group of ``n`` ranks; all-gathered parameters and FSDP's buffers count as temporaries.
      With ``param_dtype`` (the "-mixed" precisions), FSDP's mixed precision:
      ``MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)`` gathers
      each layer in 16 bits from fp32 shards and reduces the gradients in fp32.
      ``fsdp_version=1``: FSDP1 instead (memory/fsdp1_wrapping.py): one flat parameter per
      decoder layer and the root, ``use_orig_params=True``.
    - offload_optimizer: the optimizer states and its step live in CPU memory (not counted).
    """

    def __init__(
        self,
        n_gpus: int,
        zero_stage: int,
        offload_optimizer: bool,
        param_dtype: torch.dtype | None = None,
        fsdp_version: int = 2,
    ) -> None:
        self.n, self.stage, self.offload = n_gpus, zero_stage, offload_optimizer
        self.param_dtype = param_dtype
        self.flat = zero_stage == 3 and fsdp_version == 1  # FSDP1's flat parameters
        self.model: nn.Module | None = None
        self.no_sync = fsdp1_wrapping.NoSync()
        self.shards: list[tuple[torch.Tensor, torch.Tensor]] = []  # (parameter, its shard)
        self.buckets: list[torch.Tensor] = []
        self.mesh: Any = None  # the device mesh of a (fake) process group, for ZeRO-3

    def prepare(self, model: nn.Module) -> nn.Module:
        if self.flat:
            self.model = fsdp1_wrapping.wrap(model, self.param_dtype)
            return self.model
        if self.stage == 3:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            policy = MixedPrecisionPolicy()
            if self.param_dtype is not None:
                policy = MixedPrecisionPolicy(
                    param_dtype=self.param_dtype, reduce_dtype=torch.float32
                )
            for module in model.modules():
                if isinstance(module, nn.ModuleList):
                    for layer in module:
                        fully_shard(layer, mesh=self.mesh, mp_policy=policy)
            fully_shard(model, mesh=self.mesh, mp_policy=policy)
        return model

    def optimizer_params(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """The tensors the optimizer steps: the parameters, or rank 0's slices of them."""
        if self.stage not in (1, 2):
            if self.stage == 0 and self.n > 1:
                by_dtype: dict[torch.dtype, int] = {}
                for p in params:
                    by_dtype[p.dtype] = by_dtype.get(p.dtype, 0) + p.numel()
                self.buckets = [
                    torch.zeros(n, dtype=d, device=params[0].device) for d, n in by_dtype.items()
                ]
            return params
        for p in params:
            shard = p.detach().view(-1)[: math.ceil(p.numel() / self.n)]
            self.shards.append((p, shard))
            if self.stage == 2:
                p.register_post_accumulate_grad_hook(self._reduce_scatter(shard))
        return [shard for _, shard in self.shards]

    @staticmethod
    def _reduce_scatter(shard: torch.Tensor) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            assert param.grad is not None  # the hook runs after the gradient is accumulated
            piece = param.grad.view(-1)[: shard.numel()]
            if shard.grad is None:
                shard.grad = piece.clone()
            else:
                shard.grad.add_(piece)
            param.grad = None

        return hook

    def before_step(self) -> None:
        """ZeRO-1: the optimizer reads rank 0's slice of each (all-reduced) gradient."""
        if self.stage == 1:
            for p, shard in self.shards:
                shard.grad = None if p.grad is None else p.grad.view(-1)[: shard.numel()]

    def synchronize_gradients(self, model: nn.Module, synchronize: bool) -> None:
        """no_sync: reduce the gradients (``synchronize``) or keep accumulating them unreduced
        on each rank: FSDP2's ``set_requires_gradient_sync``; DDP and ZeRO-1 keep full
        gradients either way, so only the reduction (not simulated) is skipped."""
        if self.flat:
            self.no_sync.set(model, synchronize)
        elif self.stage == 3:
            model.set_requires_gradient_sync(synchronize)

    def unsynced_gradients(self, model: nn.Module) -> list[torch.Tensor]:
        """The gradients a rank holds unreduced between micro-batches under no_sync."""
        if self.flat:
            return fsdp1_wrapping.flat_gradients(model)
        if self.stage != 3:
            return [p.grad for p in model.parameters() if p.grad is not None] + self.buckets
        from torch.distributed.fsdp import FSDPModule

        held = []
        try:  # FSDP2's own records of each parameter (private, so checked)
            for module in model.modules():
                if not isinstance(module, FSDPModule):
                    continue
                group = module._get_fsdp_state()._fsdp_param_group
                for fsdp_param in group.fsdp_params if group else []:
                    grad = fsdp_param.unsharded_accumulated_grad
                    if grad is None:
                        grad = fsdp_param._unsharded_param.grad
                    if grad is not None:
                        held.append(grad)
        except AttributeError as err:
            raise LessonkitError(
                f"measure cannot follow no_sync's gradients with torch {torch.__version__} "
                f"(FSDP2 changed: {err}); estimate(no_sync=True) still works."
            ) from None
        return held

    def gradient_tensors(self) -> list[torch.Tensor]:
        if self.flat and self.model is not None:  # the flat gradients, frozen tensors' part too
            return fsdp1_wrapping.flat_gradients(self.model)
        return self.buckets + [s.grad for _, s in self.shards if s.grad is not None]

    def parameters(self, model: nn.Module) -> list[torch.Tensor]:
        """The parameters' storage on this rank: FSDP1's local flat shards (its original
        parameters are views into them, or into a gathered unit), else the parameters."""
        if self.flat:
            return fsdp1_wrapping.local_shards(model)
        return list(model.parameters())

    def trainable_parameters(self, params: list[torch.Tensor]) -> int:
        """Elements of the trained tensors (FSDP1's views hold only this rank's part)."""
        if self.flat and self.model is not None:
            return fsdp1_wrapping.trainable_parameters(self.model)
        return sum(p.numel() for p in params)

    def buffers_are_temporaries(self) -> contextlib.AbstractContextManager[None]:
        """Label FSDP's gathered parameters and reduction buffers as temporaries."""
        if self.flat:
            return fsdp1_wrapping.tracked()
        return tracking.fsdp_buffers_are_temporaries(self.stage == 3)


@contextlib.contextmanager
def fake_process_group(world_size: int) -> Iterator[Any]:
    """A process group of ``world_size`` ranks that communicates nothing (this is rank 0);
    yields its device mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise LessonkitError(
            "measure simulates several GPUs with its own process group; "
            "call it outside torch.distributed."
        )
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (world_size,))
    finally:
        dist.destroy_process_group()
