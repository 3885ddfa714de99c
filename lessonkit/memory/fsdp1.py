"""ZeRO-3 as FSDP1 (``torch.distributed.fsdp.FullyShardedDataParallel``): what its flat
parameters change in the estimate (memory/estimating.py), unit by unit.

FSDP1 as the usual transformer auto-wrap policy sets it up: one unit per decoder layer and the
root (embeddings, final norm, lm_head), ``use_orig_params=True`` (which a LoRA layer needs: its
frozen and trained tensors share one flat parameter), and torch's defaults otherwise
(FULL_SHARD, ``BackwardPrefetch.BACKWARD_PRE``, ``forward_prefetch=False``,
``limit_all_gathers=True``). In torch 2.13's ``_flat_param.py``:

- each unit's tensors are flattened, in module order, into one FlatParameter of one dtype;
  with ``use_orig_params`` each tensor starts at a multiple of 16 bytes (of the gathered
  dtype) and the whole is padded to a multiple of the GPU count; a rank keeps one contiguous
  1/n of it, so rank 0 holds whole tensors of the layer's first modules and none of its last;
- a unit is gathered whole (all of its tensors at once, in the compute dtype), the next one in
  backward order prefetched as a unit's backward begins; the root stays gathered from the
  forward to the end of the backward;
- the original parameters are views of the flat parameter that require a gradient wherever
  any tensor of the unit does: autograd makes every tensor's gradient, frozen ones included,
  and concatenates them into one gradient of the whole unit (``torch.split``'s backward), which
  is reduce-scattered (cast to the reduce dtype first) to a shard of the whole unit;
- under ``no_sync()`` that whole-unit gradient stays unsharded, in the compute dtype, until the
  micro-batch that synchronises.

So LoRA under FSDP1 keeps a gradient shard as large as the layer's weight shard, its backward
computes (and saves the inputs for) the frozen weights' gradients, and ``no_sync`` keeps every
layer's whole gradient unsharded.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from .settings import layer_lora_targets, outer_lora_targets

ALIGNMENT = 16  # bytes: where use_orig_params starts each tensor (_get_aligned_numel)


class Unit(NamedTuple):
    """One FSDP1 unit: its flat parameter's numel (padding included), the numel of its
    tensors, whether any of them is trained, and rank 0's piece of each trained tensor."""

    numel: int
    tensors: int
    trained: bool
    pieces: list[tuple[int, tuple[int, ...]]]  # (numel, shape) on rank 0


def _module_order(name: str, gpt2: bool, index: int) -> tuple[int, int]:
    """Where a decoder layer's tensor comes in module order (its module's registration)."""
    if gpt2:
        return (0, index)  # the inventory lists GPT-2's block in module order
    if name.startswith("self_attn.") and not name.startswith(
        ("self_attn.q_norm", "self_attn.k_norm")
    ):
        return (0, index)
    section = 1 if name.startswith("self_attn.") else 2 if name.startswith("mlp.") else 3
    return (section, index)


def unit_tensors(spec: Any, s: Any) -> tuple[list[tuple[tuple[int, ...], bool]], list[Any]]:
    """(shape, trained) of a decoder layer's and of the root's tensors, in the order FSDP1
    flattens them: each module's weight, bias, then its LoRA A and B (peft's base_layer
    first)."""
    full = s.method == "full"
    tensors = spec.parameter_tensors()
    shapes = spec.linear_shapes()
    keys = {path: key for key, path in _linear_paths(shapes).items()}
    targets = layer_lora_targets(s.lora_targets) if not full else ()
    chosen = set()
    if not full:
        for key in shapes:
            short = key.split(".")[-1]
            if targets == "all-linear" or short in targets or key in targets:
                chosen.add(key)
    gpt2 = spec.family == "gpt2"
    ordered = sorted(
        enumerate(tensors.layer), key=lambda item: _module_order(item[1].name, gpt2, item[0])
    )
    r = s.lora_rank
    layer: list[tuple[tuple[int, ...], bool]] = []
    for _, tensor in ordered:
        layer.append((tensor.shape, full))
        module = tensor.name.rsplit(".", 1)[0]
        key = keys.get(module)
        bias_follows = any(t.name == f"{module}.bias" for t in tensors.layer)
        last_of_module = tensor.name.endswith(".bias") or not bias_follows
        if key in chosen and last_of_module:
            n_in, n_out = shapes[key]
            layer += [((r, n_in), True), ((n_out, r), True)]
    outer = outer_lora_targets(s.lora_targets) if not full else ()
    h, v = spec.hidden_size, spec.vocab_size
    root: list[tuple[tuple[int, ...], bool]] = []
    for tensor in tensors.outer:
        root.append((tensor.shape, full))
        if tensor.kind == "embed" and "embed_tokens" in outer and "wpe" not in tensor.name:
            root += [((r, v), True), ((h, r), True)]
        if tensor.kind == "head" and "lm_head" in outer:
            root += [((r, h), True), ((v, r), True)]
    return layer, root


