"""No example a student reads is an expected answer, and hints come in steps.

Examples are the literals the exercise notebooks quote as the form of an answer (`"7.5 GB"`,
"a number such as `8.9`"), the numbers after "e.g." or "such as" in their text and in the hints,
and the checker's own examples for each unit. Each is read in the unit of every numeric question
and compared with that question's answer, computed now by lessonkit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lessonkit.exercises.answer_feedback import _OTHER_EXAMPLES
from lessonkit.exercises.answer_parsing import _EXAMPLES, _read_number, _Unreadable
from lessonkit.exercises.checking import _WANTED, answer_key, check, hint, question_ids
from lessonkit.exercises.expected import bank

ROOT = Path(__file__).resolve().parents[2]
CLOSE = 0.12  # an example within 12% of an answer (or its tolerance) gives it away
# Literals quoted as code in prose: `"7.5 GB"`, `'0.5'`, `8.9`.
QUOTED = re.compile(r"`[\"']?([$\d][^`\"']*)[\"']?`")
# Numbers shortly after the words that introduce an example.
AFTER_EXAMPLE_WORDS = re.compile(
    r"(?:e\.g\.|such as|for example|for instance)[^.;\n]{0,40}?(\$?\d[\d.,]*\s*[A-Za-z$/%]*)"
)


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def student_texts() -> list[tuple[str, str]]:
    """(where, text) of everything a student reads before answering: the exercise notebooks'
    prose and code comments, and every step of every hint."""
    texts = []
    for path in sorted((ROOT / "exercises").glob("*.ipynb")):
        for index, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            text = _source(cell)
            if cell["cell_type"] == "code":
                text = "\n".join(line.split("#", 1)[1] for line in text.splitlines() if "#" in line)
            texts.append((f"{path.name} cell {index}", text))
    for qid in question_ids():
        for step, text in enumerate(bank()[qid].get("hints", []), start=1):
            texts.append((f"{qid} hint {step}", text))
    return texts


def examples() -> list[tuple[str, str, str | None]]:
    """(where, literal, the unit of the question it is an example for, or None)."""
    found: list[tuple[str, str, str | None]] = []
    for where, text in student_texts():
        found += [(where, m.group(1).strip(), None) for m in QUOTED.finditer(text)]
        found += [(where, m.group(1).strip(), None) for m in AFTER_EXAMPLE_WORDS.finditer(text)]
    for table in (_EXAMPLES, _OTHER_EXAMPLES):
        for unit, text in table.items():
            for part in re.split(r"\s+or\s+", text):
                literal = re.sub(r"\(.*?\)", "", part).strip(" '\"")
                found.append((f"checker example for {unit or 'no unit'}", literal, unit))
    for kind, text in _WANTED.items():
        for part in re.findall(r"\d[\d.]*(?: GB)?", text):
            found.append((f"checker example for a {kind} question", part, "GB"))
    return found


# The kind of quantity a unit measures: an example is compared with answers of its own kind.
FAMILIES = {"GB": "bytes", "GiB": "bytes", "$": "money", "$/h": "money", "s": "time", "h": "time"}


def _family(unit: str) -> str:
    return FAMILIES.get(unit, unit)


def _literal_family(literal: str) -> str | None:
    """The kind of quantity a literal's own unit names; None for a bare number."""
    unit = re.sub(r"^\$?[\d.,eE+-]+\s*", "", literal).strip().lower()
    if literal.startswith("$") or unit.endswith("/h") or unit in ("usd", "dollars"):
        return "money"
    if unit in ("gb", "gib", "mb", "mib", "tb", "bytes"):
        return "bytes"
    if unit in ("s", "ms", "min", "seconds", "h", "hours"):
        return "time"
    if unit in ("x", "times"):
        return "x"
    if unit in ("b/param", "bytes/param"):
        return "B/param"
    if unit in ("k", "m", "b", "million", "billion"):
        return "params"
    return unit or None


