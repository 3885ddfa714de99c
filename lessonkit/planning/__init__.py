"""Planning a run: what fits on which GPUs (``find_fit``), where to train (``recommend``),
the sentences that compare the guide with the numbers, the course's one answer to each
question it asks in several notebooks (``course_answers``), and why a run ran out of memory
(``oom_doctor``).

Layer 4 of lessonkit: imports the basics, models, memory and hardware.
"""

from ..hardware.gpu_records import fit_verdict, is_tight
from .course_answers import (
    CourseAnswer,
    a100_full_answer,
    cheapest_environment_answer,
    course_answers,
    guide_range_answer,
    t4_answer,
)
from .fitting import (
    TIGHT_FRACTION,
    find_fit,
    fit_changes,
    flops_per_token,
    method_label,
    method_settings,
)
from .guide_claims import (
    a100_price_verdict,
    colab_a100_verdict,
    enterprise_markup_verdict,
    free_tier_experiments_verdict,
    free_tier_memory_verdict,
    guide_claim_verdicts,
    guide_gpu_table,
)
from .oom import oom_doctor
from .recommender import recommend
from .training_objects import describe_run
from .verdicts import full_on_one_a100

__all__ = [
    "TIGHT_FRACTION",
    "CourseAnswer",
    "a100_full_answer",
    "a100_price_verdict",
    "cheapest_environment_answer",
    "colab_a100_verdict",
    "course_answers",
    "describe_run",
    "enterprise_markup_verdict",
    "find_fit",
    "fit_changes",
    "fit_verdict",
    "flops_per_token",
    "free_tier_experiments_verdict",
    "free_tier_memory_verdict",
    "full_on_one_a100",
    "guide_claim_verdicts",
    "guide_gpu_table",
    "guide_range_answer",
    "is_tight",
    "method_label",
    "method_settings",
    "oom_doctor",
    "recommend",
    "t4_answer",
]
