"""The colour of each memory category, the same in every chart of the course."""

from __future__ import annotations

CATEGORY_COLORS = {
    "weights": "#4C72B0", "gradients": "#DD8452", "optimizer": "#55A868",
    "activations": "#C44E52", "logits": "#8172B3", "temporaries": "#937860",
    "cuda_context": "#8C8C8C", "allocator_margin": "#CCB974", "other": "#DA8BC3",
}
