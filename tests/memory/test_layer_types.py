"""Each decoder layer's own attention type (config.layer_types) against measured steps.

Under SDPA on CPU a Gemma 3 sliding-window layer keeps its mask (beyond the window), expanded
to every head, for backward, and a full-attention layer keeps none (the kernel masks causally
by itself); each type of layer has rotary tables of its own. Under eager attention (and
gpt-oss, which trains with eager attention only) the mask is added to the scores and not kept:
both types save the same.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import lessonkit
from lessonkit.memory import layers
from tests.memory.test_accuracy import _family_spec

SLIDING, FULL = "sliding_attention", "full_attention"
PATTERNS = {"sliding-sliding": [SLIDING, SLIDING], "full-full": [FULL, FULL]}
PATTERNS["sliding-full"] = [SLIDING, FULL]
PATTERNS["full-sliding"] = [FULL, SLIDING]
STEP = dict(batch_size=4, seq_len=256, precision="bf16")


def _gemma3(layer_types: list[str]) -> lessonkit.ModelSpec:
    return _family_spec(
        "gemma3_text",
        head_dim=64,
        sliding_window=64,
        query_pre_attn_scalar=64,
        layer_types=layer_types,
    )


def _peaks(spec: lessonkit.ModelSpec, **settings: object) -> tuple[dict, dict]:
    kw = dict(STEP, **settings)
    measured = lessonkit.measure(spec, device="cpu", **kw)
    estimated = lessonkit.estimate(spec, device="cpu", **kw)
    return measured.phase_peaks, estimated.phase_peaks


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_gemma3_layers_of_each_type_save_what_they_measure(attention: str) -> None:
    """The estimate moves with each layer's type exactly as the measured step does, in the
    forward pass and in the backward pass (where the peak is)."""
    peaks = {name: _peaks(_gemma3(types), attention=attention) for name, types in PATTERNS.items()}
    base_measured, base_estimated = peaks["sliding-sliding"]
    for name, (measured, estimated) in peaks.items():
        for phase in ("forward", "backward"):
            measured_change = measured[phase] - base_measured[phase]
            estimated_change = estimated[phase] - base_estimated[phase]
            assert estimated_change == measured_change, (name, phase)
    sliding, full = peaks["sliding-sliding"][0], peaks["full-full"][0]
    if attention == "sdpa":  # each sliding layer's mask: batch x heads x seq x seq bools
        assert sliding["forward"] - full["forward"] == 2 * 4 * 8 * 256 * 256
    else:
        assert sliding == full


def test_gemma3_default_pattern_counts_the_mask_in_its_sliding_layers_only() -> None:
    """Six layers, transformers' own pattern (five sliding, the sixth full): within 1% of the
    measured peak, and one mask fewer than six sliding layers would keep."""
    default = _family_spec(
        "gemma3_text", head_dim=64, sliding_window=64, query_pre_attn_scalar=64, num_hidden_layers=6
    )
    assert default.layer_types == (SLIDING,) * 5 + (FULL,)
    measured, estimated = _peaks(default)
    assert abs(estimated["backward"] / measured["backward"] - 1) < 0.01
    all_sliding = _family_spec(
        "gemma3_text",
        head_dim=64,
        sliding_window=64,
        query_pre_attn_scalar=64,
        num_hidden_layers=6,
        layer_types=[SLIDING] * 6,
    )
    report = lessonkit.estimate(all_sliding, device="cpu", **STEP)
    # one mask more, one pair of rotary tables (bf16 cos and sin) and of inv_freq buffers fewer
    mask, tables, buffers = 4 * 8 * 256 * 256, 2 * 2 * 256 * 64, 2 * 4 * 32
    assert report.phase_peaks["forward"] - estimated["forward"] == mask - tables - buffers


def test_gpt_oss_sliding_and_full_layers_save_the_same() -> None:
    def spec(types: list[str]) -> lessonkit.ModelSpec:
        return _family_spec(
            "gpt_oss",
            num_local_experts=4,
            num_experts_per_tok=2,
            intermediate_size=64,
            head_dim=32,
            sliding_window=64,
            layer_types=types,
        )

    sliding, full = _peaks(spec([SLIDING, SLIDING])), _peaks(spec([FULL, FULL]))
    assert sliding[0] == full[0] and sliding[1] == full[1]


def test_the_backward_looks_inside_each_run_of_layers() -> None:
    """With layers of several kinds the backward's moments are taken at both ends of each run
    of alike layers (k: layers done when the backward is inside that layer)."""
    from lessonkit.memory.activations import StepContext

    types = [SLIDING] * 5 + [FULL] + [SLIDING] * 4
    spec = _family_spec(
        "gemma3_text",
        head_dim=64,
        sliding_window=64,
        query_pre_attn_scalar=64,
        num_hidden_layers=10,
        layer_types=types,
    )
    ctx = StepContext(4, 256, 2, 2, False, True, frozenset(), 2, 8, False, "sdpa", 0.0, True)
    rest, last, first = layers.saved_by_layer(spec, ctx, True)
    assert last is rest[-1] and len(rest) == 9
    assert rest[4].activations < rest[3].activations  # layer 5, full: no mask
    ends = layers.layers_saved_ends([first, *rest])
    # the first layer; layers 1 and 4 (a run of sliding ones), 5 (full), 6 and 9
    assert ends == sorted(9 - index for index in (0, 1, 4, 5, 6, 9))


def test_gpt_oss_checkpointing_keeps_one_eager_mask_per_type_of_layer() -> None:
    """Checkpointed layers keep their inputs, the attention mask of their type among them:
    one [batch, 1, seq, seq] bf16 mask per type, shared by the layers of that type."""

    def spec(types: list[str]) -> lessonkit.ModelSpec:
        return _family_spec(
            "gpt_oss",
            num_local_experts=4,
            num_experts_per_tok=2,
            intermediate_size=64,
            head_dim=32,
            sliding_window=64,
            layer_types=types,
        )

    one = _peaks(spec([FULL, FULL]), gradient_checkpointing=True)
    two = _peaks(spec([SLIDING, FULL]), gradient_checkpointing=True)
    for phase in ("forward", "backward"):
        assert two[1][phase] - one[1][phase] == two[0][phase] - one[0][phase] == 2 * 4 * 256**2
        assert abs(one[1][phase] / one[0][phase] - 1) < 0.01
