"""The assumptions an estimate states, in words, and the data files they quote."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from ..models.traced import traced_experts
from ..units import GiB
from .settings import lora_on_experts


@lru_cache(maxsize=1)
def pcie_link() -> dict[str, Any]:
    """PCIe 4.0 x16 from the bandwidth ladder (lessonkit/data/bandwidth.json): the host link
    activation offloading crosses."""
    text = resources.files("lessonkit").joinpath("data/bandwidth.json").read_text()
    return next(link for link in json.loads(text)["links"] if link["name"] == "PCIe 4.0 x16")


@lru_cache(maxsize=1)
def cuda_constants() -> dict[str, Any]:
    """The CUDA context size and allocator margin (lessonkit/data/cuda_constants.json)."""
    text = resources.files("lessonkit").joinpath("data/cuda_constants.json").read_text()
    constants: dict[str, Any] = json.loads(text)
    return constants


def gpt_oss_notes(attention: str, said: bool) -> list[str]:
    """What a gpt-oss estimate assumes of its checkpoint (unless its preset's note ``said``
    it) and of its attention."""
    notes = []
    if not said:
        notes.append(
            "gpt-oss's experts are stored in MXFP4 on the Hub, which transformers does not "
            "train: for training it dequantizes them to bf16 (Mxfp4Config(dequantize=True), "
            "also its own choice without triton kernels), and the estimate counts the experts' "
            "weights as bf16."
        )
    asked = "" if attention == "eager" else f" whatever attention={attention!r} asks"
    notes.append(
        f"Eager attention{asked}: transformers has no SDPA path for gpt-oss's attention "
        "sinks, so each layer keeps its seq x (seq + 1) probabilities in the compute dtype "
        "(the sinks' column included; fp32 under autocast), the same in its sliding-window "
        "and full-attention layers."
    )
    return notes


def assumptions(step: Any) -> list[str]:
    """The assumptions of an estimate, in words."""
    spec, s = step.spec, step.settings
    notes = []
    if spec.note:
        notes.append(spec.note)
    if spec.family == "traced":
        trace = step.trace
        traced_in = "" if trace.precision == s.precision else f" in {trace.precision}"
        kinds = len(trace.kinds)
        layers = f"{trace.layers_traced} layer{'s' if trace.layers_traced > 1 else ''}" + (
            f", meeting its {kinds} kinds of layer" if kinds > 1 else ""
        )
        notes.append(
            "Traced figures: the activations (each decoder layer's saved tensors and autocast's "
            "weight copies, and the embeddings' and head's) come from transformers' own "
            f"{spec.extra.get('model_type')} model traced on a short step{traced_in} (its first "
            f"{layers}, at the real widths, under FakeTensorMode) and scaled to the batch and length; each "
            "layer is taken as the traced one of its kind, and ZeRO-3's per-layer buffers are "
            "left out. Weights, gradients and optimizer states are exact."
        )
        experts, per_token, _ = traced_experts(
            spec.extra["config"], spec.extra["model_type"], spec.n_layers
        )
        if experts:
            notes.append(
                f"Mixture of experts, read from the meta model: {experts} routed experts in "
                f"each MoE layer, all on the GPU ({spec.n_params / 1e9:.2f}B parameters); a "
                f"token computes with {per_token} of them ({spec.active_params / 1e9:.2f}B "
                "active)."
            )
    if spec.family == "gpt_oss":
        notes += gpt_oss_notes(s.attention, said="MXFP4" in spec.note)
        if s.method == "qlora":
            notes.append(
                "QLoRA on gpt-oss: bitsandbytes quantizes the attention's linear layers only; "
                "the experts' 3D weights (most of the model) stay in bf16."
            )
    if spec.n_experts and spec.family != "traced":
        router = (
            "the top-k of the router's logits and their softmax"
            if spec.family == "gpt_oss"
            else "the router's fp32 probabilities, the top-k indices"
        )
        notes.append(
            f"Mixture of experts: all {spec.n_experts} experts of each MoE layer are on the GPU "
            f"({spec.n_params / 1e9:.2f}B parameters), a token computes with "
            f"{spec.experts_per_token} of them ({spec.active_params / 1e9:.2f}B active). "
            f"Activations as transformers' grouped-GEMM experts keep them: {router}, "
            "each token copied once per chosen expert, and "
            "the sort's permutations; with gradient checkpointing, the recomputed layer's "
            "forward up to its last saved tensor beside the per-row gradient of the sum over "
            "the k experts. The estimate assumes balanced top-k routing, but with the grouped "
            "GEMM every one of these buffers has tokens x top-k rows whatever the routing: "
            "sending every token to the same k experts (a real step of a 16-expert, top-4 "
            "model, 4 x 512 tokens) left the peak where it was (78.6 MiB; 49.1 MiB with "
            "checkpointing), so an uneven router changes the time, not this peak. The "
            "per-expert loop of the eager experts is not modelled (86.5 MiB there, +10%)."
        )
    if lora_on_experts(s):
        notes.append(_expert_lora_note(step))
    half = "fp16" if s.precision.startswith("fp16") else "bf16"
    sharded_mixed = (
        f"ZeRO-3 with {half} mixed precision as FSDP and DeepSpeed run it "
        + (
            f"(FSDP1: MixedPrecision(param_dtype={half}, reduce_dtype=fp32)): "
            if s.fsdp_version == 1
            else f"(FSDP2: MixedPrecisionPolicy(param_dtype={half}, reduce_dtype=fp32)): "
        )
        + "fp32 shards of the weights, gradients and optimizer states; each layer "
        f"is gathered directly in {half} and freed after use, so there are no "
        "autocast copies; gradients are reduced in fp32."
    )
    notes.append(
        sharded_mixed
        if step.sharded_mixed
        else {
            "fp32": "fp32 weights, gradients, optimizer states and compute.",
            "bf16-mixed": "fp32 weights under bf16 autocast: fp32 gradients and states, plus "
            "autocast's bf16 copy of each weight, kept until its backward.",
            "fp16-mixed": "fp32 weights under fp16 autocast: fp32 gradients and states, plus "
            "autocast's fp16 copy of each weight (loss scaling adds nothing).",
            "bf16": (
                "Pure bf16: weights, gradients and optimizer states all in bf16."
                if s.method == "full"
                else f"The frozen base model in bf16 ({'NF4 linear layers, ' if s.method == 'qlora' else ''}"
                f"no gradients or states); the adapters, their gradients and optimizer "
                f"states in {s.lora_dtype}."
            ),
            "bf16-master": "bf16 weights and gradients; the optimizer keeps fp32 master weights "
            "and fp32 states (4 + 4 + 4 bytes per parameter) and makes fp32 "
            "copies of the gradients at the step.",
        }[s.precision]
    )
    notes.append(
        {
            "adamw": "torch.optim.AdamW with foreach=True (the CUDA default): 2 states per "
            "parameter, and one parameter-sized temporary set during the step.",
            "adamw-fused": "torch.optim.AdamW(fused=True): 2 states per parameter, no step "
            "temporaries.",
            "adamw-forloop": "torch.optim.AdamW(foreach=False): 2 states per parameter; the step "
            "goes one tensor at a time (two temporaries of the largest).",
            "adamw-8bit": "bitsandbytes AdamW8bit: 2 uint8 states per parameter plus an fp32 "
            "absmax per 256 values; tensors under 4096 elements keep fp32 states.",
            "paged-adamw-8bit": "bitsandbytes PagedAdamW8bit: as AdamW8bit; the uint8 states of "
            "tensors of at least 1e5 elements live in CUDA managed memory, counted in the peak "
            "per GPU (nvidia-smi shows them while they are on the GPU; under pressure the driver "
            "moves them to CPU RAM) but not by torch.cuda.max_memory_allocated or "
            "memory_reserved.",
            "paged-adamw-32bit": "bitsandbytes PagedAdamW32bit: 2 fp32 states per parameter "
            "whatever its dtype, updated in place; those of tensors of at least 1e5 elements "
            "live in CUDA managed memory, counted in the peak per GPU (nvidia-smi shows them "
            "while they are on the GPU; under pressure the driver moves them to CPU RAM) but "
            "not by torch.cuda.max_memory_allocated or memory_reserved.",
            "sgd": "SGD without momentum: no optimizer state.",
            "sgd-momentum": "SGD with momentum: one state per parameter.",
            "adafactor": "transformers Adafactor: a row and a column vector per matrix (fp32), "
            "no first moment.",
            "lion": "Lion: one momentum state per parameter.",
        }[s.optimizer]
    )
    if s.method != "full":
        targets = s.lora_targets if isinstance(s.lora_targets, str) else ", ".join(s.lora_targets)
        notes.append(
            f"LoRA rank {s.lora_rank} on {targets}: "
            f"{step.trainable_params:,} trainable parameters in {s.lora_dtype} "
            "(peft keeps adapters in fp32 by default); the base model is frozen."
        )
        if spec.lora_default_note(s.lora_targets):
            notes.append(spec.lora_default_note(s.lora_targets))
    if s.method != "full" and s.lora_dropout:
        notes.append(
            f"LoRA dropout {s.lora_dropout:g} (peft): each adapter keeps its own "
            "dropped-out copy of its input and, where the input needs a gradient, "
            "the dropout's mask (1 byte per element on CUDA, the input's dtype on "
            "CPU)."
        )
    if s.method == "qlora":
        dq = (
            "double quantization (a uint8 absmax per 64 values and an fp32 constant per 256 blocks)"
            if s.double_quant
            else "an fp32 absmax per 64 values"
        )
        notes.append(
            "QLoRA: the decoder's linear weights in NF4, 0.5 bytes per parameter "
            f"with {dq}; embeddings, norms and lm_head stay in "
            f"{'fp32' if step.residual_bytes == 4 else 'bf16'}. Each layer's weight is "
            "dequantized into a 16-bit temporary in forward and again in backward; "
            "its output comes back in its input's dtype."
        )
        if spec.n_experts and spec.family != "traced":
            experts = spec.moe_layers * spec.n_experts * 3 * spec.hidden_size
            experts *= spec.expert_intermediate_size
            notes.append(
                "QLoRA of a mixture of experts: the experts' 3D weights (mlp.experts.gate_up_proj "
                "and down_proj) and the router are nn.Parameters, not nn.Linear, so "
                "bitsandbytes' Linear4bit replacement (transformers' replace_with_bnb_linear, "
                "BitsAndBytesConfig(load_in_4bit=True)) leaves them as they are: they stay "
                f"{'fp32' if step.residual_bytes == 4 else 'bf16'} "
                f"({experts * step.residual_bytes / 2**30:.2f} GiB of experts here); the "
                "attention's linear layers (and any dense MLP's) are NF4."
            )
        notes.append(
            "bitsandbytes 0.43.2 or later (measured with 0.50.2): a 4-bit layer keeps only "
            "its packed weight for backward."
            if s.bitsandbytes == "current"
            else "bitsandbytes before 0.43.2 (e.g. 0.41.1, 2023): each 4-bit layer also keeps its "
            "input for backward, on the autograd context, so gradient checkpointing does "
            "not free it (fixed by bitsandbytes PR #1270, released in 0.43.2)."
        )
    attn = {
        "sdpa": "SDPA attention (flash / memory-efficient kernels): no seq x seq matrix is kept.",
        "flash": "FlashAttention: no seq x seq matrix is kept.",
        "eager": "Eager attention: the seq x seq scores and probabilities are kept for "
        "every head (fp32 softmax).",
    }[s.attention]
    if spec.family != "gpt_oss":  # eager whatever is asked: said in gpt_oss_notes
        notes.append(attn)
    if spec.family == "gpt2":
        notes.append(
            "GPT-2's dropout (0.1, transformers' default) is on: each dropout keeps "
            "a mask"
            + (
                " in its input's dtype, and SDPA takes the math path (CPU kernels)."
                if s.device == "cpu"
                else " of 1 byte per element."
            )
        )
    if s.gradient_checkpointing:
        notes.append(
            "Gradient checkpointing: each layer keeps only its input; one layer's "
            "activations are recomputed at a time in backward."
        )
    if s.optimizer_in_backward:
        notes.append(
            "Optimizer step in backward (torchtune's optimizer_in_bwd, PyTorch's "
            "register_post_accumulate_grad_hook tutorial): each parameter has its own "
            "optimizer, stepped as soon as its gradient is made, which is then freed: one "
            "tensor's gradient and step temporaries at a time, none kept after backward. "
            "It rules out gradient accumulation and clipping by the global gradient norm."
        )
    if s.activation_offload:
        link = pcie_link()
        seconds = 2 * step.offloaded * s.gradient_accumulation / (link["bandwidth_gbs"] * 1e9)
        notes.append(
            "Activation offloading (TRL's activation_offloading, torchtune's "
            "OffloadActivations) with checkpointing: each layer's checkpointed input and "
            "the final norm's saved tensors live in CPU RAM "
            f"(about {step.offloaded / GiB:.2f} GiB per micro-batch) and come back one "
            "layer at a time in backward; lm_head's saved tensors"
            + (" and the chunked loss's" if s.loss == "chunked" else "")
            + " stay on the GPU (as those recipes keep them), and autocast's copies of "
            "trained weights stay until the forward ends. The cost is time: that much "
            "crosses PCIe twice per "
            f"micro-batch, {seconds * 1e3:,.0f} ms per step at {link['name']}'s "
            f"{link['bandwidth_gbs']:g} GB/s ({link['source']}), partly hidden behind "
            "compute when the host memory is pinned."
        )
    if s.gradient_accumulation > 1:
        notes.append(
            f"{s.gradient_accumulation} micro-batches: activations are those of "
            "one micro-batch, but gradients stay allocated between them."
        )
    logits = 4 * s.batch_size * s.seq_len * spec.vocab_size
    if s.loss == "chunked":
        notes.append(
            f"Chunked cross-entropy in {s.loss_chunks} chunks (torchtune's "
            "CEWithChunkedOutputLoss): lm_head runs on each chunk of the sequence and each "
            "chunk's logits are upcast to fp32 in turn, so the full fp32 copy "
            f"({logits / GiB:.2f} GiB for a vocabulary of {spec.vocab_size:,}) never exists; "
            + (
                "compiled, each chunk keeps only its logits for backward, no fp32 log-softmax."
                if s.compile
                else "the log-softmax of every chunk is still kept for backward."
            )
        )
        if step.head_backward or step.head_accumulation:  # memory/chunked_head.py
            notes.append(
                "The loss of every chunk is differentiated before lm_head's backward of any, "
                "so all the chunks' logit gradients wait together while lm_head's backward "
                "takes them one chunk at a time"
                + (
                    ", adding each chunk's weight gradient to the others' sum."
                    if step.head_accumulation
                    else "."
                )
            )
    else:
        notes.append(
            f"Logits: the loss upcasts the logits to fp32 and keeps the "
            f"log-softmax ({logits / GiB:.2f} GiB for a vocabulary of "
            f"{spec.vocab_size:,}); their gradients appear at the start of "
            "backward."
        )
    if s.n_gpus > 1 or s.zero_stage:
        kind = {
            0: "DDP: everything replicated, plus gradient buckets as large as the gradients",
            1: "ZeRO-1: optimizer states sharded",
            2: "ZeRO-2: optimizer states and gradients sharded",
            3: "ZeRO-3 (FSDP, one unit per decoder layer): parameters, gradients and "
            "states sharded; the embeddings, final norm and lm_head stay gathered "
            "through forward and backward; one decoder layer's parameters are "
            "gathered at a time, beside the next layer's all-gather buffer "
            "(prefetched); in backward, add that layer's unsharded gradients and one "
            "reduce-scatter buffer (the previous layer's, then its own): at most "
            "four layer-sized buffers at once, beside lm_head's unsharded gradient "
            "(held until the root's reduction); with several micro-batches the "
            "gradient shards exist from the first and are added to in place",
        }[s.zero_stage]
        if s.fsdp_version == 1:
            from .fsdp1 import description

            kind = description(step)
        notes.append(f"{s.n_gpus} GPUs, {kind}; figures are per GPU.")
        root_heavy = (
            step.fsdp and step.fsdp["root_params"] > spec.n_layers * step.fsdp["layer_params"]
        )
        if root_heavy:
            notes.append(
                "The embeddings and lm_head outweigh the decoder layers here, so ZeRO-3 can need "
                "more per GPU than ZeRO-2: at the end of backward the root's gathered "
                "parameters, their unsharded gradients and its reduce-scatter input exist at once."
            )
    if s.no_sync and s.fsdp_version == 1:
        from .fsdp1 import no_sync_note

        notes.append(no_sync_note(step))
    elif s.no_sync:
        notes.append(
            "no_sync: gradients are reduced on the last micro-batch only (FSDP2's "
            "set_requires_gradient_sync(False), what the Trainer does under FSDP), so "
            + (
                "each GPU accumulates full, unsharded gradients "
                f"({step.gradients / GiB:.2f} GiB) in place of its shard."
                if s.zero_stage == 3
                else "only the communication is skipped: the gradients are full-size anyway."
            )
        )
    if s.offload_optimizer:
        notes.append(
            "Optimizer states offloaded to CPU RAM: 0 on the GPU (the CPU needs "
            f"{step.offload_bytes / GiB:.1f} GiB for them and the step)."
        )
    if s.device == "cuda":
        const = cuda_constants()
        ratio = const["allocator_margin_ratio"] - 1
        notes.append(
            f"CUDA context {const['cuda_context_bytes'] / GiB:.2f} GiB and an "
            f"allocator margin of {ratio:.0%} of the tensor peak "
            f"(source: {const['source']}; as of {const['as_of']})."
        )
    else:
        notes.append("device='cpu': no CUDA context and no allocator margin.")
    return notes


def _expert_lora_note(step: Any) -> str:
    """What LoRA on the experts' 3D weights costs (memory/experts.py: expert_lora)."""
    spec, s = step.spec, step.settings
    shapes = spec.expert_lora_shapes(s.lora_targets)
    stacks = step.compute_bytes * sum(e * a * b for e, a, b in shapes)
    adapters = s.lora_rank * sum(e * (a + b) for e, a, b in shapes)
    names = " and ".join(f"mlp.{name}" for name in lora_on_experts(s))
    return (
        f"LoRA on the experts' weights ({names}, peft's target_parameters): each expert gets "
        f"its own rank-{s.lora_rank} adapter, {adapters * spec.moe_layers / 1e6:.1f}M "
        "trainable parameters in all. In every forward peft folds the adapters into a full "
        f"copy of the expert stack (torch.baddbmm, {stacks / 2**30:.2f} GiB per layer here), "
        "which the grouped GEMM saves for backward wherever its input needs a gradient, and "
        "the backward makes that copy's full gradient before reducing it to the adapters'. "
        "Gradient checkpointing keeps only one layer's copies at a time."
    )