def _linear_paths(shapes: dict[str, Any]) -> dict[str, str]:
    from ..models.spec import _LINEAR_PATHS

    return {key: _LINEAR_PATHS[key] for key in shapes}


def flatten(tensors: list[tuple[tuple[int, ...], bool]], n: int, gathered_bytes: int) -> Unit:
    """One unit's flat parameter as FSDP1 lays it out over ``n`` ranks."""
    align = ALIGNMENT // gathered_bytes
    offset, starts = 0, []
    for shape, _ in tensors:
        if offset % align:
            offset += align - offset % align
        starts.append(offset)
        offset += math.prod(shape)
    numel = math.ceil(offset / n) * n
    shard = numel // n
    pieces = []
    for (shape, trained), start in zip(tensors, starts, strict=True):
        if not trained:
            continue
        size = math.prod(shape)
        inside = max(0, min(start + size, shard) - start)
        pieces.append((inside, shape if inside == size else (inside,)))
    return Unit(
        numel=numel,
        tensors=sum(math.prod(shape) for shape, _ in tensors),
        trained=any(trained for _, trained in tensors),
        pieces=pieces,
    )


def description(step: Any) -> str:
    """The assumptions' words for ZeRO-3 run as FSDP1."""
    f = step.fsdp
    gib = 2**30
    return (
        "ZeRO-3 as FSDP1 (FullyShardedDataParallel, transformer auto-wrap: one flat parameter "
        "per decoder layer and one for the root, use_orig_params=True, FULL_SHARD, "
        "BackwardPrefetch.BACKWARD_PRE, no forward prefetch): each GPU keeps 1/n of each "
        "flat parameter (padded to a multiple of the GPU count), so its optimizer states "
        "cover the trained tensors that fall in its slice; a decoder layer is gathered whole "
        f"({f['layer_gathered'] / gib:.2f} GiB), the next one prefetched as each layer's "
        "backward begins, the root gathered from the forward to the end of the backward; "
        "every tensor of a unit with a trained tensor gets a gradient, frozen ones included "
        f"(autograd concatenates them into the unit's gradient, {f['layer_flat_grad'] / gib:.2f}"
        " GiB a layer, cast to the reduce dtype and reduce-scattered to a shard of the whole "
        "layer)"
    )


def no_sync_note(step: Any) -> str:
    """The assumptions' words for FSDP1's no_sync()."""
    return (
        "no_sync: gradients are reduced on the last micro-batch only (FSDP1's no_sync()), "
        "so each GPU keeps every unit's whole gradient, frozen tensors' included, unsharded "
        f"in the compute dtype ({step.gradients / 2**30:.2f} GiB) until that micro-batch."
    )


def root_context(ctx: Any, s: Any) -> Any:
    """The activations' context for the root's modules (embeddings, final norm, lm_head):
    under FSDP1 the decoder layers' frozen tensors get gradients (``ctx.trains_base``), the
    root's only where the root has a trained tensor (full fine-tuning, LoRA on lm_head or the
    embeddings)."""
    import dataclasses

    if s.fsdp_version != 1:
        return ctx
    trained = s.method == "full" or bool(outer_lora_targets(s.lora_targets))
    return dataclasses.replace(ctx, trains_base=trained)


