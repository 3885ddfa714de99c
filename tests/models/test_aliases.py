"""A model name that stands for another preset says what it was read as, wherever it is used
(estimate, the CLI, recommend, the OOM doctor); a mere spelling of the preset's name says
nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

import lessonkit
from lessonkit.cli.main import main
from lessonkit.models.presets import alias_note, get_preset

SAID = "'llama-3-8b' is read as the preset llama-3.1-8b"


def test_an_alias_is_said_in_the_estimate():
    report = lessonkit.estimate("llama-3-8b")
    assert report.model.name == "llama-3.1-8b"
    assert report.assumptions[0].startswith(SAID)
    assert alias_note(report.model).startswith(SAID)
    same = lessonkit.estimate("llama-3.1-8b")
    assert report.total_bytes == same.total_bytes
    assert replace(report.model, note="") == replace(same.model, note="")


@pytest.mark.parametrize("name", ["llama-3.1-8b", "Llama-3.1-8B", "llama3.1-8b", "llama 3.1 8b"])
def test_the_preset_and_its_spellings_say_nothing(name):
    assert alias_note(get_preset(name)) == ""
    assert "is read as" not in " ".join(lessonkit.estimate(name).assumptions)


@pytest.mark.parametrize(
    ("alias", "preset"),
    [("llama-3-70b", "llama-3.1-70b"), ("gpt2-small", "gpt2"), ("mistral-7b-v0.1", "mistral-7b")],
)
def test_every_alias_to_another_name_is_said(alias, preset):
    assert alias_note(get_preset(alias)) == f"'{alias}' is read as the preset {preset}."


def test_the_cli_says_it(capsys):
    assert main(["vram", "--model", "llama-3-8b"]) == 0
    assert SAID in capsys.readouterr().out
    assert main(["recommend", "--model", "llama-3-8b", "--platform", "colab"]) in (0, 1)
    assert SAID in capsys.readouterr().out


def test_recommend_and_the_oom_doctor_say_it():
    assert SAID in lessonkit.recommend("llama-3-8b", method="qlora", platform="colab").text()
    oom = (
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 14.75 GiB "
        "of which 1.00 GiB is free. Of the allocated memory 13.00 GiB is allocated by PyTorch, "
        "and 100.00 MiB is reserved by PyTorch but unallocated."
    )
    assert SAID in str(lessonkit.oom_doctor(oom, model="llama-3-8b", method="qlora"))
