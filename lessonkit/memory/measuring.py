"""measure(): the memory of one real PyTorch training step, the ground truth for estimate().

On CPU (the default) the step runs under FakeTensorMode: every operator of a real transformers
model runs on tensors that have shapes, dtypes and storages but no data, so nothing is
allocated and a 7B-shaped step takes seconds. A small dispatch mode (memory/tracking.py) follows every
storage. On a CUDA device the step runs for real and the CUDA allocator's figures are added.

The step: one untracked optimizer step on zero gradients (so the optimizer states exist, the
steady state), ``zero_grad(set_to_none=True)``, then the tracked step: ``gradient_accumulation``
x (forward with loss, backward), then ``optimizer.step()``. Categories at the peak:

- weights: parameters and buffers (for QLoRA the packed 4-bit weights and their constants);
- gradients: the ``.grad`` of trainable parameters;
- optimizer: optimizer states, including fp32 master weights where the precision keeps them;
- logits: tensors shaped [..., vocab]: the logits, their fp32 copy, log-softmax, their gradients;
- temporaries: compute-dtype copies of weights (autocast's 16-bit copies, dequantized QLoRA
  weights) and anything else created inside ``optimizer.step()``;
- activations: everything else created during forward and backward (saved tensors, inputs);
- cuda_context, allocator_margin: 0 on CPU.

``report.settings["measured"]`` adds the persistent sizes, whatever the phase of the peak:
``parameter_bytes`` (parameters only), ``buffer_bytes`` (buffers, e.g. rotary tables and QLoRA's
packed weights), ``gradient_bytes``, ``optimizer_bytes``, ``trainable_parameters``, the attention
implementation used, per-micro-batch forward peaks with gradient accumulation, and on a GPU the
allocator's and driver's figures. Several GPUs are simulated for rank 0 (see standins.Parallel);
ZeRO-3 with a "-mixed" precision runs FSDP2's MixedPrecisionPolicy instead of autocast
(``fsdp_version=1``: FSDP1, memory/fsdp1_wrapping.py, with its MixedPrecision).

This module imports without torch (measure() says what to install); its helpers, the private
modules memory/tracking.py and memory/standins.py, need torch and are imported only inside measure().
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

from ..errors import LessonkitError
from ..models.presets import resolve_model
from ..models.spec import DEFAULT_LORA_TARGETS, ModelSpec
from .report import PHASES, MemoryReport
from .settings import MAX_ACCUMULATION, RunSettings, lora_on_experts, validate_run

MAX_MEASURED_MICRO_BATCHES = 64  # measure runs each one; estimate() takes up to MAX_ACCUMULATION


def measure(
    model: Any,
    *,
    method: str = "full",
    precision: str | None = None,
    optimizer: str = "adamw",
    batch_size: int = 1,
    seq_len: int = 512,
    gradient_checkpointing: bool = False,
    lora_rank: int = 16,
    lora_targets: tuple[str, ...] | str = DEFAULT_LORA_TARGETS,
    n_gpus: int = 1,
    zero_stage: int = 0,
    attention: str = "sdpa",
    offload_optimizer: bool = False,
    double_quant: bool = True,
    lora_dtype: str = "fp32",
    gradient_accumulation: int = 1,
    device: str = "cpu",
    lora_dropout: float = 0.0,
    bitsandbytes: str = "current",
    activation_offload: bool = False,
    optimizer_in_backward: bool = False,
    loss: str = "standard",
    loss_chunks: int = 8,
    no_sync: bool = False,
    fsdp_version: int = 2,
    compile: bool = False,
) -> MemoryReport:
    """Measure the peak memory per GPU of one training step of ``model`` (see the module doc).

    Takes the same keyword arguments as ``estimate`` (``precision`` defaults to the method's
    usual precision there too); ``device="cpu"`` measures under FakeTensorMode (no memory is
    used), ``device="cuda"`` runs the step on the GPU.
    """
    spec = resolve_model(model)
    settings = validate(
        spec,
        method=method,
        precision=precision,
        optimizer=optimizer,
        batch_size=batch_size,
        seq_len=seq_len,
        gradient_checkpointing=gradient_checkpointing,
        lora_rank=lora_rank,
        lora_targets=lora_targets,
        n_gpus=n_gpus,
        zero_stage=zero_stage,
        attention=attention,
        offload_optimizer=offload_optimizer,
        double_quant=double_quant,
        lora_dtype=lora_dtype,
        gradient_accumulation=gradient_accumulation,
        device=device,
        lora_dropout=lora_dropout,
        bitsandbytes=bitsandbytes,
        activation_offload=activation_offload,
        optimizer_in_backward=optimizer_in_backward,
        loss=loss,
        loss_chunks=loss_chunks,
        no_sync=no_sync,
        fsdp_version=fsdp_version,
        compile=compile,
    )
    _require_torch()
    if settings.device == "cuda":
        return measure_cuda(spec, settings)
    return run_step(spec, settings, fake=True)[0]


def validate(spec: ModelSpec, **kw: Any) -> RunSettings:
    """estimate()'s checks (settings.validate_run), then what measure cannot run."""
    s = validate_run(spec, **kw)
    if s.gradient_accumulation > MAX_MEASURED_MICRO_BATCHES:
        raise LessonkitError(
            f"measure runs every micro-batch, so it takes at most {MAX_MEASURED_MICRO_BATCHES} "
            f"(gradient_accumulation={s.gradient_accumulation}); the memory does not change "
            f"after the second, and estimate() takes up to {MAX_ACCUMULATION:,}."
        )
    if spec.n_experts and s.precision not in ("bf16", "bf16-master"):
        raise LessonkitError(
            f"measure runs {spec.name}'s experts with torch's grouped matmul, which takes bf16 "
            f"weights only: use precision='bf16' or 'bf16-master' (got {s.precision!r}); "
            "estimate() takes the others."
        )
    if s.method == "qlora" and s.n_gpus > 1 and s.zero_stage > 0:
        raise LessonkitError(
            "measure cannot shard a QLoRA model across GPUs (its 4-bit "
            "weights are a CPU stand-in); use zero_stage=0 or one GPU. "
            "estimate() takes ZeRO-1/2 with QLoRA."
        )
    return s


