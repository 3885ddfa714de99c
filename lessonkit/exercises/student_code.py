"""Checking a student's function against test cases: it runs in a process of its own (see
student_process) under a hard time limit, with a stand-in torch per case.

A function that loops forever, holds the interpreter in one long C call, calls ``sys.exit`` or
raises gets feedback naming what happened; the notebook keeps running, and nothing the function
does reaches the checker: only its printout comes back, and the grading happens here.
"""

from __future__ import annotations

import types
from typing import Any

from .answer_parsing import _describe
from .check_result import CheckResult
from .expected import EXPECTED as _EXPECTED
from .student_process import run_cases

# Seconds a student's function may run, all of its cases together.
_FUNCTION_TIME_LIMIT = 0.6


def _check_function(qid: str, question: dict[str, Any], answer: object) -> CheckResult:
    title = question.get("title", "")
    # The exact type: isinstance or hasattr would run the answer's own __getattr__ or
    # __class__ here, in the checker.
    if type(answer) is not types.FunctionType:
        return CheckResult(
            qid,
            title,
            "not yet",
            f"Pass your function itself (its name, without brackets), got {_describe(answer)}.",
        )
    cases = _EXPECTED[qid]()
    run = run_cases(answer, [torch for _, torch, _ in cases], _FUNCTION_TIME_LIMIT)
    if any(outcome.not_implemented for outcome in run.outcomes):
        return CheckResult(
            qid,
            title,
            "not answered",
            "Not answered yet: replace the `raise NotImplementedError` line.",
        )
    details, passed = [], 0
    for index, (label, _, verify) in enumerate(cases):
        if index < len(run.outcomes):
            outcome = run.outcomes[index]
            if outcome.problem is not None:
                if outcome.problem.startswith("raised ") and _keeps_placeholder(answer):
                    return CheckResult(
                        qid,
                        title,
                        "not answered",
                        "Not answered yet: replace the `answer = ...` line in your "
                        "function with your code.",
                    )
                details.append(f"✘ {label}: {outcome.problem}")
                continue
            problem = verify(outcome.printed)
            passed += problem is None
            details.append(f"✔ {label}" if problem is None else f"✘ {label}: {problem}")
        elif index == len(run.outcomes):
            details.append(f"✘ {label}: {run.stopped}")
        else:
            details.append(f"✘ {label}: not run (the check stopped at the case above)")
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


def _keeps_placeholder(function: types.FunctionType) -> bool:
    """Whether a function still holds the exercise's placeholder line ``answer = ...``."""
    code = function.__code__
    return "answer" in code.co_varnames and any(c is ... for c in code.co_consts)
