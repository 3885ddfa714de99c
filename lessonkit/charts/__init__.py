"""The course's charts, in plain matplotlib: each function draws on an ``ax`` it is given
(memory breakdowns, GPU fit, environment costs, the decision flow, a step's memory timeline).

Layer 6 of lessonkit: imports the layers below it (memory reports, GPU records), no widgets.
matplotlib is imported inside the functions that draw.
"""

from .memory_charts import (
    BreakdownChart,
    default_label,
    draw_breakdown,
    draw_gpu_fit,
    update_gpu_fit,
    ways_to_fit,
)
from .planning_charts import (
    FLOW_NODES,
    decision_path,
    draw_decision_flow,
    draw_environment_costs,
    is_highlighted,
    update_decision_flow,
    update_environment_costs,
)
from .timeline_chart import TimelineChart, memory_timeline

__all__ = [
    "FLOW_NODES",
    "BreakdownChart",
    "TimelineChart",
    "decision_path",
    "default_label",
    "draw_breakdown",
    "draw_decision_flow",
    "draw_environment_costs",
    "draw_gpu_fit",
    "is_highlighted",
    "memory_timeline",
    "update_decision_flow",
    "update_environment_costs",
    "update_gpu_fit",
    "ways_to_fit",
]