def _require_torch() -> None:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise LessonkitError(
            "measure needs torch and transformers: pip install 'lessonkit[measure]'."
        ) from None


# ----- building the model and the optimizer ------------------------------------------------
def dtypes(settings: RunSettings) -> tuple[Any, Any]:
    """(dtype of the weights, dtype of the computation) for a precision."""
    import torch

    return {
        "fp32": (torch.float32, torch.float32),
        "bf16-mixed": (torch.float32, torch.bfloat16),
        "fp16-mixed": (torch.float32, torch.float16),
        "bf16": (torch.bfloat16, torch.bfloat16),
        "bf16-master": (torch.bfloat16, torch.bfloat16),
    }[settings.precision]


def build_model(spec: ModelSpec, settings: RunSettings, device: str) -> Any:
    """The transformers model (with LoRA / QLoRA stand-ins) on ``device`` ("meta" or real)."""
    import torch
    import transformers

    weight_dtype, compute_dtype = dtypes(settings)
    attn = "eager" if settings.attention == "eager" else "sdpa"
    with torch.device(device):
        try:
            model = transformers.AutoModelForCausalLM.from_config(
                spec.to_hf_config(), attn_implementation=attn, dtype=weight_dtype
            )
        except ValueError as err:  # e.g. Gemma-2 runs with eager attention only
            if "attention implementation" not in str(err):
                raise
            model = transformers.AutoModelForCausalLM.from_config(
                spec.to_hf_config(), attn_implementation="eager", dtype=weight_dtype
            )
    if getattr(model, "loss_type", "") is None:
        # GPT-2's class name matches no entry of transformers' loss table, which then warns at
        # every step before using the causal-LM loss anyway: name that loss up front.
        model.loss_type = "ForCausalLM"
    if settings.method != "full":
        import peft

        targets = settings.lora_targets
        experts = lora_on_experts(settings)  # 3D weights: peft's target_parameters
        lora = peft.LoraConfig(
            r=settings.lora_rank,
            lora_alpha=2 * settings.lora_rank,
            lora_dropout=settings.lora_dropout,
            task_type="CAUSAL_LM",
            target_modules=(
                targets if isinstance(targets, str) else [t for t in targets if t not in experts]
            ),
            target_parameters=[f"mlp.{name}" for name in experts] or None,
        )
        with warnings.catch_warnings():  # deprecations inside peft; GPT-2's Conv1D notice
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", UserWarning)
            # peft's patterns for the fused experts of transformers 5's weight conversion,
            # set for every model, warn where a model has no such experts
            warnings.filterwarnings("ignore", ".*did not match any targeted module", RuntimeWarning)
            warnings.filterwarnings("ignore", ".*no parameter was matched", RuntimeWarning)
            model = peft.get_peft_model(model, lora, autocast_adapter_dtype=True)
        if settings.lora_dtype == "bf16":
            for name, param in model.named_parameters():
                if "lora_" in name:
                    param.data = param.data.to(torch.bfloat16)
        if settings.method == "qlora" and not (device == "meta" and real_bitsandbytes()):
            from .standins import quantize_linears

            quantize_linears(model, compute_dtype, settings.double_quant, real=device != "meta")
    model.train()
    return model


