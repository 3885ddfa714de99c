"""The reflection check: verdicts over a corpus of real-looking answers, wrong claims named with
why they are wrong, never a mention for a contradicted point, a model answer after an attempt,
and work linear in the answer's length."""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

from lessonkit.exercises.checking import answer_key, check, key_points_found, question_ids
from lessonkit.exercises.expected import bank, misconceptions

CORPUS = json.loads(
    (Path(__file__).with_name("reflection_corpus.json")).read_text(encoding="utf-8")
)["answers"]
REFLECTIONS = [qid for qid in question_ids() if bank()[qid]["kind"] == "text"]
CASES = [(qid, index) for qid in CORPUS for index in range(len(CORPUS[qid]))]
MENTIONED, CONTRADICTED = "(your answer mentions this)", "(your answer contradicts this)"


def found_claims(qid: str, answer: str) -> list[str]:
    from lessonkit.exercises.reflections import normalise, read_answer

    return sorted(read_answer(normalise(answer)[1], bank()[qid], misconceptions()).wrong)


# ----- the corpus ---------------------------------------------------------------------------
def test_the_corpus_holds_every_kind_of_answer_for_every_reflection():
    assert sorted(CORPUS) == sorted(REFLECTIONS)
    for qid, answers in CORPUS.items():
        kinds = Counter(item["kind"] for item in answers)
        assert len(answers) >= 40, qid
        assert {"good", "partial", "wrong", "negated", "off-topic", "copied"} <= set(kinds), qid
        assert kinds["good"] >= 10 and kinds["wrong"] >= 10 and kinds["partial"] >= 10, qid
        for item in answers:
            assert set(item.get("wrong_claims", [])) <= set(bank()[qid]["misconceptions"]), item


@pytest.mark.parametrize(("qid", "index"), CASES, ids=[f"{q}-{i}" for q, i in CASES])
def test_each_corpus_answer_gets_its_expected_verdict(qid, index):
    item = CORPUS[qid][index]
    result = check(qid, item["answer"], show=False)
    assert result.verdict == item["verdict"], (item["answer"], str(result))
    assert found_claims(qid, item["answer"]) == item.get("wrong_claims", []), item["answer"]


def test_the_verdict_accuracy_over_the_corpus_is_reported_exactly():
    """The figure a report quotes: every answer's verdict, not a sample."""
    right = sum(
        check(q, CORPUS[q][i]["answer"], show=False).verdict == CORPUS[q][i]["verdict"]
        for q, i in CASES
    )
    assert right == len(CASES) and len(CASES) >= 4 * 40


def test_a_contradicted_point_is_never_reported_as_mentioned():
    for qid, answers in CORPUS.items():
        points = [point["id"] for point in bank()[qid]["key_points"]]
        for item in answers:
            result = check(qid, item["answer"], show=False)
            for claim in item.get("wrong_claims", []):
                point = misconceptions()[claim]["contradicts"]
                if point in points:
                    line = result.details[points.index(point)]
                    assert line.endswith(CONTRADICTED) and MENTIONED not in line, (item, line)


# ----- the answers ------------------------------------------------------------------
CONFIDENTLY_WRONG = (
    "The gradients live in CPU memory, so they cost the GPU nothing. AdamW keeps its two states "
    "on disk. The CUDA context is zero bytes."
)


def test_the_confidently_wrong_answer_is_not_credited_and_each_claim_is_explained():
    result = check("06.5", CONFIDENTLY_WRONG, show=False)
    assert result.status == "not yet" and result.verdict == "wrong claim"
    assert key_points_found("06.5", CONFIDENTLY_WRONG)[0] == 0
    assert sum(d.endswith(CONTRADICTED) for d in result.details) == 3, result.details
    for quote in (
        "The gradients live in CPU memory",
        "AdamW keeps its two states on disk",
        "The CUDA context is zero bytes",
    ):
        assert f'"{quote}' in result.message, result.message
    assert "next to its weight" in result.message and "before the first tensor" in result.message


def test_ddr5_faster_than_hbm_is_not_credited_with_the_bandwidth_point():
    answer = "DDR5 has higher bandwidth than HBM, so system RAM is fine for training big models."
    result = check("06.3", answer, show=False)
    assert result.verdict == "wrong claim" and result.details[0].endswith(CONTRADICTED)
    figures = {
        link["name"]: link["bandwidth_gbs"]
        for link in __import__(
            "lessonkit.exercises", fromlist=["bandwidth_ladder"]
        ).bandwidth_ladder()
    }
    assert f"{figures['DDR5 system RAM']:,.1f} GB/s" in result.message  # computed, not typed


def test_a_fourteen_gb_model_on_sixteen_gb_is_named_as_the_wrong_claim():
    result = check(
        "06.5", "The model is 14 GB so 16 GB is enough, it should just fit fine.", show=False
    )
    assert result.verdict == "wrong claim" and "14 GB is only the weights" in result.message


def test_a_denied_misconception_counts_as_the_point():
    result = check(
        "06.5",
        "The CUDA context is not free: it takes memory before any tensor, and"
        " nothing else is simple either.",
        show=False,
    )
    assert result.verdict == "partial" and result.details[3].endswith(MENTIONED), result.details


# ----- the feedback -------------------------------------------------------------------------
@pytest.mark.parametrize("qid", REFLECTIONS)
def test_the_model_answer_is_shown_after_an_attempt_and_is_itself_complete(qid):
    attempt = check(
        qid, "I think it has something to do with the memory of the card somehow.", show=False
    )
    assert attempt.model_answer and f"A model answer: {attempt.model_answer}" in str(attempt)
    assert "A model answer" in attempt._repr_html_()
    model = check(qid, attempt.model_answer, show=False)
    assert model.verdict == "complete", str(model)
    for untried in (..., "Your answer here", "too short to count"):
        assert not check(qid, untried, show=False).model_answer
    copied = check(qid, bank()[qid]["question"], show=False)
    assert copied.verdict == "question copied" and not copied.model_answer


