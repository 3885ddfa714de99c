"""The chunked loss's head (memory/chunked_head.py): lm_head's backward after every chunk's
loss, with and without activation offloading, which leaves lm_head's saved tensors and the
chunked loss on the device as torchtune's and TRL's recipes do. The figures are checked
against measure() in tests/memory/test_accuracy.py (CHUNKED_OFFLOAD_ROWS, HEAD_OFFLOAD_ROWS)."""

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
VOCAB, HIDDEN, LAYERS = 128256, 4096, 32  # Llama 3.1 8B


def offloaded(**kw) -> int:
    return lessonkit.estimate("llama-3.1-8b", **kw).settings["estimated"]["offloaded_bytes"]


def test_what_goes_to_the_host_is_the_decoders_not_the_heads_or_the_chunked_losss():
    tokens = 2048
    host = offloaded(batch_size=1, **TORCHTUNE_LORA)
    # each layer's checkpointed input and the final norm's fp32 input (saved twice, copied
    # twice), and some bytes per token (the rotary tables, rstd, the ids): nothing the size
    # of lm_head's weight or of the logits
    layers_and_norm = 2 * LAYERS * tokens * HIDDEN + 2 * 4 * tokens * HIDDEN
    assert layers_and_norm <= host < layers_and_norm + 1024 * tokens
    assert host < 2 * VOCAB * HIDDEN
    assert abs(offloaded(batch_size=2, **TORCHTUNE_LORA) - 2 * host) < 1024 * tokens
    # the standard loss runs in the model's forward, inside the offloading region: its two
    # fp32 [tokens, vocab] tensors go to the host too
    standard = offloaded(batch_size=1, **dict(TORCHTUNE_LORA, loss="standard"))
    assert standard - host == 2 * 4 * tokens * VOCAB


def test_offloading_leaves_the_heads_backward_as_it_is():
    """Every chunk's logit gradient waits for lm_head's backward, offloaded or not."""
    for method in ("lora", "full"):
        kw = dict(TORCHTUNE_LORA, method=method, batch_size=2)
        moved = lessonkit.estimate("llama-3.1-8b", **kw).timeline
        kept = lessonkit.estimate("llama-3.1-8b", **dict(kw, activation_offload=False)).timeline
        head = [i for i, label in enumerate(moved.labels) if "lm_head's" in label]
        assert head, moved.labels
        for i in head:
            assert (
                moved.series["logits"][i]
                == kept.series["logits"][kept.labels.index(moved.labels[i])]
            )
        # all the chunks' bf16 logit gradients at once
        assert max(moved.series["logits"][i] for i in head) >= 2 * tokens_of(kw) * VOCAB


def tokens_of(kw: dict) -> int:
    return int(kw["batch_size"]) * int(kw["seq_len"])


def test_the_notes_say_where_everything_is_and_the_peak_is_on_the_timeline():
    report = lessonkit.estimate("llama-3.1-8b", batch_size=2, **TORCHTUNE_LORA)
    notes = " ".join(report.assumptions)
    assert "lm_head's saved tensors and the chunked loss's stay on the GPU" in notes
    assert "all the chunks' logit gradients wait together" in notes
    assert report.timeline.peak_bytes == report.tensor_bytes
    labels = report.timeline.labels
    assert "backward, lm_head's first chunk" in labels
    assert "backward, the loss's last chunk" in labels
    qlora = lessonkit.estimate("llama-3.1-8b", **dict(TORCHTUNE_LORA, method="qlora"))
    assert qlora.total_bytes < report.total_bytes < 40 * GiB