def real_bitsandbytes() -> bool:
    """Whether bitsandbytes is installed and imports (0.50 runs its 4-bit layers and 8-bit
    optimizers on CPU, under FakeTensorMode too); otherwise measure uses stand-ins."""
    from .real_bitsandbytes import bitsandbytes

    return bitsandbytes() is not None


def finish_model(model: Any, spec: ModelSpec, settings: RunSettings) -> None:
    """Re-tie embeddings and switch on gradient checkpointing after materialising."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if spec.tie_embeddings:
        base.tie_weights()
    if settings.gradient_checkpointing:
        kwargs = {"use_reentrant": False}
        with warnings.catch_warnings():  # the old name is deprecated in newer transformers
            warnings.simplefilter("ignore", FutureWarning)
            if hasattr(base, "activation_checkpointing_enable"):
                base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:
                base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
            if settings.method != "full":
                model.enable_input_require_grads()


@contextlib.contextmanager
def unpacked_sequences() -> Iterator[None]:
    """transformers inspects position ids to detect packed sequences; fake tensors have no
    values, and for an ordinary batch the answer is None."""
    import transformers.masking_utils as masking

    original = masking.find_packed_sequence_indices
    masking.find_packed_sequence_indices = lambda *args, **kwargs: None
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = original


# ----- one tracked training step -------------------------------------------------------------
def run_step(
    spec: ModelSpec, settings: RunSettings, *, fake: bool = True, device: str = "cpu"
) -> tuple[MemoryReport, Any]:
    """Build the model, warm the optimizer up, and track one training step.

    ``fake=False`` allocates everything for real on ``device`` (for checking the fake run on
    small models, and on a GPU). Returns the report and the tracker.
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .real_bitsandbytes import prepare_fake_bitsandbytes, quant_state_tensors
    from .standins import (
        Parallel,
        fake_process_group,
        legacy_bnb_saves_input,
        make_optimizer,
        off_device_tensors,
        quantize_linears,
        state_tensors,
    )
    from .tracking import (
        Tracker,
        head_on_device,
        offloaded_activations,
        storage_keys,
        tensor_bytes,
    )

    _, compute_dtype = dtypes(settings)
    # ZeRO-3 with a "-mixed" precision is FSDP's mixed precision, not autocast
    parallel = Parallel(
        settings.n_gpus,
        settings.zero_stage,
        settings.offload_optimizer,
        param_dtype=compute_dtype if settings.sharded_mixed else None,
        fsdp_version=settings.fsdp_version,
    )
    with contextlib.ExitStack() as stack:
        stack.enter_context(unpacked_sequences())
        if settings.zero_stage == 3:
            parallel.mesh = stack.enter_context(fake_process_group(settings.n_gpus))
        real_bnb = real_bitsandbytes()
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message="Paged optimizers are not supported on CPU")
        if fake:
            model = build_model(spec, settings, "meta")
            if real_bnb:
                prepare_fake_bitsandbytes()
            stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
            model.to_empty(device="cpu")
            if settings.method == "qlora" and real_bnb:
                quantize_linears(model, compute_dtype, settings.double_quant, real=True, fake=True)
        else:
            torch.manual_seed(0)
            model = build_model(spec, settings, device)
        finish_model(model, spec, settings)
        model = parallel.prepare(model)
        params: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
        # the optimizer step in backward: one optimizer per parameter (see step_in_backward)
        optimizers = [
            make_optimizer(group, settings.optimizer, settings.precision, on_gpu=device == "cuda")
            for group in (
                [[p] for p in params]
                if settings.optimizer_in_backward
                else [parallel.optimizer_params(params)]
            )
        ]
        for optimizer in optimizers:  # warm-up: a step on zero gradients makes the states
            for group in optimizer.param_groups:
                for p in group["params"]:
                    p.grad = torch.zeros_like(p)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        ids = torch.randint(
            0, spec.vocab_size, (settings.batch_size, settings.seq_len), device=device
        )
        autocast = settings.mixed and not settings.sharded_mixed
        cross_entropy = None
        if settings.compile:  # each layer traced once, before anything is tracked
            from .compiled_trace import compiled_cross_entropy, compiled_layers

            stack.enter_context(compiled_layers(model))
            if settings.loss == "chunked":  # torchtune's compile_loss
                cross_entropy = compiled_cross_entropy()
            # traced under the step's own autocast: AOTAutograd keeps its first trace
            with torch.autocast(device, dtype=compute_dtype, enabled=autocast):
                loss = step_loss(model, ids, settings, cross_entropy)
            loss.backward()
            del loss
            for param in params:
                param.grad = None
        weights = parallel.parameters(model) + list(model.buffers()) + quant_state_tensors(model)
        tracker = Tracker()
        tracker.ignored = storage_keys([t for o in optimizers for t in off_device_tensors(o)])
        for t in weights:
            tracker.add(t)
        tracker.weight_keys = set(tracker.live)
        states = (
            [] if settings.offload_optimizer else [t for o in optimizers for t in state_tensors(o)]
        )
        if settings.optimizer_in_backward:
            stack.enter_context(
                step_in_backward(dict(zip(params, optimizers, strict=True)), tracker)
            )
        for t in states + parallel.gradient_tensors():
            tracker.add(t)
        tracker.add(ids, phase="forward")
        stack.enter_context(parallel.buffers_are_temporaries())
        stack.enter_context(
            legacy_bnb_saves_input(
                settings.method == "qlora" and settings.bitsandbytes == "before-0.43.2"
            )
        )
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        stack.enter_context(
            offloaded_activations(settings.activation_offload, simulate=device != "cuda")
        )
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        stack.enter_context(
            head_on_device(base.get_output_embeddings(), settings.activation_offload)
        )
        unsynced_bytes = 0  # the gradients kept unreduced between micro-batches (no_sync)
        with tracker:
            for micro_batch in range(settings.gradient_accumulation):
                last = micro_batch == settings.gradient_accumulation - 1
                if settings.no_sync:
                    parallel.synchronize_gradients(model, last)
                tracker.set_phase("forward")
                with torch.autocast(device, dtype=compute_dtype, enabled=autocast):
                    loss = step_loss(model, ids, settings, cross_entropy)
                if settings.gradient_accumulation > 1:
                    loss = loss / settings.gradient_accumulation
                tracker.set_phase("backward")
                loss.backward()
                del loss
                if settings.no_sync and not last:
                    kept = parallel.unsynced_gradients(model)
                    unsynced_bytes = tensor_bytes(kept)
                    for key in storage_keys(kept):  # gradients while they live (the last
                        if key in tracker.live:  # micro-batch frees them)
                            tracker.live[key].label = "gradients"
                    del kept
            tracker.set_phase("optimizer")
            parallel.before_step()
            if not (settings.offload_optimizer or settings.optimizer_in_backward):
                optimizers[0].step()
            tracker.set_phase("end")
        if settings.offload_optimizer:  # the step runs on the CPU copy: nothing on the GPU
            optimizers[0].step()
        if device == "cuda":
            torch.cuda.synchronize()

        grads = [p.grad for p in params if p.grad is not None] + parallel.gradient_tensors()
        groups = {
            "weights": storage_keys(weights),
            "gradients": storage_keys(grads),
            "optimizer": storage_keys(states),
        }
        occurrences, peak_event = tracker.peaks()
        breakdown = tracker.composition(peak_event, groups, spec.vocab_size)
        from .timeline import from_moments

        timeline = from_moments(tracker.moments(groups, spec.vocab_size), "measure")
        measured = {
            "attention_implementation": getattr(model.config, "_attn_implementation", None),
            "parameter_bytes": tensor_bytes(parallel.parameters(model)),
            "buffer_bytes": tensor_bytes(list(model.buffers()) + quant_state_tensors(model)),
            "trainable_parameters": parallel.trainable_parameters(params),
            # with no_sync, the unreduced gradients held between micro-batches
            "gradient_bytes": unsynced_bytes if settings.no_sync else tensor_bytes(grads),
            "optimizer_bytes": tensor_bytes(states),
            "cpu_only": fake and cpu_kernels_differ(spec, settings),
        }
        if settings.activation_offload:
            measured["offloaded_peak_bytes"] = tracker.host_peak
        managed = _paged_state_bytes(settings.optimizer, optimizers)
    phase_peaks: dict[str, int] = {}
    for phase, level in occurrences:
        if phase in PHASES:
            phase_peaks[phase] = max(phase_peaks.get(phase, 0), level)
    peak_phase = tracker.phases[tracker.events[peak_event][1]]
    if settings.gradient_accumulation > 1:
        measured["micro_batch_forward_peaks"] = [lv for ph, lv in occurrences if ph == "forward"]
    how = "under FakeTensorMode on CPU" if fake else f"with real tensors on {device.upper()}"
    report = MemoryReport(
        model=spec,
        settings=settings.as_dict() | {"measured": measured},
        breakdown=breakdown,
        peak_phase=peak_phase,
        phase_peaks=phase_peaks,
        assumptions=assumptions(spec, settings, measured),
        source=f"measured: one training step {how} (torch {torch.__version__})",
        timeline_source=timeline,
        managed_bytes=min(managed, breakdown.get("optimizer", 0)),
    )
    return report, tracker