@pytest.mark.parametrize("qid", REFLECTIONS)
def test_the_feedback_asks_for_no_tick_it_cannot_take(qid):
    for item in CORPUS[qid]:
        result = check(qid, item["answer"], show=False)
        assert "tick" not in str(result).lower() and "☐" not in result._repr_html_()


def test_the_first_reflection_asks_beyond_the_guides_three():
    points = " ".join(p["point"] for p in bank()["01.6"]["key_points"]).lower()
    assert "gradient" in points and "context" in points and "allocator" in points
    assert "activation" not in points and "optimizer states" not in points
    only_the_guide = check(
        "01.6",
        "The optimizer states take twice the weights and the activations grow with the batch size.",
        show=False,
    )
    assert only_the_guide.verdict == "off topic" and "guide's own three" in only_the_guide.message


# The units a figure in feedback can share with a number question's answer.
_SAME_UNIT = {"GB": ("GB", "GiB"), "GiB": ("GB", "GiB"), "x": ("x",), "times": ("x",)}


def _figures(text: str) -> list[tuple[float, str]]:
    """(value, unit) of each figure with a unit; a figure in GB is read in GB."""
    text = re.sub(r"\d+ bytes per param\w*", "", text)  # a definition the course teaches
    return [
        (float(number.replace(",", "")), unit)
        for number, unit in re.findall(r"(\d[\d,]*\.?\d*)\s*(GB/s|GiB|GB|x|times)\b", text)
    ]


def test_the_feedback_gives_no_other_exercises_answer_away():
    """Whys and model answers quote computed figures, never a number question's answer."""
    from lessonkit.exercises.answer_parsing import _read_number
    from lessonkit.exercises.reflection_text import fill
    from lessonkit.units import GB

    texts = [fill(m["why"]) for m in misconceptions().values()]
    texts += [fill(bank()[q]["model_answer"]) for q in REFLECTIONS]
    numbers = [q for q in question_ids() if bank()[q]["kind"] == "number"]
    checked = 0
    for text in texts:
        for value, unit in _figures(text):
            for qid in numbers:
                if bank()[qid].get("unit") not in _SAME_UNIT.get(unit, ()):
                    continue
                expected = float(answer_key(qid))
                shown = _read_number(
                    f"{value} {'GB' if unit == 'GB' else ''}".strip(), bank()[qid]["unit"]
                )
                if bank()[qid]["unit"] == "GiB" and unit == "GB":
                    shown = value * GB / 2**30
                checked += 1
                assert not (expected and abs(shown / expected - 1) < 0.02), (qid, value, text)
    assert checked  # the figures were compared with something


def test_every_misconception_names_a_claim_a_why_and_a_point_it_contradicts():
    """Each claim contradicts a key point of a question that looks for it (in another question
    it may stand for a given of that question, such as the optimizer states in 01.6)."""
    for claim_id, claim in misconceptions().items():
        assert claim["claim"] and claim["why"] and claim["patterns"], claim_id
        users = [q for q in REFLECTIONS if claim_id in bank()[q]["misconceptions"]]
        assert users, f"{claim_id} is used by no question"
        points = {p["id"] for q in users for p in bank()[q]["key_points"]}
        assert claim["contradicts"] in points, claim_id


# ----- linear time --------------------------------------------------------------------------
class Counting:
    """A compiled pattern that counts the characters each call hands to the regex engine."""

    total = 0

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern = pattern

    def _count(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> None:
        Counting.total += max(0, min(endpos, len(string)) - pos)

    def finditer(self, string, pos=0, endpos=sys.maxsize):
        self._count(string, pos, endpos)
        return self.pattern.finditer(string, pos, endpos)

    def search(self, string, pos=0, endpos=sys.maxsize):
        self._count(string, pos, endpos)
        return self.pattern.search(string, pos, endpos)

    def match(self, string, pos=0, endpos=sys.maxsize):
        self._count(string, pos, endpos)
        return self.pattern.match(string, pos, endpos)


def work(qid: str, answer: str, monkeypatch: pytest.MonkeyPatch) -> int:
    from lessonkit.exercises import reflections

    for name in (
        "_CLAUSE_END",
        "_NEGATION",
        "_NEGATED_AFTER",
        "_DENIAL",
        "_REPORTED",
        "_PART_END",
        "_CONTRAST",
    ):
        if hasattr(reflections, name):
            monkeypatch.setattr(reflections, name, Counting(getattr(reflections, name)))
    if hasattr(reflections, "_compiled"):
        compiled = reflections._compiled
        monkeypatch.setattr(reflections, "_compiled", lambda p: Counting(compiled(p)))
    Counting.total = 0
    check(qid, answer, show=False)
    monkeypatch.undo()
    return Counting.total


@pytest.mark.parametrize(
    "unit",
    [
        "No gradients are kept here. ",  # many clauses, every key word negated
        "no gradient, ",  # one long clause
        "The GPU's memory bandwidth is not 14 GB/s. ",  # the 20k-character answer
        "the cuda context is zero bytes and the gradients live on the cpu; ",
    ],
)
@pytest.mark.parametrize("qid", ["06.3", "06.5"])
def test_the_check_does_work_linear_in_the_answers_length(qid, unit, monkeypatch):
    short, long = unit * (2_000 // len(unit)), unit * (16_000 // len(unit))
    small, large = work(qid, short, monkeypatch), work(qid, long, monkeypatch)
    assert small > 0
    assert large <= 8 * 1.25 * small, (small, large)  # 8 times the text: about 8 times the work
