"""Running a student's function against test cases, under a time limit, with a stand-in torch.

A function that loops forever, calls ``sys.exit`` or raises gets feedback naming what happened;
the notebook keeps running.
"""

from __future__ import annotations

import time
from typing import Any

from ..health.fake_torch import StudentExit, TimeLimitExceeded, run_with_fake_torch
from ..safe_repr import describe_error, short_str
from .answer_parsing import _describe
from .check_result import CheckResult
from .expected import EXPECTED as _EXPECTED

# Seconds a student's function may run, all of its cases together.
_FUNCTION_TIME_LIMIT = 0.6


def _check_function(qid: str, question: dict[str, Any], answer: object) -> CheckResult:
    title = question.get("title", "")
    if not callable(answer) or not hasattr(answer, "__code__"):
        return CheckResult(
            qid,
            title,
            "not yet",
            f"Pass your function itself (its name, without brackets), got {_describe(answer)}.",
        )
    cases = _EXPECTED[qid]()
    details, passed = [], 0
    deadline = time.monotonic() + _FUNCTION_TIME_LIMIT
    for label, torch, verify in cases:
        left = deadline - time.monotonic()
        if left <= 0:
            details.append(f"✘ {label}: not run (the time limit was used up)")
            continue
        try:
            printed = run_with_fake_torch(answer, torch, time_limit=left)
        except NotImplementedError:
            return CheckResult(
                qid,
                title,
                "not answered",
                "Not answered yet: replace the `raise NotImplementedError` line.",
            )
        except (TimeLimitExceeded, StudentExit) as err:
            details.append(f"✘ {label}: {short_str(err)}")
            continue
        except Exception as err:  # the student's code failed: that is the feedback
            if _keeps_placeholder(answer):
                return CheckResult(
                    qid,
                    title,
                    "not answered",
                    "Not answered yet: replace the `answer = ...` line in your "
                    "function with your code.",
                )
            details.append(f"✘ {label}: raised {describe_error(err)}")
            continue
        problem = verify(printed)
        passed += problem is None
        details.append(f"✔ {label}" if problem is None else f"✘ {label}: {problem}")
    if passed == len(cases):
        return CheckResult(
            qid,
            title,
            "correct",
            f"Correct: your function passes all {passed} cases.",
            details=details,
        )
    return CheckResult(
        qid, title, "not yet", f"Not yet: {passed} of {len(cases)} cases pass.", details=details
    )


def _keeps_placeholder(function: Any) -> bool:
    """Whether a function still holds the exercise's placeholder line ``answer = ...``."""
    code = function.__code__
    return "answer" in code.co_varnames and any(c is ... for c in code.co_consts)
