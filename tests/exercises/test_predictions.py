"""Predict, then reveal: guesses read with units and names, compared with the number shown."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from lessonkit import LessonkitError
from lessonkit.exercises.predictions import predict, read_guess, reveal, reveal_text
from lessonkit.units import GB, GiB

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


@pytest.mark.parametrize(
    ("guess", "expected"),
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
    ("guess", "kind", "words"),
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
    assert "100.0 GiB" in text and "132.3 GiB" in text and "32.3 GiB too low (24% below)" in text
    assert ": close, 2.3 GiB (2%) too low" in reveal_text("130 GiB", "memory", 132.3 * GiB)
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
        for p, r in zip(predicts, reveals, strict=False):
            assert p < r, name


# ----- what the reveal says a guess missed ------------------------------------------------------
def full_7b():
    import lessonkit

    return lessonkit.estimate("7B", precision="bf16-mixed", optimizer="adamw")


def test_a_reveal_with_the_report_says_which_parts_a_low_guess_covers_and_leaves_out():
    report = full_7b()
    parts = report.breakdown
    per_parameter = parts["weights"] + parts["gradients"] + parts["optimizer"]
    in_bytes = reveal_text(per_parameter, "memory", report)  # a byte count, not 1e11 GiB
    text = reveal_text(f"{per_parameter / GiB:.1f} GiB", "memory", report)
    assert in_bytes == text
    gap = (report.total_bytes - per_parameter) / GiB
    assert f"{gap:.1f} GiB too low" in text, text
    assert "about the weights, the gradients and the optimizer states together" in text, text
    assert "leaves out the temporaries" in text and "the allocator margin" in text, text
    only_weights = reveal_text(f"{parts['weights'] / GiB * 0.5:.1f} GiB", "memory", report)
    assert "less than the weights alone" in only_weights, only_weights
    halfway = (parts["weights"] + parts["gradients"] * 1.5) / GiB
    between = reveal_text(f"{halfway:.1f}", "memory", report)
    assert "covers the weights and the gradients" in between, between
    assert "not all of the optimizer states" in between, between


def test_a_reveal_of_a_high_guess_names_the_largest_part_and_a_close_one_says_close():
    report = full_7b()
    high = reveal_text(f"{report.total_bytes * 3 / GiB:.0f} GiB", "memory", report)
    assert "too high" in high and "largest part is the optimizer states" in high, high
    close = reveal_text(f"{report.total_bytes * 1.05 / GiB:.1f} GiB", "memory", report)
    assert "close" in close and "too high" in close and "It is" not in close, close
    far = reveal_text(f"{report.total_bytes * 40 / GiB:.0f} GiB", "memory", report)
    assert "40 times the answer" in far, far


def same_memory_pair():
    """Two catalog GPUs sold with the same memory, the first offering PyTorch more."""
    from lessonkit.hardware.gpus import list_gpus

    gpus = [g for g in list_gpus() if g.current_wheels]
    for big in gpus:
        for small in gpus:
            if big.memory_gb == small.memory_gb and big.usable_bytes > small.usable_bytes:
                return big, small
    raise AssertionError("the catalog has no two cards sold with the same memory")


def test_cards_sold_with_the_same_memory_are_a_tie_when_the_guess_offers_as_much():
    big, small = same_memory_pair()
    tie = reveal_text(big.name, "gpu", {small.name})
    assert ": right, a tie" in tie and f"sold with {big.memory_gb:g} GB" in tie, tie
    assert "not this time" not in tie
    less = reveal_text(small.name, "gpu", {big.name})
    assert "not this time" in less and "offers PyTorch less" in less, less


def test_a_wrong_gpu_says_how_its_memory_compares():
    text = reveal_text("T4", "gpu", {"A100 80GB"})
    assert "not this time" in text and "sold with 16 GB" in text and "80 GB" in text, text


# ----- one output per cell ------------------------------------------------------------------
@pytest.mark.notebooks
def test_predict_and_reveal_cells_show_one_output(tmp_path):
    import nbclient

    cells = [
        'from lessonkit.exercises import predict, reveal\nGUESS = "100 GiB"',
        'predict(GUESS, "memory", "The peak")',
        'reveal(GUESS, "memory", 132 * 2**30)',
        'predict(None, "gpu", "The smallest GPU")',
        'reveal("T4", "gpu", {"T4"})',
        'guess = predict("RAM is slow", "text", "What stops it")\nguess',
        "guess",  # shown again in a later cell: once there too
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    for cell in nb.cells[1:]:
        texts = [o.get("text", "") or str(o.get("data", {})) for o in cell.outputs]
        assert len(cell.outputs) == 1, (cell.source, texts)
        assert cell.outputs[0].output_type == "stream", (cell.source, texts)
        assert "Guess(" not in texts[0] and not texts[0].startswith("'"), texts


def test_the_values_returned_display_as_nothing_where_they_were_printed(capsys, monkeypatch):
    # outside IPython, even when an earlier test left an InteractiveShell instance behind
    monkeypatch.setattr("lessonkit.exercises.guesses._ipython", lambda: None)
    read = predict("100 GiB", "memory", "The peak")
    text = reveal("100 GiB", "memory", 132 * GiB)
    assert isinstance(text, str) and read.ok
    assert capsys.readouterr().out.count("\n") == 2
    read._ipython_display_()  # outside a notebook: shown, as a later cell shows a value again
    assert capsys.readouterr().out.strip() == read.message


# ----- never raises -------------------------------------------------------------------------
class Hostile:
    def __eq__(self, other):
        raise RuntimeError("eq")

    def __repr__(self):
        raise RuntimeError("repr")

    def __str__(self):
        raise RuntimeError("str")

    def __float__(self):
        raise RuntimeError("float")

    __hash__ = None


ISSUE_CASES = [
    (10**400, "memory", 100 * GiB),
    (-(10**400), "memory", 100 * GiB),
    ("x\ud800y", "text", None),
    ("\ud800", "gpu", "T4"),
    ("\udfff GiB", "memory", 100 * GiB),
    (Hostile(), "memory", 100 * GiB),
    (Hostile(), "gpu", "T4"),
    (Hostile(), "environment", "Kaggle Notebooks"),
    (Hostile(), "text", None),
    ("T4", "gpu", [Hostile()]),
    ("T4", "gpu", Hostile()),
    ("kaggle", "environment", [Hostile(), "Kaggle Notebooks"]),
    ("100 GiB", "memory", Hostile()),
    ("100 GiB", "memory", 0),
    ("100 GiB", "memory", -1),
    ("100 GiB", "memory", float("nan")),
    ("100 GiB", "memory", 10**400),
    (float("nan"), "memory", 100 * GiB),
    (float("inf"), "memory", 100 * GiB),
    ("nan GiB", "memory", 100 * GiB),
    ("a" * 10_000_000, "text", None),
    ("a" * 10_000_000, "gpu", "T4"),
    ("1" * 10_000_000, "memory", 100 * GiB),
]


@pytest.mark.parametrize(("guess", "kind", "actual"), ISSUE_CASES, ids=range(len(ISSUE_CASES)))
def test_predict_and_reveal_never_raise(guess, kind, actual, capsys):
    read = predict(guess, kind, "What")
    text = reveal(guess, kind, actual)
    printed = capsys.readouterr().out
    for shown in (read.message, text, printed):
        shown.encode("utf-8")
        assert len(shown) < 1_500, len(shown)
        assert not re.search(r"guessed (nan|inf)|(nan|inf)%", shown), shown


def test_a_nan_guess_is_refused_and_a_zero_answer_compared_without_dividing():
    assert "finite" in read_guess(float("nan"), "memory").message
    assert not read_guess("nan GiB", "memory").ok
    zero = reveal_text("100 GiB", "memory", 0)
    assert "0.0 GiB" in zero and "too high" in zero and "%" not in zero, zero


def test_a_long_guess_is_echoed_shortened():
    text = reveal_text("a" * 10_000_000, "text", None)
    assert "10,000,000 characters, shown shortened" in text and len(text) < 400


def test_a_lone_surrogate_prints_on_a_strict_utf8_stdout():
    code = (
        "from lessonkit.exercises import predict, reveal\n"
        "predict('a\\ud800', 'text', 'x'); reveal('\\ud800b', 'text', None)\n"
        "predict('\\ud800', 'gpu', 'x'); reveal('\\ud800', 'environment', 'Kaggle')\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"},
    )
    assert run.returncode == 0, run.stderr.decode()
    assert b"\\ud800" in run.stdout


def test_an_unknown_kind_is_said_in_the_cell_not_raised(capsys):
    read = predict("x", "colour", "What")
    assert not read.ok and "kind must be one of" in capsys.readouterr().out
    assert "kind must be one of" in reveal("x", "colour", None)
