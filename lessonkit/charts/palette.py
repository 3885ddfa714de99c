"""The colours of the course's charts: each memory category's, the same in every chart, and
those of fit, alert and environment tier."""

from __future__ import annotations

CATEGORY_COLORS = {
    "weights": "#4C72B0",
    "gradients": "#DD8452",
    "optimizer": "#55A868",
    "activations": "#C44E52",
    "logits": "#8172B3",
    "temporaries": "#937860",
    "cuda_context": "#8C8C8C",
    "allocator_margin": "#CCB974",
    "other": "#DA8BC3",
}
FIT_COLOR, NO_FIT_COLOR, ALERT_COLOR = "#55A868", "#D9A5A5", "#B22222"
TIER_COLORS = {
    "hobbyist": "#4C72B0",
    "engineer": "#55A868",
    "enterprise": "#8172B3",
    "own hardware": "#DD8452",
}