def _paged_state_bytes(optimizer: str, optimizers: list[Any]) -> int:
    """Bytes of the states a paged bitsandbytes optimizer puts in CUDA managed memory on a GPU
    (state1, state2 of each tensor of at least 1e5 elements, as its get_state_buffer does); on
    CPU bitsandbytes keeps them as ordinary tensors, so they are found in the measured states."""
    import torch

    from .optimizers import PAGED, PAGED_MIN_SIZE

    if optimizer not in PAGED:
        return 0
    total = 0
    for each in optimizers:
        for param, state in getattr(each, "state", {}).items():
            if param.numel() < PAGED_MIN_SIZE:
                continue
            for key in ("state1", "state2"):
                buffer = state.get(key)
                if isinstance(buffer, torch.Tensor):
                    total += buffer.numel() * buffer.element_size()
    return total


def step_loss(model: Any, ids: Any, settings: RunSettings, cross_entropy: Any = None) -> Any:
    """The step's loss: the model's own (transformers' ForCausalLMLoss) or the chunked one,
    whose chunks' cross-entropy is ``cross_entropy`` when given (compiled)."""
    if settings.loss == "chunked":
        return chunked_loss(
            model, ids, settings.loss_chunks, cross_entropy, settings.activation_offload
        )
    return model(input_ids=ids, labels=ids, use_cache=False).loss


