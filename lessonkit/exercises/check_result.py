"""The feedback on one exercise answer (``CheckResult``) and how it shows: text or HTML."""

from __future__ import annotations

import html
import sys
from dataclasses import dataclass, field
from typing import Any

STATUSES = ("correct", "not yet", "not answered", "self-check")
_COLOURS = {
    "correct": "#2e7d32",
    "not yet": "#e65100",
    "not answered": "#757575",
    "self-check": "#1565c0",
}
_ICONS = {"correct": "✔", "not yet": "✘", "not answered": "…", "self-check": "✎"}


@dataclass
class CheckResult:
    """Feedback on one answer. ``correct`` is None when there is nothing to grade.

    A reflection's result also carries its ``verdict`` (reflections.VERDICTS) and, after an
    attempt, a ``model_answer``.
    """

    question_id: str
    title: str
    status: str
    message: str
    hint: str = ""
    tolerance: str = ""
    details: list[str] = field(default_factory=list)
    verdict: str = ""
    model_answer: str = ""
    _shown_in: object = field(default=None, repr=False, compare=False)

    @property
    def correct(self) -> bool | None:
        return {"correct": True, "not yet": False}.get(self.status)

    def __str__(self) -> str:
        lines = [f"{self.question_id} {self.title}: {self.status.upper()}", self.message]
        lines += [f"  {d}" for d in self.details]
        if self.tolerance:
            lines.append(self.tolerance)
        if self.hint:
            lines.append(f"Hint: {self.hint}")
        if self.model_answer:
            lines.append(f"A model answer: {self.model_answer}")
        return "\n".join(line for line in lines if line)

    def __repr__(self) -> str:
        return f"<CheckResult {self.question_id}: {self.status}>"

    def _repr_html_(self) -> str:
        colour = _COLOURS.get(self.status, "#555")
        esc = html.escape
        details = "".join(f"<li>{esc(d)}</li>" for d in self.details)
        parts = [
            f"<div class='lessonkit-check' data-question='{esc(self.question_id)}' "
            f"data-status='{esc(self.status)}' style='border-left:4px solid {colour};"
            f"padding:4px 10px;margin:4px 0'>",
            f"<b style='color:{colour}'>{_ICONS.get(self.status, '')} {esc(self.question_id)} "
            f"{esc(self.title)}: {esc(self.status)}</b>",
            f"<div>{esc(self.message)}</div>",
            f"<ul style='margin:2px 0'>{details}</ul>" if details else "",
            f"<div><small>{esc(self.tolerance)}</small></div>" if self.tolerance else "",
            f"<div><i>Hint: {esc(self.hint)}</i></div>" if self.hint else "",
            (
                f"<div style='margin-top:4px'><b>A model answer:</b> {esc(self.model_answer)}</div>"
                if self.model_answer
                else ""
            ),
            "</div>",
        ]
        return "".join(parts)

    def _ipython_display_(self) -> None:
        # check() has already shown this result in the current cell: don't show it twice
        # when it is also the cell's last expression.
        shell = _ipython()
        if shell is not None and self._shown_in == shell.execution_count:
            self._shown_in = None
            return
        from IPython.display import display

        display({"text/plain": str(self), "text/html": self._repr_html_()}, raw=True)  # type: ignore[no-untyped-call]


def _ipython() -> Any:
    module = sys.modules.get("IPython")
    return module.get_ipython() if module is not None else None
