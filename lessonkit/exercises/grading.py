"""Autograded tests for nbgrader: a point when ``check`` says correct, silence otherwise.

Each checked question of the solution notebooks is followed by a locked nbgrader test cell that
calls ``autograde(question_id, answer)``. When nbgrader runs the notebook (``nbgrader autograde``
or ``nbgrader validate`` set ``NBGRADER_EXECUTION``) a wrong, odd or missing answer raises
AssertionError, so the cell scores 0; anywhere else the call does nothing visible, so a student's
Run All still reaches the end and ``check`` stays the place for feedback.
"""

from __future__ import annotations

import os

from .checking import check

__all__ = ["autograde", "grading"]


def grading() -> bool:
    """True while nbgrader autogrades or validates the notebook."""
    return bool(os.environ.get("NBGRADER_EXECUTION"))


def autograde(question_id: str, answer: object) -> None:
    """Under nbgrader, raise AssertionError unless ``check(question_id, answer)`` says correct."""
    result = check(question_id, answer, show=False)
    if grading() and result.correct is not True:
        raise AssertionError(f"{result.question_id} is {result.status}: {result.message}")