def chunked_loss(
    model: Any, ids: Any, chunks: int, cross_entropy: Any = None, offload: bool = False
) -> Any:
    """torchtune's chunked cross-entropy (CEWithChunkedOutputLoss with its recipes' model
    output): lm_head applied to each of ``chunks`` pieces of the sequence, and each piece's
    logits upcast to fp32 and reduced by cross-entropy in turn; the same lines as
    torchtune/modules/loss/ce_chunked_output_loss.py, with the labels shifted as its recipes
    do (the last position ignored). With ``offload``, the loss runs outside the offloading
    region, as torchtune's recipes compute it after the model's forward."""
    # through the model's own call, so that what wraps it runs (FSDP2's hooks on the root,
    # FSDP1's root forward: they gather the embeddings, the final norm and lm_head), with the
    # loss as the forward of the module inside
    inner = getattr(model, "_fsdp_wrapped_module", model)
    own_forward = inner.__dict__.get("forward")
    inner.forward = lambda: _chunked_loss(model, ids, chunks, cross_entropy, offload)
    try:
        return model()
    finally:
        if own_forward is None:
            del inner.forward
        else:
            inner.forward = own_forward


def _chunked_loss(model: Any, ids: Any, chunks: int, cross_entropy: Any, offload: bool) -> Any:
    import torch
    import torch.nn.functional as F

    from .tracking import kept_on_device

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    hidden = base.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
    head = base.get_output_embeddings()
    with kept_on_device(offload):
        logits = [head(piece) for piece in hidden.tensor_split(chunks, dim=1)]
        del hidden
        labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)
        total = (labels != -100).sum()
        pieces = [piece.reshape(-1) for piece in labels.tensor_split(chunks, dim=1)]
        loss: Any = 0.0
        for logit, label in zip(logits, pieces, strict=True):
            logit = logit.reshape(-1, logit.size(-1))
            if cross_entropy is not None:  # the upcast happens inside the compiled region
                loss = loss + cross_entropy(logit, label)
            else:
                loss = loss + F.cross_entropy(
                    logit.float(), label, ignore_index=-100, reduction="sum"
                )
        del logits
    return loss / total