def answers() -> list[tuple[str, dict, float]]:
    """(question id, question, expected value) of every numeric answer, table rows included."""
    found = []
    for qid in question_ids():
        question = bank()[qid]
        if question["kind"] == "number":
            found.append((qid, question, float(answer_key(qid))))
        elif question["kind"] == "table":
            found += [(f"{qid} {row}", question, float(v)) for row, v in answer_key(qid).items()]
    return found


def test_the_scan_finds_the_examples_it_is_meant_to():
    found = {literal for _, literal, _ in examples()}
    assert {"7.5 GB", "45 s", "$12.50", "42.0 GB"} <= found  # intros and 01.1's form
    assert any(where.startswith("checker") for where, _, _ in examples())
    assert len(answers()) > 20


def test_no_example_is_an_expected_answer():
    """An example with a unit is compared with every answer of that kind of quantity; a bare
    one with the answers of its own notebook (or of the checker's unit it illustrates)."""
    given_away = []
    for where, literal, for_unit in examples():
        family = _literal_family(literal) or (_family(for_unit) if for_unit is not None else None)
        for qid, question, expected in answers():
            unit = question.get("unit", "")
            if family is not None and _family(unit) != family:
                continue
            if family is None and not where.startswith(qid[:2]) and where[:2] != qid[:2]:
                continue
            try:
                value = _read_number(literal, unit)
            except _Unreadable:
                continue
            tolerance = max(float(question.get("tolerance", 0.05)), CLOSE)
            if expected and abs(value / expected - 1) <= tolerance:
                given_away.append(f"{where}: {literal!r} is {qid}'s answer")
    assert not given_away, "\n".join(given_away)


def test_a_number_question_never_shows_an_example_equal_to_its_answer():
    """The example quoted back on unreadable input: not this question's answer either."""
    from lessonkit.exercises.answer_feedback import _compare

    for qid, question, expected in answers():
        if " " in qid:
            continue
        message = check(qid, "abc", show=False).message
        for literal in re.findall(r"such as '?([^' ]+(?: [A-Za-z/]+)?)'?", message):
            value = _read_number(literal, question.get("unit", ""))
            assert not _compare(value, expected, question)[0], (qid, message)


# ----- hints in steps -----------------------------------------------------------------------
CALL = re.compile(r"\w\(")  # a function called with brackets


@pytest.mark.parametrize("qid", [q for q in question_ids() if bank()[q]["kind"] != "text"])
def test_hints_come_in_steps_and_the_first_is_a_nudge(qid):
    steps = bank()[qid]["hints"]
    assert 2 <= len(steps) <= 3, qid
    nudge = steps[0]
    assert not CALL.search(nudge) and "lessonkit." not in nudge, (qid, nudge)
    assert [hint(qid, step) for step in range(1, len(steps) + 2)] == [*steps, steps[-1]]


def test_a_shown_check_moves_one_step_per_wrong_try_and_a_silent_one_does_not(capsys):
    from lessonkit.exercises import checking

    checking._WRONG_TRIES.clear()
    steps = bank()["01.7"]["hints"]
    first = check("01.7", 999)
    assert first.hint.startswith(f"(1 of {len(steps)}) {steps[0]}")
    assert check("01.7", 999, show=False).hint == first.hint  # nbgrader's silent check
    second = check("01.7", 998)
    assert f"(2 of {len(steps)}) {steps[1]}" in second.hint
    for _ in range(5):
        last = check("01.7", 997)
    assert last.hint == f"({len(steps)} of {len(steps)}) {steps[-1]}"
    check("01.7", answer_key("01.7"))  # right: the next wrong try starts from the nudge again
    assert check("01.7", 999).hint.startswith("(1 of")
    capsys.readouterr()
    checking._WRONG_TRIES.clear()


def test_the_first_wrong_try_never_spells_out_the_call():
    for qid in question_ids():
        if bank()[qid]["kind"] == "text":
            continue
        shown = check(qid, "abc", show=False).hint
        assert "lessonkit.estimate(" not in shown, (qid, shown)


@pytest.mark.parametrize("step", [0, -1, 1.5, "2", True, None])
def test_a_hint_step_must_be_a_whole_number_from_one(step):
    from lessonkit import LessonkitError

    with pytest.raises(LessonkitError, match="step must be a whole number"):
        hint("01.1", step)
