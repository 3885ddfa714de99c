"""The recall quiz at the end of each course notebook: ``quiz("01.q1", "a")``.

Each question has a few options, and each option says why it is right or wrong: a wrong pick is
answered with why that option is wrong, a right one with why it is right. Where the answer is a
fact lessonkit computes (which part of a breakdown LoRA removes, whether the T4 has native bf16,
the slowest link of the bandwidth ladder), it is computed when checked. Questions live in
``data/quizzes.json``; ``quiz_markdown`` writes a notebook's questions as the notebook shows them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import lru_cache
from importlib import resources
from typing import Any

from ..errors import LessonkitError, normalise_name, unknown_name_message
from ..safe_repr import short_repr, short_str
from .check_result import CheckResult
from .checking import _show

__all__ = ["quiz", "quiz_ids", "quiz_markdown"]


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    text = resources.files("lessonkit").joinpath("data/quizzes.json").read_text(encoding="utf-8")
    found: dict[str, Any] = json.loads(text)
    return found


def quiz_ids(notebook: str | None = None) -> list[str]:
    """The quiz question ids, all or those of one notebook ('01' or '01_vram_equation')."""
    ids = list(_data()["questions"])
    return ids if notebook is None else [q for q in ids if q.startswith(str(notebook)[:2] + ".")]


def _question(question_id: object) -> tuple[str, dict[str, Any]]:
    qid = short_str(question_id, 40).strip().lower()
    questions = _data()["questions"]
    if qid not in questions:
        raise LessonkitError(unknown_name_message(qid, list(questions), "quiz question"))
    return qid, questions[qid]


# ----- answers computed by lessonkit --------------------------------------------------------
ANSWERS: dict[str, Callable[[], str]] = {}


def _answer(name: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    def register(fn: Callable[[], str]) -> Callable[[], str]:
        ANSWERS[name] = fn
        return fn

    return register


def _full_7b(**settings: Any) -> Any:
    from ..memory.estimating import estimate

    return estimate("7B", method="full", precision="bf16-mixed", optimizer="adamw", **settings)


@_answer("left_out_of_the_guide")
def _gradients_left_out() -> str:
    # The guide's three are weights, optimizer states and activations; the gradients are real.
    return "the-gradients" if _full_7b().breakdown["gradients"] > 0 else "nothing-those-three-are"


@_answer("what_lora_removes")
def _lora_removes() -> str:
    from ..memory.estimating import estimate

    full, lora = _full_7b().breakdown, estimate("7B", method="lora", precision="bf16").breakdown
    removed = (
        lora["gradients"] < 0.01 * full["gradients"]
        and lora["optimizer"] < 0.01 * full["optimizer"]
    )
    return "the-gradients-and-optimizer" if removed else "the-frozen-base-weights"


@_answer("what_checkpointing_shrinks")
def _checkpointing_shrinks() -> str:
    from ..memory.estimating import estimate

    def forward_peak(checkpointing: bool) -> float:
        run = estimate(
            "7B",
            method="lora",
            precision="bf16",
            batch_size=4,
            seq_len=1024,
            gradient_checkpointing=checkpointing,
        )
        return float(run.phase_peaks["forward"])

    plain, saved = forward_peak(False), forward_peak(True)
    return "saved-activations-for-recomputation" if saved < plain else "precision-of-the-weights"


@_answer("moe_weights_memory")
def _moe_weights_memory() -> str:
    from ..memory.estimating import estimate

    run = estimate("qwen3-30b-a3b", method="lora", precision="bf16")
    every_expert = 2 * run.model.n_params  # bf16: 2 bytes for each parameter held
    held = run.breakdown["weights"] >= 0.99 * every_expert
    return "all-its-parameters-every" if held else "its-active-parameters-about"


@_answer("sixteen_gb_card")
def _sixteen_gb_card() -> str:
    from ..hardware.gpus import get_gpu

    t4 = get_gpu("T4")
    return "a-little-less-than" if t4.usable_bytes < t4.memory_bytes else "exactly-16-gib"


@_answer("t4_bf16")
def _t4_bf16() -> str:
    from ..hardware.gpus import get_gpu

    return "the-t4-has-native" if get_gpu("T4").native_bf16 else "bf16-runs-emulated-and"


@_answer("p100_kernels")
def _p100_kernels() -> str:
    from ..hardware.gpus import get_gpu

    return "the-driver-is-not" if get_gpu("P100").current_wheels else "today-pytorch-wheels-have"


@_answer("slowest_link")
def _slowest_link() -> str:
    from .expected import bandwidth_ladder

    slowest = bandwidth_ladder()[0]["name"]
    ids = {"PCIe 4.0 x16": "pcie-4-0-x16", "DDR5 system RAM": "ddr5-system-ram"}
    return ids.get(slowest, "gddr6x-on-an-rtx")


def answer_of(question_id: str) -> str:
    """The id of the right option, computed now where lessonkit knows the fact."""
    _, question = _question(question_id)
    if "answer_from" in question:
        return ANSWERS[question["answer_from"]]()
    return str(question["answer"])


# ----- checking -----------------------------------------------------------------------------
def _lettered(question: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The options with their letters: a for the first, b for the second, ..."""
    return [(chr(ord("a") + index), option) for index, option in enumerate(question["options"])]


def _pick(answer: object, question: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(letter, option) an answer names: its letter ('b', '(b)', 'B)') or its text."""
    if not isinstance(answer, str) or len(answer) > 300:
        return None
    text = str.strip(str.__str__(answer))
    letter = re.fullmatch(r"\(?\s*([a-zA-Z])\s*[).:]?", text)
    for key, option in _lettered(question):
        if letter and letter.group(1).lower() == key:
            return key, option
        if normalise_name(text) == normalise_name(option["text"]):
            return key, option
    return None


def quiz(question_id: str, answer: object = ..., *, show: bool = True) -> CheckResult:
    """Check a pick: the letter of an option. The feedback says why the option picked is right
    or wrong; an untouched ``...`` shows the question and its options. Never raises for any
    answer (an unknown question id is a LessonkitError)."""
    qid, question = _question(question_id)
    title = question["question"]
    listing = [f"({key}) {option['text']}" for key, option in _lettered(question)]
    if answer is ... or answer is None or (isinstance(answer, str) and not str.strip(answer)):
        result = CheckResult(
            qid,
            title,
            "not answered",
            "Not answered yet: write the letter of your pick, in quotes.",
            details=listing,
        )
    else:
        try:
            picked = _pick(answer, question)
        except Exception:  # an answer whose own methods raise: not an option
            picked = None
        if picked is None:
            letters = ", ".join(key for key, _ in _lettered(question))
            result = CheckResult(
                qid,
                title,
                "not yet",
                f"Could not read {short_repr(answer, 60)}: write one letter ({letters}) in quotes.",
                details=listing,
            )
        else:
            key, option = picked
            if option["id"] == answer_of(qid):
                message = f"Correct: ({key}) {option['text']}. {option['why']}"
                result = CheckResult(qid, title, "correct", message)
            else:
                message = (
                    f"Not yet: ({key}) {option['text']} is not it. {option['why']} Pick again."
                )
                result = CheckResult(qid, title, "not yet", message, details=listing)
    if show:
        _show(result)
    return result


def quiz_markdown(question_id: str) -> str:
    """A quiz question as the notebook's markdown cell shows it: the question and its options."""
    qid, question = _question(question_id)
    number = quiz_ids(qid).index(qid) + 1
    options = "\n".join(f"- ({key}) {option['text']}" for key, option in _lettered(question))
    return f"**{number}. {question['question']}**\n\n{options}"
