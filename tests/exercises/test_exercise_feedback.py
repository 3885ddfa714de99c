"""Feedback that explains: a wrong GPU, environment or model says why it is not the answer,
05.1 quotes the total the function printed, 05.3 asks one thing, 05.6 reads the explorers'
sizes, and no reason names the answer."""

from __future__ import annotations

import pytest

from lessonkit.exercises.checking import answer_key, check
from lessonkit.exercises.expected import bank


def status_and_message(qid: str, answer: object) -> tuple[str, str]:
    result = check(qid, answer, show=False)
    return result.status, result.message


def catalog_names(source: str) -> list[str]:
    if source == "gpus":
        from lessonkit.hardware.gpus import gpu_names

        return gpu_names()
    if source == "environments":
        from lessonkit.hardware.environments import list_environments

        return [env.name for env in list_environments()]
    from lessonkit.models.presets import preset_names

    return preset_names()


CATALOG_QUESTIONS = [
    qid for qid, q in bank().items() if q.get("options_from") in ("gpus", "environments", "models")
]


@pytest.mark.parametrize("qid", CATALOG_QUESTIONS)
def test_every_wrong_gpu_environment_or_model_gets_a_reason_that_hides_the_answer(qid):
    accepted = answer_key(qid)
    accepted = {accepted} if isinstance(accepted, str) else set(accepted)
    multi = bank()[qid]["kind"] == "multi"
    for name in catalog_names(bank()[qid]["options_from"]):
        if name in accepted:
            continue
        result = check(qid, [*sorted(accepted), name] if multi else name, show=False)
        assert result.status == "not yet", name
        said = " ".join([result.message, *result.details])
        if multi:
            assert any(d.startswith(f"✘ {name}: ") for d in result.details), (name, said)
        else:
            assert f"{name} is not the answer: " in result.message, said
        for right in accepted:
            assert right not in said.replace(name, ""), (right, said)


def test_the_t4_is_not_the_answer_to_04_4_and_the_feedback_says_why():
    from lessonkit import get_gpu

    t4 = get_gpu("T4")
    message = check("04.4", "T4", show=False).message
    assert "T4 is not the answer: " in message
    assert f"${t4.price_per_hour.typical:,.2f}/h" in message and "$0.50 budget" in message


def test_a_workstation_and_a_free_tier_that_does_not_fit_say_why():
    local = check("03.1", "local", show=False).message
    assert "bought, not rented" in local
    too_small = check("03.2", "colab", show=False).message
    assert "none of its single-GPU offers fits the run" in too_small


def test_05_6_reads_the_sizes_the_explorers_offer():
    status, message = status_and_message("05.6", "13B")
    assert status == "not yet" and "Unknown" not in message, message
    assert "13B stands for the llama-2-13b shape" in message and "does not fit the T4" in message
    seven = check("05.6", "7B", show=False).message
    assert "fits the T4, but a preset with more parameters fits too" in seven
    unknown = check("05.6", "20B", show=False).message
    assert "is a size, not a preset" in unknown


def test_05_3_asks_one_thing_and_names_the_free_tiers_gpus_when_right():
    from lessonkit.hardware.environments import list_environments

    expected = answer_key("05.3")
    assert bank()["05.3"]["kind"] == "multi" and isinstance(expected, set)
    result = check("05.3", sorted(expected), show=False)
    assert result.status == "correct"
    free = {o.gpu.name for e in list_environments() for o in e.offers if o.free}
    for name in free & expected:
        assert name in result.message.split("Of these")[1], result.message
    assert check("05.3", len(expected), show=False).status == "not yet"  # a count is not it


def health_check_printing(total_text: str):
    def check_gpu_health():
        import torch

        if not torch.cuda.is_available():
            print("[ERROR] No GPU detected.")
            return
        print(f"Primary GPU: {torch.cuda.get_device_name(0)}")
        print(f"Total VRAM: {total_text}")

    return check_gpu_health


def test_05_1_quotes_the_total_the_function_printed_not_the_device_name():
    result = check("05.1", health_check_printing("16.00 GB"), show=False)
    a100 = next(d for d in result.details if "A100 80GB" in d)
    assert "(16.00 GB)" in a100 and "(80 GB)" not in a100, a100
