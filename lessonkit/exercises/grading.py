"""Autograded tests for nbgrader: a point when ``check`` says correct, silence otherwise.

Each checked question of the solution notebooks is followed by a locked nbgrader test cell that
calls ``autograde(question_id, answer)``. When nbgrader runs the notebook (``nbgrader autograde``
or ``nbgrader validate`` set ``NBGRADER_EXECUTION``) a wrong, odd or missing answer raises
AssertionError, so the cell scores 0; anywhere else the call does nothing visible, so a student's
Run All still reaches the end and ``check`` stays the place for feedback.

A student's function (05.1) is run by ``check`` in a process of its own, so what it does cannot
change a grade; ``run_on_this_machine`` shows what it prints on the student's own machine and
is not called at all under nbgrader. What a student's notebook runs at its top level shares the
kernel with the test cells: nbgrader cannot keep such code away from the checker
(docs/instructor-guide.md, "What students' code can reach").
"""

from __future__ import annotations

import os
import types

from ..safe_repr import describe_error, short_str
from .answer_parsing import _describe
from .checking import check

__all__ = ["autograde", "grading", "run_on_this_machine"]


def grading() -> bool:
    """True while nbgrader autogrades or validates the notebook."""
    return bool(os.environ.get("NBGRADER_EXECUTION"))


def autograde(question_id: str, answer: object) -> None:
    """Under nbgrader, raise AssertionError unless ``check(question_id, answer)`` says correct."""
    result = check(question_id, answer, show=False)
    if grading() and result.correct is not True:
        raise AssertionError(f"{result.question_id} is {result.status}: {result.message}")


def run_on_this_machine(function: object) -> None:
    """Call a student's GPU check here, with this machine's torch, to see what it prints; a
    failure is one line, not a traceback. Under nbgrader it is not called (see above)."""
    if grading():
        print("Not run while nbgrader grades: check has run it on stand-in GPUs.")
        return
    if type(function) is not types.FunctionType:
        print(f"Pass your function itself (its name, without brackets), got {_describe(function)}.")
        return
    try:
        function()
    except Exception as err:  # the placeholder, or a bug still in it
        print(f"Fix {short_str(function.__name__, 60)} above first ({describe_error(err)}).")
