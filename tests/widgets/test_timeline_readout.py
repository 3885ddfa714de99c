"""The timeline explorer's readout says the moment of the peak in a sentence, not the label
the timeline keeps ('backward, layer 5 of 32'), and gives its figures from the estimate."""

from __future__ import annotations

import re

import pytest

from lessonkit import estimate
from lessonkit.memory.report import PHASE_WORDS
from lessonkit.units import GiB
from lessonkit.widgets.timeline import moment_words, timeline_explorer, timeline_readout

RAW_LABEL = re.compile(r"\((forward|backward|optimizer)[^)]*\)|\b(forward|backward), ")


def every_label() -> set[str]:
    labels: set[str] = set()
    for method, checkpointing in (("lora", False), ("full", True)):
        report = estimate("gpt2", method=method, gradient_checkpointing=checkpointing)
        labels |= set(report.timeline.labels)
    return labels


@pytest.mark.parametrize("label", sorted(every_label()))
def test_each_moment_of_an_estimate_reads_as_words(label: str) -> None:
    words = moment_words(label)
    assert not RAW_LABEL.search(words), words
    assert any(f"the {phase}" in words for phase in PHASE_WORDS.values()), words
    numbers = re.findall(r"\d+", label)  # a layer's number stays
    assert re.findall(r"\d+", words) == numbers


def test_the_labels_read_as_their_phase_says() -> None:
    assert moment_words("backward, layer 5 of 32") == "in the backward pass, at layer 5 of 32"
    assert moment_words("forward, 3 of 32 layers") == "in the forward pass, after 3 of 32 layers"
    assert "start of the backward pass" in moment_words("backward, the loss's gradient")
    assert moment_words("optimizer step") == "during the optimizer step"
    assert moment_words("backward") == "during the backward pass"


@pytest.mark.parametrize(
    "settings",
    [
        dict(method="lora", batch_size=4, seq_len=1024),
        dict(method="lora", batch_size=4, seq_len=1024, gradient_checkpointing=True),
        dict(method="full", precision="bf16-mixed"),
    ],
)
def test_the_readout_names_the_peaks_moment_in_words(settings: dict) -> None:
    report = estimate("7B", **settings)
    readout = timeline_readout(report)
    label = report.timeline.labels[report.timeline.peak_index]
    assert f"{report.timeline.peak_bytes / GiB:,.2f} GiB</b>, {moment_words(label)}" in (
        readout.replace("&#x27;", "'")
    )
    assert not RAW_LABEL.search(readout), readout
    assert f"{report.total_bytes / GiB:,.2f} GiB" in readout


def test_the_explorer_shows_the_readout_of_its_settings() -> None:
    explorer = timeline_explorer("7B", method="lora", batch_size=4, seq_len=1024)
    explorer.controls["gradient_checkpointing"].value = True
    expected = estimate(
        "7B",
        method="lora",
        precision="bf16",
        batch_size=4,
        seq_len=1024,
        gradient_checkpointing=True,
    )
    assert explorer.readout.value == timeline_readout(expected)
