"""One answer per question: the notebooks' takeaways (cells tagged 'takeaway') word each
question the course asks in several places (the A100 line, what fits a T4, the guide's
"~120 to 160 GB", the cheapest environment) as lessonkit.planning.course_answers does."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from lessonkit.planning.course_answers import (
    a100_full_answer,
    cheapest_environment_answer,
    course_answers,
    disagreements,
    guide_range_answer,
    t4_answer,
)
from lessonkit.units import GiB

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
TAG = "takeaway"


def takeaway_texts() -> dict[str, str]:
    """Each bullet or paragraph of every markdown cell tagged 'takeaway', by where it is."""
    texts = {}
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type != "markdown" or TAG not in cell.metadata.get("tags", []):
                continue
            pieces = re.split(r"\n(?=- )|\n\s*\n", cell.source)
            for number, piece in enumerate(pieces):
                texts[f"{path.name} cell {cell.get('id')} part {number}"] = piece
    return texts


@pytest.fixture(scope="module")
def answers():
    return course_answers("7B")


def test_every_takeaway_gives_the_courses_answer(answers) -> None:
    assert disagreements(takeaway_texts(), answers) == []


def test_each_answer_is_given_in_several_notebooks(answers) -> None:
    texts = takeaway_texts()
    for answer in answers.values():
        where = {
            name.split(" cell ")[0] for name, text in texts.items() if answer.mentioned_in(text)
        }
        assert len(where) >= 2, (answer.key, where)


def test_the_takeaway_figures_come_from_the_answers() -> None:
    """Each notebook with a takeaway prints the figures behind it from course_answers, in a
    cell whose output is checked."""
    calls = re.compile(
        r"\b(a100_full_answer|t4_answer|guide_range_answer|cheapest_environment_answer)\("
    )
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        tagged = [c for c in nb.cells if TAG in c.metadata.get("tags", [])]
        if not tagged:
            continue
        code = [c for c in nb.cells if c.cell_type == "code" and calls.search(c.source)]
        assert code, f"{path.name}: takeaways without the figures of course_answers"


def test_the_check_catches_the_three_answers_to_the_a100_question(answers) -> None:
    """The three ways the course once answered the A100 question: the check lets only the
    course's answer through."""
    old = {
        "notebook 2": "The A100 line holds for full fine-tuning of a 7B model only with 8-bit "
        "states, offloading or several GPUs.",
        "notebook 6": "Even so, one A100 does not hold a full fine-tune of a 7B model with plain "
        "AdamW.",
        "the course": f"- {answers['a100'].takeaway}",
    }
    found = disagreements(old, answers)
    assert len(found) == 2 and all("A100" in line for line in found)
    assert not any(line.startswith("the course") for line in found)


def test_the_check_catches_a_t4_claim_that_leaves_lora_tight_out(answers) -> None:
    found = disagreements(
        {"notebook 3": "The free tier is enough for QLoRA/LoRA of 7B models."}, answers
    )
    assert len(found) == 1 and "T4" in found[0]


def test_the_a100_answer_is_pure_bf16_against_mixed_precision() -> None:
    from lessonkit import estimate, get_gpu

    usable = get_gpu("A100 80GB").usable_bytes
    answer = a100_full_answer("7B")
    pure = estimate("7B", method="full", precision="bf16", optimizer="adamw", seq_len=512)
    mixed = estimate("7B", method="full", precision="bf16-mixed", optimizer="adamw", seq_len=512)
    assert pure.total_bytes <= usable < mixed.total_bytes
    assert answer.figure == pure.total_bytes
    assert "in pure bf16, not with mixed-precision AdamW" in answer.takeaway
    assert f"{mixed.total_bytes / GiB:.1f} GiB" in answer.sentence
    assert f"{pure.total_bytes / GiB:.1f} GiB" in answer.sentence
    # a model small enough for mixed precision gets another answer, a large one a third
    assert "even with mixed-precision AdamW" in a100_full_answer("0.5B").takeaway
    assert "does not hold" in a100_full_answer("13B").takeaway


def test_the_t4_answer_says_each_method() -> None:
    from lessonkit import get_gpu, resolve_model
    from lessonkit.planning import find_fit

    t4 = get_gpu("T4")
    spec = resolve_model("7B")
    answer = t4_answer("7B")
    lora = find_fit(spec, "lora", t4.usable_bytes, native_bf16=t4.native_bf16)
    qlora = find_fit(spec, "qlora", t4.usable_bytes, native_bf16=t4.native_bf16)
    assert lora.tight and qlora.fits and not qlora.tight
    assert "QLoRA fits with room to spare; LoRA fits only tightly" in answer.takeaway
    assert answer.figure == qlora.peak_bytes
    assert "does not fit" in t4_answer("70B").takeaway.split("QLoRA", 1)[1].split(";")[0]


def test_the_guide_range_answer_places_mixed_precision_and_pure_bf16() -> None:
    from lessonkit.units import GB

    answer = guide_range_answer("7B")
    assert 120 * GB <= answer.figure <= 160 * GB
    assert answer.takeaway.startswith('The guide\'s "~120 to 160 GB" is what')
    assert "above the guide's" in guide_range_answer("13B").takeaway
    assert "below the guide's" in guide_range_answer("0.5B").takeaway


def test_the_cheapest_answer_is_the_cheapest_first_fit_of_each_environment() -> None:
    from lessonkit import recommend

    answer = cheapest_environment_answer("7B", "lora", 10_000_000)
    rec = recommend("7B", method="lora", tokens=10_000_000)
    first = {}
    for option in rec.options:
        if option.fits:
            first.setdefault(option.environment, option)
    costs = [o.cost_usd for o in first.values() if o.price_per_hour > 0]
    assert answer.figure == min(costs)
    # a tie to the cent: a student cannot tell two runs apart that both read $0.48
    assert set(answer.names) == {
        o.name
        for o in first.values()
        if o.price_per_hour > 0 and round(o.cost_usd, 2) == round(min(costs), 2)
    }
    assert f"${min(costs):,.2f}" in answer.sentence
    assert dict(answer.costs) == {o.name: o.cost_usd for o in first.values()}


def test_environment_reveals_accept_ties_to_the_cent_and_say_what_a_wrong_guess_costs() -> None:
    from lessonkit.exercises import reveal

    answer = cheapest_environment_answer("7B", "lora", 10_000_000)
    costs = dict(answer.costs)
    for name in answer.names:
        assert str(reveal(name, "environment", answer)).endswith(": right.")
    paid = sorted((cost, name) for name, cost in costs.items() if cost > 0)
    cost, wrong = next((c, n) for c, n in paid if n not in answer.names)
    text = str(reveal(wrong, "environment", answer))
    assert "not this time" in text
    assert f"${cost:,.2f} for the whole run, against ${answer.figure:,.2f}" in text
    free = next(name for name, cost in costs.items() if cost == 0)
    assert "is free, but the question asks for a paid one" in str(
        reveal(free, "environment", answer)
    )
