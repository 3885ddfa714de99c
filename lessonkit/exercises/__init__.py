"""What the notebooks check: ``check(question_id, answer)`` in the practice notebooks,
``predict``/``reveal`` and the recall ``quiz`` in the course notebooks, and ``autograde`` for
nbgrader.

Layer 8 of lessonkit: imports every layer below it (expected answers are computed by the
calculator and the catalogs when they are checked), never the command line.
"""

from .check_result import STATUSES, CheckResult
from .checking import answer_key, check, hint, key_points_found, options, question_ids
from .expected import bandwidth_ladder
from .grading import autograde, run_on_this_machine
from .predictions import predict, reveal
from .quiz import quiz, quiz_ids

__all__ = [
    "STATUSES",
    "CheckResult",
    "answer_key",
    "autograde",
    "bandwidth_ladder",
    "check",
    "hint",
    "key_points_found",
    "options",
    "predict",
    "question_ids",
    "quiz",
    "quiz_ids",
    "reveal",
    "run_on_this_machine",
]