def apply(step: Any) -> None:
    """Replace the estimate's ZeRO-3 figures (FSDP2's) with FSDP1's: weights, gradients,
    optimizer states, the step's temporaries and the per-unit buffers (``step.fsdp``)."""
    from . import optimizers as opt

    spec, s = step.spec, step.settings
    n, layers = s.n_gpus, spec.n_layers
    stored = step.stored_bytes
    compute = step.compute_bytes if step.sharded_mixed else stored  # gathered and its gradients
    reduce = 4 if step.sharded_mixed else stored
    layer_tensors, root_tensors = unit_tensors(spec, s)
    layer, root = flatten(layer_tensors, n, compute), flatten(root_tensors, n, compute)
    units = [(layer, layers), (root, 1)]
    step.weights += sum(count * stored * unit.numel // n for unit, count in units) - _fsdp2_weights(
        step
    )
    step.step_gradients = sum(
        count * stored * unit.numel // n for unit, count in units if unit.trained
    )
    kept_unsharded = sum(count * compute * unit.numel for unit, count in units if unit.trained)
    step.gradients = kept_unsharded if s.no_sync else step.step_gradients
    pieces = [(numel, shape, count) for unit, count in units for numel, shape in unit.pieces]
    master = s.precision == "bf16-master"
    state = opt.state_bytes(s.optimizer, pieces, stored, master)
    if s.optimizer == "adamw-fused":
        state += 4 * sum(count for _, _, count in pieces)
    step.optimizer = state
    step.managed = opt.paged_state_bytes(s.optimizer, pieces)
    step.step_temps = opt.step_temporaries(s.optimizer, pieces, stored, master)

    def buffers(unit: Unit) -> dict[str, int]:
        trained = unit.trained
        return dict(
            gathered=compute * unit.numel,
            low_shard=compute * unit.numel // n if step.sharded_mixed else 0,
            grads=compute * unit.tensors if trained else 0,  # every tensor's, before the cat
            flat_grad=compute * unit.numel if trained else 0,
            cast=reduce * unit.numel if trained and reduce != compute else 0,
            new_shard=reduce * unit.numel // n if trained else 0,
            shard=stored * unit.numel // n if trained else 0,
        )

    f = {f"layer_{k}": v for k, v in buffers(layer).items()}
    f |= {f"root_{k}": v for k, v in buffers(root).items()}
    # the names step_notes and the timeline read: the gathered root and decoder layer
    f["root_params"], f["layer_params"] = f["root_gathered"], f["layer_gathered"]
    # the root's pre-backward hook prefetches the last decoder layer (BACKWARD_PRE)
    f["backward_prefetch"] = f["layer_gathered"]
    step.fsdp = f
    # the first gradient of a layer's backward: down_proj's (every tensor gets one)
    step.fsdp_first_grad = compute * max(a * b for a, b in spec.linear_shapes().values())
    step.fsdp_head_grad = compute * spec.vocab_size * spec.hidden_size if root.trained else 0
    step.gather = f["root_gathered"]  # gathered through forward and backward


def _fsdp2_weights(step: Any) -> int:
    """The sharded parameters the estimate counted as FSDP2 (rows of dim 0), to replace."""
    spec, s = step.spec, step.settings
    n: int = s.n_gpus
    layer_tensors, root_tensors = unit_tensors(spec, s)
    stored = step.stored_bytes

    def rows(shape: tuple[int, ...]) -> int:
        return math.ceil(shape[0] / n) * math.prod(shape[1:])

    adapter = step.adapter_bytes
    total = 0
    for tensors, count in ((layer_tensors, spec.n_layers), (root_tensors, 1)):
        for shape, trained in tensors:
            nbytes = adapter if trained and s.method != "full" else stored
            total += count * nbytes * rows(shape)
    return total