@contextlib.contextmanager
def step_in_backward(optimizers: dict[Any, Any], tracker: Any) -> Iterator[None]:
    """The optimizer step fused into backward, as PyTorch's tutorial and torchtune's
    optimizer_in_bwd do it: a hook after each parameter's gradient is accumulated steps that
    parameter's own optimizer and frees the gradient. The gradient is filed under gradients,
    the step's own allocations under temporaries."""
    from .tracking import label

    def hook(param: Any) -> None:
        record = tracker.live.get(param.grad.untyped_storage()._cdata)
        if record is not None:
            record.label = "gradients"
        with label("temporaries"):
            optimizers[param].step()
        optimizers[param].zero_grad(set_to_none=True)

    handles = [p.register_post_accumulate_grad_hook(hook) for p in optimizers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def cpu_kernels_differ(spec: ModelSpec, settings: RunSettings) -> bool:
    """Whether CPU kernels keep more than CUDA's would for this run: any dropout (GPT-2's own,
    peft's lora_dropout) keeps its mask in the input's dtype on CPU (bool on CUDA), and with
    dropout CPU SDPA takes the math path (seq x seq matrices)."""
    return spec.family == "gpt2" or (settings.method != "full" and settings.lora_dropout > 0)


def measure_cuda(spec: ModelSpec, settings: RunSettings) -> MemoryReport:
    """Run the step on the current CUDA device and add the allocator's and driver's figures.

    Tensor categories come from the same storage tracking as on CPU. ``allocator_margin`` is
    ``max_memory_reserved`` minus the tracked tensor peak (block rounding, library workspaces,
    fragmentation); ``cuda_context`` is the memory the driver reports in use minus what the
    caching allocator holds (the CUDA context, and any other process on the GPU).
    """
    import torch

    if not torch.cuda.is_available():
        raise LessonkitError(
            "device='cuda' needs a CUDA GPU, and torch.cuda.is_available() is "
            "False here. Use device='cpu' to measure under FakeTensorMode."
        )
    if settings.n_gpus > 1 or settings.zero_stage > 0:
        raise LessonkitError(
            "On a GPU measure runs on one GPU; simulate several GPUs and ZeRO with device='cpu'."
        )
    torch.cuda.empty_cache()
    report, _ = run_step(spec, settings, fake=False, device="cuda")
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    reserved_now = torch.cuda.memory_reserved()
    cuda = {
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "driver_used_bytes": total - free,
        "device_total_bytes": total,
        "device_name": torch.cuda.get_device_name(),
    }
    tracked = report.tensor_bytes
    report.breakdown["allocator_margin"] = max(0, cuda["max_memory_reserved"] - tracked)
    report.breakdown["cuda_context"] = max(0, cuda["driver_used_bytes"] - reserved_now)
    report.settings["measured"]["cuda"] = cuda
    report.assumptions.append(
        f"On {cuda['device_name']}: max_memory_allocated {cuda['max_memory_allocated'] / 2**30:.3f}"
        f" GiB, max_memory_reserved {cuda['max_memory_reserved'] / 2**30:.3f} GiB, tracked "
        f"tensors {tracked / 2**30:.3f} GiB; the CUDA context is what the driver reports in use "
        f"beyond the allocator's reserve (other processes on the GPU included)."
    )
    return report


COMPILED_NOTE = (
    "compile=True: each decoder layer runs through AOTAutograd with inductor's partitioner "
    "(min_cut_rematerialization_partition), so a layer keeps the partitioner's saved tensors "
    "for backward, fewer and others than eager mode (its backward recomputes the rest); the "
    "embeddings, the head and the standard loss run eagerly; the graphs run with eager kernels."
)
COMPILED_LOSS_NOTE = (
    " The chunked loss's cross-entropy of each chunk is compiled too (torchtune's compile_loss "
    "of compute_cross_entropy), with inductor's decompositions; its graphs make only their "
    "outputs, as inductor's fused kernels do."
)
_PARALLEL_NOTES = (
    "Per GPU of {n} with DDP: as one GPU plus DDP's gradient buckets (a second copy of the "
    "gradients, gradient_as_bucket_view=False).",
    "Per GPU of {n} with ZeRO-1 (rank 0, the largest share): full weights and gradients, "
    "optimizer states for a 1/{n} slice of every tensor.",
    "Per GPU of {n} with ZeRO-2 (rank 0, the largest share): full weights; each gradient is "
    "reduced to a 1/{n} slice as soon as it is ready (bucket buffers not modelled); optimizer "
    "states for that slice.",
    "Per GPU of {n} with ZeRO-3, simulated with FSDP2 fully_shard (per decoder layer and root) "
    "on a fake process group: weights, gradients and optimizer states sharded 1/{n}; the "
    "gathered weights of the layers in use and FSDP's buffers count as temporaries.",
)


_FSDP1_NOTE = (
    "Per GPU of {n} with ZeRO-3, simulated with FSDP1 FullyShardedDataParallel (one flat "
    "parameter per decoder layer and the root, use_orig_params=True, torch's defaults "
    "otherwise: FULL_SHARD, BACKWARD_PRE prefetch, no forward prefetch) on a fake process "
    "group: each flat parameter, its gradient and the optimizer states of the tensors in this "
    "rank's 1/{n} slice; gathered units and FSDP's buffers count as temporaries."
)


def assumptions(spec: ModelSpec, settings: RunSettings, measured: dict[str, Any]) -> list[str]:
    """What the measurement did, in words, for the report."""
    s = settings
    real_bnb = real_bitsandbytes()
    notes = [
        "Steady state: the optimizer states exist from a previous step; gradients are "
        "set to None between steps (zero_grad(set_to_none=True))."
    ]
    half = "fp16" if s.precision.startswith("fp16") else "bf16"
    notes.append(
        (
            f"FSDP1 mixed precision, MixedPrecision(param_dtype={half}, reduce_dtype=fp32), "
            if s.fsdp_version == 1
            else f"FSDP2 mixed precision, MixedPrecisionPolicy(param_dtype={half}, "
            "reduce_dtype=fp32), "
        )
        + "without autocast: fp32 shards of the weights, gradients and optimizer states; each "
        f"layer is gathered in {half}; gradients are reduced in fp32."
        if s.sharded_mixed
        else {
            "fp32": "fp32 weights, gradients and optimizer states.",
            "bf16-mixed": "fp32 weights under bf16 autocast; autocast's bf16 weight copies are "
            "counted as temporaries.",
            "fp16-mixed": "fp32 weights under fp16 autocast; autocast's fp16 weight copies are "
            "counted as temporaries (no loss scaler).",
            "bf16": (
                "Pure bf16: weights, gradients and optimizer states in bf16."
                if s.method == "full"
                else f"The frozen base model in bf16; the adapters, their gradients and optimizer "
                f"states in {s.lora_dtype}."
            ),
            "bf16-master": "bf16 weights and gradients; the optimizer keeps fp32 master weights "
            "and fp32 AdamW states and makes fp32 copies of the gradients at the step.",
        }[s.precision]
    )
    notes.append(
        {
            "adamw": "torch.optim.AdamW(foreach=True), the default on CUDA.",
            "adamw-fused": "torch.optim.AdamW(fused=True): no step temporaries.",
            "adamw-forloop": "torch.optim.AdamW(foreach=False): one parameter at a time.",
            "adamw-8bit": "CPU stand-in for bitsandbytes AdamW8bit with its state layout: uint8 "
            "state1/state2, an fp32 absmax per 256 values, fp32 states under 4096 "
            "elements.",
            "paged-adamw-8bit": "CPU stand-in for bitsandbytes PagedAdamW8bit (same layout as "
            "AdamW8bit; paged states are counted on the GPU, not evicted).",
            "paged-adamw-32bit": "bitsandbytes PagedAdamW32bit (on CPU its paged states fall "
            "back to ordinary ones; on a GPU those of tensors of at least 1e5 elements are in "
            "CUDA managed memory).",
            "sgd": "torch.optim.SGD(foreach=True), no state.",
            "sgd-momentum": "torch.optim.SGD(momentum=0.9, foreach=True): one momentum buffer.",
            "adafactor": "transformers Adafactor (factored second moment, no first moment, "
            "relative_step=False).",
            "lion": "Lion: one momentum buffer, one parameter at a time.",
        }[s.optimizer]
    )
    if real_bnb and s.optimizer.endswith("8bit"):
        paged = s.optimizer.startswith("paged")
        notes[-1] = f"bitsandbytes {'PagedAdamW8bit' if paged else 'AdamW8bit'}."
    if s.n_gpus > 1 or s.zero_stage:
        notes.append(
            (_FSDP1_NOTE if s.fsdp_version == 1 else _PARALLEL_NOTES[min(s.zero_stage, 3)]).format(
                n=s.n_gpus
            )
            + (
                " The optimizer states and step live in CPU memory (offload)."
                if s.offload_optimizer
                else ""
            )
        )
    if s.no_sync:
        notes.append(
            "no_sync: every micro-batch but the last runs without reducing gradients "
            + (
                "(FSDP1's no_sync()); each unit's whole unsharded gradient counts as gradients."
                if s.fsdp_version == 1
                else "(FSDP2's set_requires_gradient_sync(False)); the unsharded gradients "
                "each GPU accumulates count as gradients."
                if s.zero_stage == 3
                else "(nothing to simulate on one rank)."
            )
        )
    if s.attention != "eager" and measured["attention_implementation"] == "eager":
        notes.append(
            f"transformers runs {spec.family} with eager attention only: measured "
            f"with eager attention (the attention matrix is kept)."
        )
    elif s.attention == "flash" and s.device == "cpu":
        notes.append(
            "attention='flash' is measured as PyTorch SDPA on CPU (FlashAttention "
            "needs a GPU); neither keeps the attention matrix."
        )
    elif s.attention == "flash":
        notes.append(
            "attention='flash' runs as PyTorch SDPA, which picks its flash kernel "
            "where the GPU supports it."
        )
    if s.method != "full":
        notes.append(
            f"LoRA r={s.lora_rank} on {s.lora_targets}, base frozen, adapters in "
            f"{'bf16' if s.lora_dtype == 'bf16' else 'fp32 (peft default)'}; "
            f"{measured['trainable_parameters']:,} trainable parameters."
        )
        if spec.lora_default_note(s.lora_targets):
            notes.append(spec.lora_default_note(s.lora_targets))
    if s.method != "full" and s.lora_dropout:
        notes.append(f"peft lora_dropout={s.lora_dropout:g} on every adapter.")
    if s.method == "qlora" and real_bnb:
        import bitsandbytes

        notes.append(
            f"bitsandbytes {bitsandbytes.__version__} Linear4bit (NF4"
            + (", double quantization" if s.double_quant else "")
            + ") on every "
            "linear layer of the decoder blocks"
            + (
                ", with MatMul4Bit keeping each layer's input as releases before 0.43.2 did."
                if s.bitsandbytes == "before-0.43.2"
                else "."
            )
        )
    elif s.method == "qlora":
        notes.append(
            "CPU stand-in for bitsandbytes Linear4bit: NF4 weights packed two per "
            "byte with "
            + (
                "uint8 absmax per 64 values and an fp32 constant per 256 "
                "blocks (double quantization)"
                if s.double_quant
                else "an fp32 absmax per 64 values"
            )
            + "; dequantized to the compute dtype in forward and again in backward."
        )
    if s.gradient_checkpointing:
        notes.append("Gradient checkpointing (use_reentrant=False) on every decoder layer.")
    if s.compile:
        notes.append(COMPILED_NOTE + (COMPILED_LOSS_NOTE if s.loss == "chunked" else ""))
    if s.activation_offload:
        notes.append(
            "Activation offloading: torch.autograd.graph.save_on_cpu's two hooks around forward "
            "and backward, with a no-op pair around lm_head (and around a chunked loss) as "
            "torchtune's and TRL's offloading have it; every other tensor saved for backward "
            "is copied to host memory and back "
            + (
                "(save_on_cpu(pin_memory=True) itself"
                if s.device == "cuda"
                else "(on CPU the copies are made explicitly, since there save_on_cpu copies nothing; "
                "host copies are left out of the figures"
            )
            + f"; host memory at its highest {measured['offloaded_peak_bytes'] / 2**30:.3f} GiB)."
        )
    if s.loss == "chunked":
        notes.append(
            f"Chunked cross-entropy in {s.loss_chunks} chunks: the code of torchtune's "
            "CEWithChunkedOutputLoss (lm_head and the fp32 upcast chunk by chunk)."
        )
    if s.optimizer_in_backward:
        notes.append(
            "Optimizer step in backward: one optimizer per parameter, stepped by its "
            "register_post_accumulate_grad_hook, which then frees the gradient."
        )
    if s.gradient_accumulation > 1:
        peaks = measured["micro_batch_forward_peaks"]
        notes.append(
            f"{s.gradient_accumulation} micro-batches; gradients stay allocated "
            f"between them. Forward peaks per micro-batch: "
            + ", ".join(f"{p / 2**30:.3f} GiB" for p in peaks)
            + "."
        )
    notes.append(
        "Logits: tensors shaped [..., vocab] (the logits, their fp32 copy for the "
        "loss, log-softmax and their gradients)."
    )
    if measured.get("cpu_only"):
        what = (
            "GPT-2's dropout makes CPU SDPA take the math path (seq x seq attention "
            "matrices kept) and "
            if spec.family == "gpt2"
            else ""
        )
        notes.append(
            f"CPU-only figure: {what}CPU dropout keeps each mask in its input's dtype, "
            "where CUDA keeps 1-byte masks and no attention matrix. "
            "estimate(device='cpu') reproduces this measurement; estimate(device='cuda') "
            "gives what a CUDA run allocates."
        )
    return notes
