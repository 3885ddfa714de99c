"""Predict, then reveal: guesses read with units and names, compared with the number shown."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from lessonkit import LessonkitError
from lessonkit.exercises.predictions import predict, read_guess, reveal, reveal_text
from lessonkit.units import GB, GiB

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


@pytest.mark.parametrize(
    "guess, expected",
    [("100 GiB", 100 * GiB), ("120 GB", 120 * GB), (100, 100 * GiB), ("1.5 TB", 1.5e12)],
)
def test_memory_guesses_are_read_with_their_units_and_gib_by_default(guess, expected):
    read = read_guess(guess, "memory")
    assert read.ok and read.value == pytest.approx(expected)


@pytest.mark.parametrize("guess", [None, "", "  ", ...])
def test_no_guess_yet_says_what_to_write(guess, capsys):
    read = predict(guess, "memory", "The 7B total")
    assert not read.ok and "No guess yet" in capsys.readouterr().out and "'100 GiB'" in read.message


@pytest.mark.parametrize(
    "guess, kind, words",
    [
        ("lots", "memory", "Cannot read"),
        ("-5 GiB", "memory", "Cannot read"),
        ("RTX 4909", "gpu", "Did you mean"),
        ("colabb", "environment", "Did you mean"),
        (object(), "gpu", "Cannot read"),
    ],
)
def test_a_bad_guess_is_a_message_never_a_traceback(guess, kind, words):
    read = read_guess(guess, kind)
    assert not read.ok and words in read.message
    actual = {"memory": 10 * GiB, "gpu": "RTX 4090", "environment": "Kaggle Notebooks"}[kind]
    assert "Cannot read" in reveal_text(guess, kind, actual)


def test_an_unknown_kind_is_a_clear_error():
    with pytest.raises(LessonkitError, match="kind must be one of"):
        read_guess("x", "colour")


def test_reveal_compares_memory_in_percent_and_names_exactly(capsys):
    text = reveal("100 GiB", "memory", 132.3 * GiB)
    assert "100.0 GiB" in text and "132.3 GiB" in text and "24% below (too low)" in text
    assert "(close)" in reveal_text("130 GiB", "memory", 132.3 * GiB)
    assert "too high" in reveal_text("200", "memory", 132.3 * GiB)
    assert reveal_text("rtx 4090", "gpu", "RTX 4090").endswith("right.")
    assert reveal_text("A10", "gpu", {"A10", "A10G"}).endswith("right.")
    assert "not this time" in reveal_text("T4", "gpu", "RTX 4090")
    assert reveal_text("kaggle", "environment", "Kaggle Notebooks").endswith("right.")
    assert capsys.readouterr().out.strip() == text
    assert "No guess yet" in reveal_text("", "text", None)
    assert reveal_text("PCIe is slow", "text", None).startswith('You wrote: "PCIe is slow"')


def test_each_key_number_has_a_guess_before_it_in_the_notebooks():
    """Notebooks 1, 2, 3 and 6: a predict() cell before the number, a reveal() after it, and
    each reflection's guess before the data that answers it."""
    wanted = {
        "01_vram_equation.ipynb": 1,
        "02_gpu_selection_matrix.ipynb": 1,
        "03_choosing_your_environment.ipynb": 1,
        "06_summary_and_reflection.ipynb": 2,
    }
    for name, count in wanted.items():
        cells = nbformat.read(NOTEBOOKS / name, 4).cells
        sources = [c.source for c in cells if c.cell_type == "code"]
        predicts = [i for i, s in enumerate(sources) if "predict(" in s]
        reveals = [i for i, s in enumerate(sources) if "reveal(" in s]
        assert len(predicts) >= count and len(reveals) >= count, name
        for p, r in zip(predicts, reveals):
            assert p < r, name
