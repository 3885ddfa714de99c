"""ZeRO-3 as FSDP1 (fsdp_version=1): the settings it takes, the layout of its flat parameters,
and what sets it apart from FSDP2 in a measured step (the accuracy rows are FSDP1_ROWS in
tests/memory/test_accuracy.py)."""

from __future__ import annotations

import math

import pytest

import lessonkit
from lessonkit.errors import LessonkitError
from lessonkit.memory.fsdp1 import flatten, unit_tensors
from lessonkit.memory.settings import validate_run
from lessonkit.models.spec import ModelSpec

WIDE = ModelSpec(
    name="wide-llama-4L",
    family="llama",
    n_layers=4,
    hidden_size=512,
    n_heads=8,
    n_kv_heads=8,
    intermediate_size=1408,
    vocab_size=1000,
)
FSDP1 = dict(n_gpus=2, zero_stage=3, fsdp_version=1)
LORA = dict(method="lora", precision="bf16", lora_dtype="bf16")


@pytest.mark.parametrize("version", [0, 3, "1", True, 1.5])
def test_unknown_versions_are_refused_naming_the_allowed_ones(version) -> None:
    with pytest.raises(LessonkitError, match="fsdp_version must be one of 1, 2"):
        lessonkit.estimate(WIDE, n_gpus=2, zero_stage=3, fsdp_version=version)


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_fsdp1_needs_zero3(stage) -> None:
    with pytest.raises(LessonkitError, match="applies to ZeRO-3 only.*zero_stage=3"):
        lessonkit.estimate(WIDE, n_gpus=2, zero_stage=stage, fsdp_version=1)
    lessonkit.estimate(WIDE, n_gpus=2, zero_stage=stage, fsdp_version=2)  # the default is fine


def test_fsdp1_refuses_a_unit_of_two_dtypes() -> None:
    """A bf16 base with peft's fp32 adapters cannot be flattened into one FlatParameter."""
    with pytest.raises(LessonkitError, match="uniform dtype.*lora_dtype='bf16'"):
        lessonkit.estimate(WIDE, method="lora", precision="bf16", **FSDP1)
    with pytest.raises(LessonkitError, match="lora_dtype='fp32'"):
        lessonkit.estimate(WIDE, method="lora", precision="bf16-mixed", lora_dtype="bf16", **FSDP1)
    lessonkit.estimate(WIDE, method="lora", precision="bf16-mixed", **FSDP1)
    with pytest.raises(LessonkitError, match="offload_optimizer"):
        lessonkit.estimate(WIDE, offload_optimizer=True, **FSDP1)


def test_fsdp1_is_modelled_for_dense_named_families_only() -> None:
    moe = ModelSpec.from_hf_config(
        {
            "model_type": "mixtral",
            "hidden_size": 256,
            "intermediate_size": 704,
            "num_hidden_layers": 2,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "vocab_size": 4096,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
        },
        name="tiny-mixtral",
    )
    with pytest.raises(LessonkitError, match="mixture of experts.*fsdp_version=2"):
        lessonkit.estimate(moe, **FSDP1)


def test_flat_layout_pads_to_the_gpu_count_and_aligns_each_tensor() -> None:
    # 3 + 5 elements of 2 bytes: the second starts at 8 (16-byte alignment), 13 padded to 15
    unit = flatten([((3,), True), ((5,), False)], n=3, gathered_bytes=2)
    assert (unit.numel, unit.tensors, unit.trained) == (15, 8, True)
    assert unit.pieces == [(3, (3,))]  # rank 0 holds elements 0-4: all of the first tensor
    # a trained tensor that straddles rank 0's end keeps only its part there, flat
    unit = flatten([((4, 4), False), ((4, 4), True)], n=2, gathered_bytes=4)
    assert unit.pieces == [(0, (0,))]
    unit = flatten([((4, 2), True), ((4, 4), True)], n=2, gathered_bytes=4)
    assert unit.pieces == [(8, (4, 2)), (4, (4,))]


def test_lora_tensors_follow_their_base_layer_in_module_order() -> None:
    s = validate_run(
        WIDE,
        **dict(
            method="lora",
            precision="bf16",
            optimizer="adamw",
            batch_size=1,
            seq_len=64,
            gradient_checkpointing=False,
            lora_rank=8,
            lora_targets=("q_proj", "v_proj"),
            n_gpus=2,
            zero_stage=3,
            attention="sdpa",
            offload_optimizer=False,
            double_quant=True,
            lora_dtype="bf16",
            gradient_accumulation=1,
            device="cpu",
            fsdp_version=1,
        ),
    )
    layer, root = unit_tensors(WIDE, s)
    h, i = 512, 1408
    assert layer == [
        ((h, h), False),
        ((8, h), True),
        ((h, 8), True),
        ((h, h), False),
        ((h, h), False),
        ((8, h), True),
        ((h, 8), True),
        ((h, h), False),
        ((i, h), False),
        ((i, h), False),
        ((h, i), False),
        ((h,), False),
        ((h,), False),
    ]
    assert [trained for _, trained in root] == [False, False, False]


# ----- measured: what FSDP1 does that FSDP2 does not -------------------------------------------


@pytest.fixture(scope="module")
def lora_no_sync() -> dict:
    """A LoRA step with no_sync on 2 GPUs, measured as FSDP1 and as FSDP2, with estimates."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    kw = dict(LORA, batch_size=2, seq_len=128, gradient_accumulation=2, no_sync=True, n_gpus=2)
    out = {}
    for version in (1, 2):
        settings = dict(kw, zero_stage=3, fsdp_version=version, device="cpu")
        out[version] = (lessonkit.measure(WIDE, **settings), lessonkit.estimate(WIDE, **settings))
    return out


def test_fsdp1_no_sync_keeps_every_layers_whole_gradient_unsharded(lora_no_sync) -> None:
    layer = sum(math.prod(t.shape) for t in WIDE.parameter_tensors().layer)
    adapters = 2 * (16 * 512 + 512 * 16)  # q_proj's and v_proj's A and B
    measured = {v: m.settings["measured"]["gradient_bytes"] for v, (m, _) in lora_no_sync.items()}
    assert measured[1] == WIDE.n_layers * 2 * (layer + adapters)  # bf16, frozen weights too
    assert measured[2] == WIDE.n_layers * 2 * adapters  # FSDP2: the adapters' only
    for m, e in lora_no_sync.values():
        assert e.settings["estimated"]["gradient_bytes"] == m.settings["measured"]["gradient_bytes"]


def test_each_version_estimates_its_own_measurement(lora_no_sync) -> None:
    (fsdp1, estimate1), (fsdp2, estimate2) = lora_no_sync[1], lora_no_sync[2]
    assert fsdp1.tensor_bytes > 1.3 * fsdp2.tensor_bytes
    assert abs(estimate1.tensor_bytes / fsdp1.tensor_bytes - 1) <= 0.05
    assert abs(estimate2.tensor_bytes / fsdp2.tensor_bytes - 1) <= 0.05
    assert estimate2.tensor_bytes < 0.8 * fsdp1.tensor_bytes  # FSDP2's figure misses FSDP1's
    assert any("FSDP1 FullyShardedDataParallel" in note for note in fsdp1.assumptions)
    assert any("ZeRO-3 as FSDP1" in note for note in estimate1.assumptions)
    assert any("FSDP1's no_sync()" in note for note in estimate1.assumptions)
    assert not any("FSDP1" in note for note in estimate2.assumptions + fsdp2.assumptions)
