"""Planning a run: what fits on which GPUs (``find_fit``), where to train (``recommend``),
the sentences that compare the guide with the numbers, and why a run ran out of memory
(``oom_doctor``).

Layer 4 of lessonkit: imports the basics, models, memory and hardware.
"""

from .fitting import TIGHT_FRACTION, find_fit, fit_changes, method_label, method_settings
from .oom import oom_doctor
from .recommender import recommend
from .training_objects import describe_run
from .verdicts import full_on_one_a100

__all__ = [
    "TIGHT_FRACTION",
    "describe_run",
    "find_fit",
    "fit_changes",
    "full_on_one_a100",
    "method_label",
    "method_settings",
    "oom_doctor",
    "recommend",
]
