"""The chunked loss with activation offloading (memory/chunked_head.py): lm_head's backward
after every chunk's loss, and the weight a frozen head saves for each chunk. The figures are
checked against measure() in tests/memory/test_accuracy.py (CHUNKED_OFFLOAD_ROWS)."""

from __future__ import annotations

import lessonkit
from lessonkit.units import GiB

TORCHTUNE_LORA = dict(
    method="lora",
    precision="bf16",
    gradient_checkpointing=True,
    activation_offload=True,
    loss="chunked",
    seq_len=2048,
)


def offloaded(**kw) -> int:
    return lessonkit.estimate("llama-3.1-8b", **kw).settings["estimated"]["offloaded_bytes"]


def test_a_frozen_head_in_pure_bf16_saves_its_weight_expanded_over_the_batch():
    head = 2 * 128256 * 4096  # lm_head's bf16 weight
    # batch 1: each of the 8 chunks saves the weight once; batch 2: twice per chunk, so
    # everything offloaded doubles with the batch, the weight's copies too
    one, two = offloaded(batch_size=1, **TORCHTUNE_LORA), offloaded(batch_size=2, **TORCHTUNE_LORA)
    assert one > 8 * head
    assert abs(two - 2 * one) < 0.01 * head
    # under autocast the head's input is a contiguous cast: the weight once per chunk
    mixed = dict(TORCHTUNE_LORA, precision="bf16-mixed")
    one, two = offloaded(batch_size=1, **mixed), offloaded(batch_size=2, **mixed)
    assert abs(two - 2 * one + 8 * head) < 0.01 * head


def test_the_note_says_so_and_the_pair_is_no_longer_refused():
    report = lessonkit.estimate("llama-3.1-8b", batch_size=2, **TORCHTUNE_LORA)
    assert any("expanded over the batch" in note for note in report.assumptions)
    assert report.timeline.peak_bytes == report.tensor_bytes
    labels = report.timeline.labels
    assert "backward, lm_head's first chunk" in labels
    assert "backward, the loss's last chunk" in labels
    qlora = lessonkit.estimate("llama-3.1-8b", **dict(TORCHTUNE_LORA, method="qlora"))
    assert qlora.total_bytes < report.total_bytes < 40 * GiB
