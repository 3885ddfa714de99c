"""The recall quiz at the end of each course notebook: every option says why it is right or
wrong, the right one is computed where lessonkit knows the fact, the notebooks show what the
data holds, and no answer ever raises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lessonkit import LessonkitError
from lessonkit.exercises import quiz, quiz_ids
from lessonkit.exercises.check_result import STATUSES
from lessonkit.exercises.quiz import ANSWERS, _data, answer_of, quiz_markdown

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def letters(qid: str) -> dict[str, dict]:
    return {chr(ord("a") + i): o for i, o in enumerate(_data()["questions"][qid]["options"])}


def right_letter(qid: str) -> str:
    return next(key for key, o in letters(qid).items() if o["id"] == answer_of(qid))


def test_each_course_notebook_has_a_few_questions_of_four_options():
    for path in NOTEBOOKS:
        ids = quiz_ids(path.name[:2])
        assert 3 <= len(ids) <= 6, path.name
        for qid in ids:
            options = letters(qid)
            assert len(options) == 4 and len({o["id"] for o in options.values()}) == 4, qid
            assert all(o["text"] and len(o["why"]) > 20 for o in options.values()), qid


def test_the_right_letter_is_not_always_the_same():
    spread = {right_letter(qid) for qid in quiz_ids()}
    assert len(spread) == 4, spread


@pytest.mark.parametrize("qid", quiz_ids())
def test_each_wrong_pick_says_why_that_option_is_wrong(qid):
    right = right_letter(qid)
    for key, option in letters(qid).items():
        result = quiz(qid, key, show=False)
        if key == right:
            assert result.status == "correct" and option["why"] in result.message
        else:
            assert result.status == "not yet", key
            assert f"({key}) {option['text']} is not it. {option['why']}" in result.message
            assert letters(qid)[right]["text"] not in result.message  # the answer stays hidden


@pytest.mark.parametrize("qid", quiz_ids())
def test_picks_are_read_by_letter_in_any_case_or_by_their_text(qid):
    right = right_letter(qid)
    for form in (right, right.upper(), f"({right})", f" {right}) ", letters(qid)[right]["text"]):
        assert quiz(qid, form, show=False).status == "correct", form


def test_computed_answers_follow_lessonkit(monkeypatch):
    import lessonkit.hardware.gpus as gpus

    assert {q["answer_from"] for q in _data()["questions"].values() if "answer_from" in q} <= set(
        ANSWERS
    )
    t4 = gpus.get_gpu("T4")
    before = answer_of("05.q1")
    real = gpus.get_gpu

    def with_native_bf16(name):
        gpu = real(name)
        return type(gpu)(**{**gpu.__dict__, "native_bf16": True}) if gpu is t4 else gpu

    monkeypatch.setattr(gpus, "get_gpu", with_native_bf16)
    assert answer_of("05.q1") != before  # the answer is computed when checked


ODD = [..., None, "", "  ", "z", "ab", 3, 2.5, ["a"], {"a": 1}, b"a", object(), "a" * 10_000_000]


@pytest.mark.parametrize("qid", quiz_ids())
def test_odd_answers_never_raise(qid):
    for answer in ODD:
        result = quiz(qid, answer, show=False)
        assert result.status in STATUSES and result.message
        assert result.status != "correct"
        assert len(result.message) < 500
    assert quiz(qid, ..., show=False).status == "not answered"
    assert len(quiz(qid, ..., show=False).details) == 4  # the options, to pick from


def test_an_unknown_question_is_a_clear_error():
    with pytest.raises(LessonkitError, match="quiz question"):
        quiz("01.q99", "a")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_each_course_notebook_ends_with_its_quiz_as_the_data_has_it(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    sources = ["".join(c["source"]) for c in cells]
    start = next(i for i, s in enumerate(sources) if s.startswith("## Check your understanding"))
    quiz_part = sources[start:]
    assert all(str(c["id"]).startswith("quiz-") for c in cells[start:])
    for qid in quiz_ids(path.name[:2]):
        assert quiz_markdown(qid) in quiz_part, qid
        assert any(s.startswith(f'quiz("{qid}", ...)') for s in quiz_part), qid
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "quiz_cells.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout


def test_the_quiz_cells_run_and_report_not_answered(capsys):
    from lessonkit.exercises import quiz as quiz_in_a_notebook

    for qid in quiz_ids():
        assert quiz_in_a_notebook(qid, ...).status == "not answered"
    assert "Not answered yet" in capsys.readouterr().out


def test_the_mixture_of_experts_answer_follows_the_estimate(monkeypatch):
    import lessonkit.memory.estimating as estimating

    assert answer_of("02.q4") == "all-its-parameters-every"
    real = estimating.estimate

    def weights_of_the_active_only(*args, **kwargs):
        report = real(*args, **kwargs)
        report.breakdown["weights"] = 2 * report.model.active_params
        return report

    monkeypatch.setattr(estimating, "estimate", weights_of_the_active_only)
    assert answer_of("02.q4") == "its-active-parameters-about"
