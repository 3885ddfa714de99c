"""The names of the choices a training run makes, shared by estimate, measure and the CLI."""

from __future__ import annotations

METHODS = ("full", "lora", "qlora")
PRECISIONS = (
    "fp32",  # everything in fp32
    "bf16-mixed",  # fp32 weights, bf16 autocast (Trainer(bf16=True) on an fp32 model)
    "fp16-mixed",  # fp32 weights, fp16 autocast
    "bf16",  # pure bf16: weights, gradients and optimizer states in bf16
    "bf16-master",  # bf16 weights and gradients, fp32 master weights in the optimizer
)
OPTIMIZERS = (
    "adamw",  # torch.optim.AdamW as on a CUDA device: the foreach implementation
    "adamw-fused",  # fused=True: no step temporaries
    "adamw-forloop",  # foreach=False: one parameter at a time
    "adamw-8bit",  # bitsandbytes AdamW8bit
    "paged-adamw-8bit",  # bitsandbytes PagedAdamW8bit
    "paged-adamw-32bit",  # bitsandbytes PagedAdamW32bit (and PagedAdamW, its 32-bit default)
    "sgd",  # plain SGD, no state
    "sgd-momentum",  # SGD with one momentum buffer
    "adafactor",  # factored second moment, no first moment
    "lion",  # one momentum buffer
)
ATTENTION = ("sdpa", "flash", "eager")
ZERO_STAGES = (0, 1, 2, 3)
# ZeRO-3 as FSDP: 1 (FullyShardedDataParallel, one flat parameter per wrapped unit) or 2
# (fully_shard, per-parameter shards: the default)
FSDP_VERSIONS = (1, 2)
LORA_DTYPES = ("fp32", "bf16")
# What a bitsandbytes 4-bit layer keeps for backward: "current" (0.43.2 and later, PR #1270:
# only the packed weight) or "before-0.43.2" (the layer's input too, when it needs a gradient).
BNB_BEHAVIOURS = ("current", "before-0.43.2")
# the loss: transformers' (the full logits upcast to fp32) or torchtune's CEWithChunkedOutputLoss
# (lm_head and the fp32 upcast one chunk of the sequence at a time)
LOSSES = ("standard", "chunked")
DEFAULT_LOSS_CHUNKS = 8  # torchtune CEWithChunkedOutputLoss(num_output_chunks=8)

# Bytes per element of each dtype name used above.
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1, "uint8": 1}