def moments(
    step: Any, static: dict[str, int], grads_fw: int
) -> tuple[list[dict[str, int]], list[dict[str, int]]]:
    """The forward's and the backward's highest moments under FSDP1, unit by unit.

    Forward: one decoder layer gathered at a time beside the root. Backward, layer by layer
    (k layers done): a layer's start (it and the next one gathered), inside its MLP's
    backward, its end (every tensor's gradient and their concatenation), and its
    post-backward (the layer freed, the whole-unit gradient cast to the reduce dtype and
    reduce-scattered); then the root's."""
    spec, s, f = step.spec, step.settings, step.fsdp
    t, h, p = step.ctx.tokens, spec.hidden_size, step.residual_bytes
    layers = spec.n_layers
    ckpt = s.gradient_checkpointing
    accumulating = s.gradient_accumulation > 1

    def kept(i: int) -> int:
        if ckpt:
            return int(p * t * h)
        return int(step.first_saved if i == 0 else step.layer_saved)

    def copies(i: int) -> int:
        return 0 if ckpt else (step.first_copies if i == 0 else step.layer_copies)

    def freed(j: int) -> tuple[int, int]:
        done = range(layers - j, layers)
        return sum(kept(i) for i in done), sum(copies(i) for i in done)

    root, layer = f["root_gathered"], f["layer_gathered"]
    fw_end = dict(
        static,
        gradients=grads_fw,
        activations=step.inputs + step.fw_layers + p * t * h + 8 * s.batch_size * (s.seq_len + 1),
        temporaries=step.fw_copies + root + layer,
    )
    fw_gather = dict(
        fw_end,
        activations=fw_end["activations"] - kept(layers - 1),
        temporaries=fw_end["temporaries"] - copies(layers - 1) + f["layer_low_shard"],
    )
    head = step.fsdp_head_grad  # lm_head's gradient, held until the root's concatenation
    # no_sync: every micro-batch but the last keeps each unit's whole gradient unsharded
    passes = [False, True] if s.no_sync else [True]
    unsharded = f["layer_flat_grad"]
    moments: list[dict[str, int]] = []
    for k, reducing in [
        (k, r) for r in passes for k in sorted({0, 1, layers - 2, layers - 1} & set(range(layers)))
    ]:
        gone, gone_copies = freed(k + 1)
        next_layer = layer if k < layers - 1 else 0  # prefetched (BACKWARD_PRE)
        if s.no_sync and reducing:  # the last micro-batch: the layers done hold shards
            shards = -k * (unsharded - f["layer_shard"])
        elif s.no_sync and s.gradient_accumulation == 2:
            shards = (k - layers) * unsharded  # the first micro-batch: k layers' gradients
        elif accumulating:
            shards = 0  # every shard exists from the first micro-batch
        else:
            shards = k * f["layer_shard"]
        base = max(0, step.bw_copies - gone_copies) + head + root
        end = dict(
            static,
            gradients=grads_fw + shards,
            activations=step.inputs + max(step.rope, step.fw_layers - gone) + 2 * p * t * h,
            temporaries=base + layer + next_layer + f["layer_grads"] + f["layer_flat_grad"],
        )
        start = dict(
            end,
            activations=end["activations"] + kept(layers - 1 - k),
            temporaries=base + layer + next_layer,
        )
        moments += [start, end]
        if reducing:
            # the layer's gradient cast and reduce-scattered by the post-backward hook, which
            # runs while autograd still holds the new gradient (under no_sync it was added
            # into the kept one, in place)
            moments.append(
                dict(
                    end,
                    temporaries=base
                    + next_layer
                    + f["layer_flat_grad"]
                    + f["layer_cast"]
                    + f["layer_new_shard"],
                )
            )
        for extra, temps in step._inside_layer(first=k == layers - 1):
            moments.append(
                dict(
                    start,
                    activations=start["activations"] - 2 * p * t * h + extra,
                    temporaries=start["temporaries"] + temps + step.fsdp_first_grad,
                )
            )
    layer_grads = step.gradients - (0 if accumulating else f["root_shard"])
    if s.no_sync:
        layer_grads -= layers * (unsharded - f["layer_shard"])
    root_end = dict(
        static,
        gradients=layer_grads,
        activations=step.inputs + 2 * p * t * h,
        temporaries=root + f["root_grads"] + f["root_flat_grad"],
    )
    root_reduce = dict(
        static,
        gradients=layer_grads,
        activations=step.inputs,
        temporaries=f["root_flat_grad"] + f["root_cast"] + f["root_new_shard"],
    )
    return [fw_end, fw_gather], [*moments, root_end, root_reduce]
