"""The course's charts, in plain matplotlib: each function draws on an ``ax`` it is given
(memory breakdowns, GPU fit, environment costs, the decision flow, a step's memory timeline),
and ``layout_problems``: whether a chart can be read at the size it is shown.

Layer 6 of lessonkit: imports the layers below it (memory reports, GPU records), no widgets.
matplotlib is imported inside the functions that draw.
"""

from .fit_chart import draw_gpu_fit, gpu_fit_height, update_gpu_fit
from .layout import layout_problems
from .memory_charts import BreakdownChart, default_label, draw_breakdown, ways_to_fit
from .planning_charts import (
    FLOW_NODES,
    decision_path,
    draw_decision_flow,
    draw_environment_costs,
    is_highlighted,
    update_decision_flow,
    update_environment_costs,
)
from .timeline_chart import TimelineChart, memory_timeline, memory_timelines

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
    "gpu_fit_height",
    "is_highlighted",
    "layout_problems",
    "memory_timeline",
    "memory_timelines",
    "update_decision_flow",
    "update_environment_costs",
    "update_gpu_fit",
    "ways_to_fit",
]
