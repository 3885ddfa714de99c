"""nbgrader settings for the GPU Survival Guide: copy this file into your nbgrader course directory.

The solution notebooks (solutions/) are nbgrader source notebooks: answer cells are solution cells,
each checked question is followed by a locked autograded test cell with its points, and written
explanations are manually graded answers. With these settings ``nbgrader generate_assignment``
releases the same notebooks as exercises/ (tools/generate_exercises.py; a test compares them):

* the code stub is the kit's placeholder, which reports "not answered" instead of raising, so a
  student's Run All reaches the end (nbgrader's default ``raise NotImplementedError()`` stops it);
* cells tagged ``solution-only`` (notes that explain an answer) are not released, and links to a
  notebook under solutions/ point to exercises/ instead.

docs/instructor-guide.md has the commands, from setting up a course directory to autograding.
"""

import re

from nbgrader.converters import GenerateAssignment
from nbgrader.preprocessors import NbGraderPreprocessor

c = get_config()  # noqa: F821 (nbgrader provides it)

c.ClearSolutions.code_stub = {"python": "answer = ...  # your answer here"}
c.ClearSolutions.text_stub = "_Your answer here._"


class DropSolutionOnlyCells(NbGraderPreprocessor):
    """Leave out cells tagged solution-only; point links at exercises/ instead of solutions/."""

    def preprocess(self, nb, resources):
        nb.cells = [
            cell for cell in nb.cells if "solution-only" not in cell.metadata.get("tags", [])
        ]
        for cell in nb.cells:
            cell.source = re.sub(r"\bsolutions/(\d\d_\w+\.ipynb)", r"exercises/\1", cell.source)
        return nb, resources


c.GenerateAssignment.preprocessors = [
    DropSolutionOnlyCells,
    *GenerateAssignment.class_traits()["preprocessors"].default(),
]
