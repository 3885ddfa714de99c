"""ZeRO-3 (FSDP, one unit per decoder layer): the buffers it allocates and the moments of a
step it adds, layer by layer, to those of the estimate (memory/estimating.py)."""

from __future__ import annotations

import math
from typing import Any


def fsdp_buffers(
    step: Any, layer_params: list[Any], root_params: list[Any], local: Any
) -> dict[str, int]:
    """What FSDP (ZeRO-3) allocates per decoder layer and for the root, in bytes: the
    gathered parameters, the flat all-gather buffer, the unsharded gradients, the flat
    reduce-scatter input (padded to a multiple of the GPU count), and the gradient shards
    kept. Gathers are in the compute dtype under mixed precision, reductions in fp32."""
    n = step.settings.n_gpus

    def sizes(params: list[Any]) -> dict[str, int]:
        out = dict(params=0, flat=0, grads=0, rs=0, shard=0)
        for shape, nbytes, trained in params:
            g = step.compute_bytes if step.sharded_mixed else nbytes  # gathered and unsharded grads
            numel, padded = math.prod(shape), n * math.prod(local(shape, 3))
            out["params"] += g * numel
            out["flat"] += g * padded
            if trained:
                r = 4 if step.sharded_mixed else nbytes  # reduce-scatter in fp32
                out["grads"] += g * numel
                out["rs"] += r * padded
                out["shard"] += nbytes * padded // n  # shards keep the parameter's dtype
        return out

    layer, root = sizes(layer_params), sizes(root_params)
    return {
        **{f"layer_{k}": v for k, v in layer.items()},
        **{f"root_{k}": v for k, v in root.items()},
    }


def fsdp_moments(
    step: Any, static: dict[str, int], grads_fw: int
) -> tuple[list[dict[str, int]], list[dict[str, int]]]:
    """The forward's and the backward's highest moments under FSDP (ZeRO-3).

    Forward: the end of the last layer, gathered alongside its all-gather buffer. Backward,
    layer by layer (k layers done): the end of a layer's backward (its gathered parameters,
    the next layer's prefetched buffer, its unsharded gradients, the previous layer's
    reduce-scatter input still held) and the reduce-scatter that follows; then the root's
    (embeddings, lm_head) reduction at the very end."""
    spec, s, f = step.spec, step.settings, step.fsdp
    t, h, p = step.ctx.tokens, spec.hidden_size, step.residual_bytes
    layers = spec.n_layers
    full = s.method == "full"
    ckpt = s.gradient_checkpointing
    accumulating = s.gradient_accumulation > 1

    def kept(i: int) -> int:
        """What decoder layer ``i`` keeps for backward (the first may keep less)."""
        if ckpt:
            return int(p * t * h)
        return int(step.layers_saved[i])

    def copies(i: int) -> int:
        return 0 if ckpt else (step.first_copies if i == 0 else step.layer_copies)

    def freed(j: int) -> tuple[int, int]:
        """Activations and weight copies the last ``j`` layers kept (freed once done)."""
        done = range(layers - j, layers)
        return sum(kept(i) for i in done), sum(copies(i) for i in done)

    fw_end = dict(
        static,
        gradients=grads_fw,
        activations=step.inputs + step.fw_layers + p * t * h + 8 * s.batch_size * (s.seq_len + 1),
        temporaries=step.fw_copies + f["root_params"] + f["layer_params"] + f["layer_flat"],
    )
    # gathering the last layer: the previous layer's buffer is freed only after it
    fw_gather = dict(
        fw_end,
        activations=fw_end["activations"] - kept(layers - 1),
        temporaries=fw_end["temporaries"] - copies(layers - 1) + f["layer_flat"],
    )
    # lm_head's unsharded gradient, held until the root's reduction at the end
    head = (
        (step.compute_bytes if step.sharded_mixed else step.stored_bytes) * spec.vocab_size * h
        if full
        else 0
    )
    moments = []
    # no_sync: the micro-batches before the last reduce nothing (no reduce-scatter
    # buffers); in the last, each finished layer's unsharded gradients give way to shards
    passes = [False, True] if s.no_sync else [True]
    unsharded_layer = step.gradients_full_layer - f["layer_shard"] if s.no_sync else 0
    # a layer's new (unsharded) gradients, and its first one, held as temporaries
    new_grads, new_first_grad = f["layer_grads"], step.fsdp_first_grad
    if s.no_sync and not step.sharded_mixed:
        # no reduce dtype: autograd adds each new gradient into the one kept, in place, so
        # neither lm_head's nor a layer's new gradients are held beside it
        head, new_grads, new_first_grad = 0, 0, 0
    for k, reducing in [
        (k, r) for r in passes for k in sorted({0, 1, layers - 2, layers - 1} & set(range(layers)))
    ]:
        held = f["layer_rs"] if k and reducing else 0
        gone, gone_copies = freed(k + 1)
        # with several micro-batches every shard exists already and is added to in place
        shards = 0 if accumulating else k * f["layer_shard"]
        if s.no_sync and reducing:
            shards = -k * unsharded_layer
        elif s.no_sync and s.gradient_accumulation == 2:
            # the only micro-batch before the last starts with no gradients: the layers
            # done so far (k of them) hold theirs, unsharded
            shards = (k - layers) * step.gradients_full_layer
        end = dict(
            static,
            gradients=grads_fw + shards,
            activations=step.inputs + max(step.rope, step.fw_layers - gone) + 2 * p * t * h,
            temporaries=max(0, step.bw_copies - gone_copies)
            + head
            + f["root_params"]
            + f["layer_params"]
            + new_grads
            + held
            + (f["layer_flat"] if k < layers - 1 else 0),
        )
        # under no_sync the reduction reads the kept gradients, into which the new ones
        # have already been added (and freed)
        reduce = dict(
            end,
            temporaries=end["temporaries"]
            - f["layer_params"]
            - held
            + (f["layer_rs"] if reducing else 0)
            - (new_grads if s.no_sync else 0),
        )
        # its start: its activations still saved, its own gathered buffer not yet freed
        start = dict(
            end,
            activations=end["activations"] + kept(layers - 1 - k),
            temporaries=end["temporaries"] - new_grads + (0 if k < layers - 1 else f["layer_flat"]),
        )
        # inside its MLP's backward (as bw_layer without FSDP): down_proj's gradient done
        moments += [start, end, reduce]
        for extra, temps in step._inside_layer(first=k == layers - 1):
            moments.append(
                dict(
                    start,
                    activations=start["activations"] - 2 * p * t * h + extra,
                    temporaries=start["temporaries"]
                    + temps
                    + new_first_grad
                    - (0 if k < layers - 1 else f["layer_flat"]),
                )
            )
    layer_grads = step.gradients - (0 if accumulating else f["root_shard"])
    root = dict(
        static,
        gradients=layer_grads,
        activations=step.inputs + 2 * p * t * h,
        temporaries=f["layer_rs"] + f["root_params"] + f["root_grads"],
    )
    root_reduce = dict(
        static,
        gradients=layer_grads,
        activations=step.inputs,
        temporaries=f["root_grads"] + f["root_rs"],
    )
    if s.no_sync:  # the last micro-batch's root: every layer reduced to its shard by then
        done = layers * unsharded_layer
        root = dict(root, gradients=layer_grads - done)
        root_reduce = dict(root_reduce, gradients=layer_grads - done)
        # an earlier micro-batch's root: every gradient kept, nothing reduced
        moments.append(
            dict(root, temporaries=f["root_params"] + f["root_grads"], gradients=layer_grads)
        )
    return [fw_end, fw_gather], [*moments, root, root_reduce]
