"""The notebooks' live explorers: ipywidgets controls, a readout and a chart redrawn in place
(the VRAM explorer, the GPU matrix, environments, the decision flow, a step's timeline).

Layer 7 of lessonkit: imports the layers below it, charts included. ipywidgets is imported when
an explorer is built, not when this package is.
"""

from .explorer import static_mode
from .explorers import (
    CONTROL_NAMES,
    VRAM_CONTROLS,
    decision_flow_explorer,
    decision_readout,
    environment_explorer,
    environment_rows,
    fit_summary,
    gpu_matrix_explorer,
    peak_html,
    setup_html,
    vram_explorer,
)
from .timeline import timeline_explorer

__all__ = [
    "CONTROL_NAMES",
    "VRAM_CONTROLS",
    "decision_flow_explorer",
    "decision_readout",
    "environment_explorer",
    "environment_rows",
    "fit_summary",
    "gpu_matrix_explorer",
    "peak_html",
    "setup_html",
    "static_mode",
    "timeline_explorer",
    "vram_explorer",
]
