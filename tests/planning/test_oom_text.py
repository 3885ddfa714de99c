"""The OOM doctor's text: wrapped between words at a width a notebook shows, never inside a
number nor between a number and its unit; a card the catalog knows gets its one usable figure."""

from __future__ import annotations

import itertools
import re

import pytest

from lessonkit import oom_doctor
from lessonkit.hardware.gpus import card_with_total, get_gpu
from lessonkit.planning.oom import WIDTH, wrap_line
from lessonkit.units import GiB

T4_ERROR = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1002.00 MiB. GPU 0 has a total "
    "capacity of 14.74 GiB of which 382.12 MiB is free. Process 2571 has 14.36 GiB memory in use. "
    "Of the allocated memory 13.97 GiB is allocated by PyTorch, and 262.21 MiB is reserved by "
    "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)
# The same T4 with another process (a second notebook's kernel) holding 2.00 GiB of it.
T4_SHARED = (
    "CUDA out of memory. Tried to allocate 1002.00 MiB. GPU 0 has a total capacity of 14.74 GiB "
    "of which 382.12 MiB is free. Process 2571 has 12.36 GiB memory in use. Process 3001 has "
    "2.00 GiB memory in use. Of the allocated memory 11.97 GiB is allocated by PyTorch, and "
    "262.21 MiB is reserved by PyTorch but unallocated."
)
A100_ERROR = (
    "CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 79.15 GiB of "
    "which 1.27 GiB is free. Process 88 has 77.87 GiB memory in use. Of the allocated memory "
    "75.10 GiB is allocated by PyTorch, and 1.90 GiB is reserved by PyTorch but unallocated."
)
RUN = dict(model="7B", method="lora", precision="bf16", batch_size=8, seq_len=2048)
UNIT = r"(?:GiB|MiB|KiB|GB|MB|bytes|tokens)"


@pytest.mark.parametrize("message", [T4_ERROR, T4_SHARED, A100_ERROR])
@pytest.mark.parametrize("run", [RUN, {}, dict(RUN, n_gpus=2, zero_stage=3)])
def test_lines_are_wrapped_between_words_and_never_inside_a_number_or_before_its_unit(message, run):
    diagnosis = oom_doctor(message, **run)
    shown, whole = str(diagnosis), diagnosis.text(width=None)
    assert " ".join(shown.split()) == " ".join(whole.split())  # only the line breaks differ
    lines = shown.split("\n")
    for line in lines:
        assert len(line) <= WIDTH or " " not in line.strip(), line
    for before, after in itertools.pairwise(lines):
        # a break never leaves "1 / 4.74 GiB", "1,002 / MiB" or "8 x / 2048"
        assert not (re.search(r"\d$", before) and re.match(rf"\s*(?:{UNIT}|x\b|[\d.,])", after))
        assert not (re.search(r"\d x$", before) and re.match(r"\s*\d", after))
    assert max(len(line) for line in whole.split("\n")) > WIDTH  # there was something to wrap


def test_a_wrapped_list_item_continues_under_its_own_text():
    line = "  1. " + " ".join(["word"] * 40) + " -> peak 5.74 GiB (9.01 GiB to spare)"
    wrapped = wrap_line(line, 60)
    assert len(wrapped) > 1 and wrapped[0].startswith("  1. word")
    assert all(
        piece.startswith("     ") and not piece.startswith("      ") for piece in wrapped[1:]
    )
    assert "5.74 GiB" in " ".join(wrapped) and "9.01 GiB" in " ".join(wrapped)
    assert wrap_line("short", 60) == ["short"]


def test_a_t4_is_given_the_catalogs_one_figure_not_the_sum_of_rounded_ones():
    t4 = get_gpu("T4")
    diagnosis = oom_doctor(T4_ERROR, **RUN)
    text = " ".join(str(diagnosis).split())
    # free 382.12 MiB + this process's 14.36 GiB = 14.73 GiB: the message's rounding, not a card
    assert "14.73" not in text
    assert diagnosis.card == t4 and diagnosis.budget_bytes == t4.usable_bytes
    assert f"more than the {t4.usable_text} a T4 offers" in text
    assert diagnosis.fixes and all(f.peak_bytes <= t4.usable_bytes for f in diagnosis.fixes)


def test_memory_another_process_holds_is_taken_off_the_cards_figure():
    t4 = get_gpu("T4")
    diagnosis = oom_doctor(T4_SHARED, **RUN)
    text = " ".join(str(diagnosis).split())
    assert diagnosis.budget_bytes == t4.usable_bytes - round(2.00 * GiB)
    assert f"(a T4's {t4.usable_text} less what other processes held)" in text
    assert "Another process held about 2.00 GiB" in text


def test_the_card_behind_a_total_is_found_by_its_usable_memory():
    assert card_with_total(14.74 * GiB) == get_gpu("T4")
    assert card_with_total(14.75 * GiB) == get_gpu("T4")
    a100 = card_with_total(get_gpu("A100 80GB").usable_bytes)  # the H100 PCIe has 79.2 GiB too
    assert a100 is not None and a100.usable_bytes == get_gpu("H100 PCIe").usable_bytes
    assert card_with_total(12.0 * GiB) is None  # no card offers 12 GiB
    assert card_with_total(0) is None
    # 79.15 GiB is as near the A100's 79.2 as the H100 SXM's 79.1: the message's figures stay
    assert card_with_total(79.15 * GiB) is None
    diagnosis = oom_doctor(A100_ERROR, **RUN)
    assert diagnosis.card is None and diagnosis.budget_bytes < 79.15 * GiB
