"""bitsandbytes' paged AdamW: its states in CUDA managed memory, and what each figure includes."""

from __future__ import annotations

import pytest

from lessonkit import estimate, get_preset
from lessonkit.cli.main import main
from lessonkit.memory.optimizers import PAGED_MIN_SIZE, paged_state_bytes, state_bytes
from lessonkit.units import GiB

FULL_1B = dict(method="full", precision="bf16", batch_size=1, seq_len=512)


def norm_elements(name: str) -> int:
    spec = get_preset(name)
    return spec.hidden_size * (2 * spec.n_layers + 1)  # two RMSNorms per layer and the final


def test_32bit_states_are_fp32_whatever_the_parameters_dtype() -> None:
    paged = estimate("llama-3.2-1b", optimizer="paged-adamw-32bit", **FULL_1B)
    torch_adamw = estimate("llama-3.2-1b", optimizer="adamw-fused", **FULL_1B)
    n = paged.model.n_params
    assert paged.breakdown["optimizer"] == 8 * n  # fp32 state1 and state2
    # torch's AdamW: bf16 states, plus a 4-byte step counter per tensor
    assert 0 < torch_adamw.breakdown["optimizer"] - 4 * n < 4 * 1000
    assert paged.breakdown["temporaries"] <= torch_adamw.breakdown["temporaries"]


def test_states_of_tensors_of_1e5_elements_or_more_are_managed() -> None:
    r = estimate("llama-3.2-1b", optimizer="paged-adamw-32bit", **FULL_1B)
    # every matrix is paged; the norms' vectors (2048 elements) stay in torch's allocator
    assert r.managed_bytes == 8 * (r.model.n_params - norm_elements("llama-3.2-1b"))
    assert r.allocated_peak_bytes == r.tensor_bytes - r.managed_bytes
    assert r.reserved_bytes == r.allocated_peak_bytes + r.breakdown["allocator_margin"]
    assert r.to_dict()["managed_bytes"] == r.managed_bytes


def test_paging_moves_the_states_out_of_torchs_figures_only() -> None:
    settings = dict(method="qlora", batch_size=2, seq_len=1024, lora_targets="all-linear")
    paged = estimate("llama-3.1-8b", optimizer="paged-adamw-8bit", **settings)
    plain = estimate("llama-3.1-8b", optimizer="adamw-8bit", **settings)
    assert plain.managed_bytes == 0 and paged.managed_bytes > 0
    assert paged.breakdown["optimizer"] == plain.breakdown["optimizer"]
    assert paged.allocated_peak_bytes == plain.allocated_peak_bytes - paged.managed_bytes
    # no allocator margin on memory torch does not allocate: nvidia-smi's figure is lower too
    margin = plain.breakdown["allocator_margin"] - paged.breakdown["allocator_margin"]
    assert margin == pytest.approx(0.05 * paged.managed_bytes, abs=2)
    assert paged.total_bytes == plain.total_bytes - margin


def test_small_adapters_are_not_paged() -> None:
    # rank-16 adapters on q_proj and v_proj of a 4096-wide model: 65,536 elements at most
    r = estimate("llama-3.1-8b", method="qlora", optimizer="paged-adamw-32bit", seq_len=512)
    assert r.breakdown["optimizer"] > 0 and r.managed_bytes == 0
    assert "of paged optimizer states" not in str(r)
    assert r.allocated_peak_bytes == r.tensor_bytes


def test_paged_bytes_follow_bitsandbytes_rules() -> None:
    tensors = [
        (PAGED_MIN_SIZE - 1, (PAGED_MIN_SIZE - 1,), 3),
        (PAGED_MIN_SIZE, (PAGED_MIN_SIZE,), 2),
    ]
    assert paged_state_bytes("paged-adamw-32bit", tensors) == 2 * 8 * PAGED_MIN_SIZE
    assert paged_state_bytes("paged-adamw-8bit", tensors) == 2 * 2 * PAGED_MIN_SIZE
    assert paged_state_bytes("adamw-8bit", tensors) == 0
    assert paged_state_bytes("paged-adamw-32bit", tensors) <= state_bytes(
        "paged-adamw-32bit", tensors, 2, False
    )


def test_the_report_says_what_each_figure_includes() -> None:
    r = estimate("llama-3.2-1b", optimizer="paged-adamw-32bit", **FULL_1B)
    figures = {figure: (value, includes) for figure, value, includes in r.memory_figures()}
    assert figures["torch.cuda.max_memory_allocated"][0] == r.allocated_peak_bytes
    assert figures["nvidia-smi"][0] == r.total_bytes
    assert "not the" in figures["torch.cuda.memory_reserved"][1]
    assert "managed memory" in figures["nvidia-smi"][1]
    text = str(r)
    for figure in figures:
        assert figure in text
    assert f"{r.managed_bytes / GiB:.2f} GiB of paged optimizer states" in text


def test_cli_takes_the_paged_optimizer(capsys) -> None:
    argv = ["vram", "--model", "llama-3.2-1b", "--method", "full", "--precision", "bf16"]
    assert main([*argv, "--optimizer", "paged-adamw-32bit", "--seq-len", "512"]) == 0
    out = capsys.readouterr().out
    expected = estimate("llama-3.2-1b", optimizer="paged-adamw-32bit", **FULL_1B)
    assert f"{expected.allocated_peak_bytes / GiB:.2f} GiB" in out
    assert "nvidia-smi" in out
    assert main([*argv, "--optimizer", "paged-adamw-16bit"]) == 2
    assert "paged-adamw-32bit" in capsys.readouterr().err


@pytest.mark.parametrize("optim", ["paged_adamw_32bit"])
def test_training_arguments_name_maps_to_the_paged_optimizer(tmp_path, optim: str) -> None:
    pytest.importorskip("transformers")
    from transformers import TrainingArguments

    from lessonkit.planning.training_objects import describe_run

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], optim=optim)
    assert describe_run(args, model="llama-3.2-1b").settings["optimizer"] == "paged-adamw-32bit"


def test_measure_finds_the_states_bitsandbytes_would_page() -> None:
    pytest.importorskip("torch")
    from lessonkit.memory.measuring import measure, real_bitsandbytes

    if not real_bitsandbytes():
        pytest.skip("PagedAdamW32bit is measured with bitsandbytes itself")
    from small_models import TINY_LLAMA

    r = measure(
        TINY_LLAMA, precision="bf16", optimizer="paged-adamw-32bit", batch_size=1, seq_len=16
    )
    n = r.settings["measured"]["trainable_parameters"]
    assert r.settings["measured"]["optimizer_bytes"] == 8 * n  # fp32 states of bf16 weights
    # only the embedding and lm_head (1000 x 128 = 128,000 elements) reach 1e5 elements
    assert r.managed_bytes == 2 * 8 * 1000 * 128
    assert r.allocated_peak_bytes == r.tensor_bytes - r.managed_bytes
