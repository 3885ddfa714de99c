"""`lessonkit vram`: the breakdown, --gpu verdicts with exit codes, --json, and clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lessonkit import estimate
from lessonkit.cli.main import main
from lessonkit.units import GiB

ROOT = Path(__file__).resolve().parents[2]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["vram", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_prints_the_breakdown_the_api_computes(capsys) -> None:
    code, out, err = run(
        capsys,
        "--model",
        "llama-2-7b",
        "--method",
        "qlora",
        "--batch-size",
        "4",
        "--seq-len",
        "1024",
    )
    expected = estimate("llama-2-7b", method="qlora", precision="bf16", batch_size=4, seq_len=1024)
    assert code == 0 and not err
    assert f"{expected.total_bytes / GiB:.2f} GiB" in out and " GB" not in out.replace(
        "GB card", ""
    )
    for label in ("Weights", "Activations", "CUDA context", "Peak per GPU"):
        assert label in out


def test_gpu_verdict_and_exit_code(capsys) -> None:
    code, out, _ = run(
        capsys,
        "--model",
        "llama-2-7b",
        "--method",
        "qlora",
        "--batch-size",
        "1",
        "--seq-len",
        "512",
        "--gradient-checkpointing",
        "--gpu",
        "t4",
    )
    assert code == 0 and "T4" in out and "it fits" in out
    code, out, _ = run(capsys, "--model", "llama-2-7b", "--gpu", "A100 80GB")
    assert code == 1 and "does NOT fit" in out and "short by" in out


def test_json_output(capsys) -> None:
    code, out, _ = run(
        capsys,
        "--model",
        "qwen2.5-7b",
        "--method",
        "lora",
        "--lora-targets",
        "all-linear",
        "--precision",
        "bf16",
        "--optimizer",
        "adamw-8bit",
        "--n-gpus",
        "2",
        "--zero-stage",
        "2",
        "--json",
        "--gpu",
        "l4",
    )
    data = json.loads(out)
    expected = estimate(
        "qwen2.5-7b",
        method="lora",
        lora_targets="all-linear",
        precision="bf16",
        optimizer="adamw-8bit",
        n_gpus=2,
        zero_stage=2,
    )
    assert data["total_bytes"] == expected.total_bytes
    assert data["breakdown"] == expected.breakdown
    assert data["gpu"]["fits"] == (code == 0) == expected.fits(data["gpu"]["usable_bytes"])


def test_every_option_reaches_the_estimate(capsys) -> None:
    args = [
        "--model",
        "gpt2",
        "--precision",
        "fp32",
        "--optimizer",
        "lion",
        "--batch-size",
        "3",
        "--seq-len",
        "256",
        "--attention",
        "eager",
        "--gradient-accumulation",
        "2",
        "--n-gpus",
        "2",
        "--zero-stage",
        "3",
        "--offload-optimizer",
        "--device",
        "cpu",
        "--json",
    ]
    code, out, _ = run(capsys, *args)
    data = json.loads(out)
    expected = estimate(
        "gpt2",
        precision="fp32",
        optimizer="lion",
        batch_size=3,
        seq_len=256,
        attention="eager",
        gradient_accumulation=2,
        n_gpus=2,
        zero_stage=3,
        offload_optimizer=True,
        device="cpu",
    )
    assert code == 0 and data["total_bytes"] == expected.total_bytes
    code, out, _ = run(
        capsys,
        "--model",
        "7B",
        "--method",
        "qlora",
        "--no-double-quant",
        "--lora-rank",
        "64",
        "--lora-dtype",
        "bf16",
        "--lora-targets",
        "q_proj, k_proj,v_proj",
        "--json",
    )
    data = json.loads(out)
    expected = estimate(
        "7B",
        method="qlora",
        precision="bf16",
        double_quant=False,
        lora_rank=64,
        lora_dtype="bf16",
        lora_targets=("q_proj", "k_proj", "v_proj"),
    )
    assert data["total_bytes"] == expected.total_bytes


def test_lora_dropout_and_bitsandbytes_behaviour_reach_the_estimate(capsys) -> None:
    code, out, _ = run(
        capsys,
        "--model",
        "llama-2-7b",
        "--method",
        "qlora",
        "--lora-dropout",
        "0.05",
        "--bitsandbytes",
        "before-0.43.2",
        "--gradient-checkpointing",
        "--batch-size",
        "4",
        "--json",
    )
    data = json.loads(out)
    kw = dict(method="qlora", precision="bf16", gradient_checkpointing=True, batch_size=4)
    expected = estimate("llama-2-7b", lora_dropout=0.05, bitsandbytes="before-0.43.2", **kw)
    assert code == 0 and data["total_bytes"] == expected.total_bytes
    assert data["total_bytes"] > estimate("llama-2-7b", **kw).total_bytes
    assert any("before 0.43.2" in a for a in data["assumptions"])


def test_activation_offload_reaches_the_estimate(capsys) -> None:
    code, out, _ = run(
        capsys,
        "--model",
        "llama-3.1-8b",
        "--method",
        "lora",
        "--gradient-checkpointing",
        "--activation-offload",
        "--batch-size",
        "4",
        "--seq-len",
        "2048",
        "--json",
    )
    data = json.loads(out)
    kw = dict(
        method="lora", precision="bf16", gradient_checkpointing=True, batch_size=4, seq_len=2048
    )
    expected = estimate("llama-3.1-8b", activation_offload=True, **kw)
    assert code == 0 and data["total_bytes"] == expected.total_bytes
    assert data["settings"]["activation_offload"] is True
    assert data["total_bytes"] < estimate("llama-3.1-8b", **kw).total_bytes
    assert any("PCIe" in a and "ms per step" in a for a in data["assumptions"])


def test_a_run_that_fits_only_with_offloading_is_told_so(capsys) -> None:
    """Checkpointing alone is not enough; checkpointing with offloading is: the first fix."""
    kw = dict(method="lora", precision="bf16", batch_size=4, seq_len=2048)
    ckpt = estimate("llama-3.1-8b", gradient_checkpointing=True, **kw).total_bytes
    offload = estimate(
        "llama-3.1-8b", gradient_checkpointing=True, activation_offload=True, **kw
    ).total_bytes
    from lessonkit.planning.fitting import fit_changes

    settings = dict(
        kw,
        gradient_checkpointing=False,
        optimizer="adamw",
        lora_rank=16,
        lora_targets=None,
        n_gpus=1,
        zero_stage=0,
        gradient_accumulation=1,
    )
    found = fit_changes("llama-3.1-8b", settings, (ckpt + offload) / 2, limit=1)
    assert found and found[0][0] == {"gradient_checkpointing": True, "activation_offload": True}
    assert found[0][1].total_bytes == offload


def test_optimizer_in_backward_reaches_the_estimate(capsys) -> None:
    code, out, _ = run(
        capsys, "--model", "llama-2-7b", "--precision", "bf16", "--optimizer-in-backward", "--json"
    )
    data = json.loads(out)
    expected = estimate("llama-2-7b", precision="bf16", optimizer_in_backward=True)
    assert code == 0 and data["total_bytes"] == expected.total_bytes
    assert data["settings"]["optimizer_in_backward"] is True
    assert data["settings"]["estimated"]["gradient_bytes"] == 0
    # without it all 13.5 GB of bf16 gradients and the step's temporaries come on top
    assert data["total_bytes"] < estimate("llama-2-7b", precision="bf16").total_bytes - 13e9


def test_chunked_loss_reaches_the_estimate(capsys) -> None:
    code, out, _ = run(
        capsys,
        "--model",
        "llama-3.1-8b",
        "--method",
        "qlora",
        "--batch-size",
        "4",
        "--seq-len",
        "2048",
        "--loss",
        "chunked",
        "--loss-chunks",
        "16",
        "--json",
    )
    data = json.loads(out)
    kw = dict(method="qlora", precision="bf16", batch_size=4, seq_len=2048)
    expected = estimate("llama-3.1-8b", loss="chunked", loss_chunks=16, **kw)
    assert code == 0 and data["total_bytes"] == expected.total_bytes
    assert data["settings"]["loss"] == "chunked" and data["settings"]["loss_chunks"] == 16
    # a 128k vocabulary: the full fp32 copy of the logits (4 GiB here) never exists
    standard = estimate("llama-3.1-8b", **kw)
    assert standard.breakdown["logits"] - data["breakdown"]["logits"] > 4 * GiB
    assert any("CEWithChunkedOutputLoss" in a for a in data["assumptions"])


def test_lora_targets_default_to_the_model_family(capsys) -> None:
    code, out, _ = run(capsys, "--model", "gpt2", "--method", "lora", "--json")
    data = json.loads(out)
    assert code == 0 and data["settings"]["lora_targets"] == ["c_attn"]
    assert data["total_bytes"] == estimate("gpt2", method="lora", precision="bf16").total_bytes
    code, _, err = run(
        capsys, "--model", "gpt2", "--method", "lora", "--lora-targets", "q_proj,v_proj"
    )
    assert code == 2 and "LoRA target for gpt2" in err and "c_attn" in err


def test_precision_defaults_to_the_methods_usual_one(capsys) -> None:
    for method, precision in (("full", "bf16-mixed"), ("lora", "bf16"), ("qlora", "bf16")):
        code, out, _ = run(capsys, "--model", "7B", "--method", method, "--json")
        data = json.loads(out)
        assert data["settings"]["precision"] == precision
        assert data["total_bytes"] == estimate("7B", method=method, precision=precision).total_bytes
    # the course's LoRA of 7B on a 4090: it fits at the default precision
    code, out, _ = run(capsys, "--model", "7B", "--method", "LoRA", "--gpu", "rtx4090")
    lora = estimate("7B", method="lora", precision="bf16")
    assert (
        code == 0 and "it fits" in out and f"needs {lora.total_bytes / GiB:.2f} GiB per GPU" in out
    )
    # an explicit precision is kept; without native bf16 full fine-tuning runs in fp16-mixed
    code, out, _ = run(
        capsys, "--model", "7B", "--method", "lora", "--precision", "bf16-mixed", "--json"
    )
    assert json.loads(out)["settings"]["precision"] == "bf16-mixed"
    code, out, _ = run(capsys, "--model", "1B", "--gpu", "t4", "--json")
    assert json.loads(out)["settings"]["precision"] == "fp16-mixed"


def test_help_says_what_the_precision_default_is(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["vram", "--help"])
    out = " ".join(capsys.readouterr()[0].split())
    assert "bf16-mixed for full" in out and "bf16 for lora and qlora" in out


def test_a_run_that_does_not_fit_gets_changes_that_do(capsys) -> None:
    code, out, _ = run(
        capsys, "--model", "7B", "--method", "lora", "--precision", "bf16-mixed", "--gpu", "rtx4090"
    )
    assert code == 1
    fix = estimate("7B", method="lora", precision="bf16")
    assert f"It fits with --precision bf16: {fix.total_bytes / GiB:.2f} GiB per GPU (" in out
    code, out, _ = run(
        capsys,
        "--model",
        "llama-2-7b",
        "--method",
        "qlora",
        "--batch-size",
        "4",
        "--seq-len",
        "1024",
        "--gpu",
        "t4",
    )
    ckpt = estimate(
        "llama-2-7b",
        method="qlora",
        precision="bf16",
        batch_size=4,
        seq_len=1024,
        gradient_checkpointing=True,
    )
    assert code == 1
    assert f"It fits with --gradient-checkpointing: {ckpt.total_bytes / GiB:.2f} GiB" in out
    lines = [line for line in out.splitlines() if line.startswith("  It fits with")]
    assert 1 <= len(lines) <= 2 and "--gradient-checkpointing --batch-size" not in out
    # each suggestion, run as printed, really fits
    for line in lines:
        flags = line.split("It fits with ")[1].split(":")[0].split()
        code, _, _ = run(
            capsys,
            "--model",
            "llama-2-7b",
            "--method",
            "qlora",
            "--batch-size",
            "4",
            "--seq-len",
            "1024",
            "--gpu",
            "t4",
            *flags,
        )
        assert code == 0, flags
    # full fine-tuning of 7B on one A100 80GB: an 8-bit optimizer makes it fit
    code, out, _ = run(capsys, "--model", "llama-2-7b", "--gpu", "A100 80GB", "--json")
    fixes = json.loads(out)["gpu"]["fixes"]
    assert code == 1 and fixes[0]["flags"] == "--optimizer adamw-8bit"
    assert fixes[0]["total_bytes"] == estimate("llama-2-7b", optimizer="adamw-8bit").total_bytes


def test_nothing_fits_points_to_recommend(capsys) -> None:
    code, out, _ = run(capsys, "--model", "405B", "--method", "qlora", "--gpu", "t4")
    assert code == 1 and "It fits with" not in out and "lessonkit recommend" in out


def test_verdict_comes_before_the_assumptions(capsys) -> None:
    _code, out, _ = run(capsys, "--model", "7B", "--method", "qlora", "--gpu", "t4")
    note = estimate("7B", method="qlora", precision="bf16").assumptions[0]
    assert out.index("it fits") < out.index("\nAssumptions:\n") < out.index(note)
    assert "source" not in out.split("Assumptions:")[0]


BAD = [
    (["--model", "lama-2-7b"], "Did you mean 'llama-2-7b'"),
    (["--model", "7B", "--method", "qlroa"], "Did you mean 'qlora'"),
    (["--model", "7B", "--precision", "bf8"], "Allowed: fp32"),
    (["--model", "7B", "--optimizer", "adamw8bit2"], "Unknown optimizer"),
    (["--model", "7B", "--gpu", "a1000"], "Did you mean 'A100"),
    (["--model", "7B", "--gpu", "rtx 9090"], "Unknown GPU"),
    (["--model", "7B", "--batch-size", "0"], "batch_size must be >= 1"),
    (["--model", "7B", "--batch-size", "-2"], "batch_size must be >= 1"),
    (["--model", "7B", "--batch-size", "1000000000"], "at most 4,096"),
    (["--model", "7B", "--batch-size", "four"], "invalid int value"),
    (["--model", "7B", "--seq-len", "100000000"], "at most 1,048,576"),
    (["--model", "7B", "--seq-len", "1.5"], "invalid int value"),
    (["--model", "7B", "--method", "lora", "--lora-rank", "0"], "lora_rank must be >= 1"),
    (["--model", "7B", "--method", "lora", "--lora-rank", "99999"], "at most"),
    (["--model", "7B", "--method", "lora", "--lora-targets", "q_prj"], "Did you mean 'q_proj'"),
    (["--model", "7B", "--zero-stage", "5"], "zero_stage must be one of"),
    (["--model", "7B", "--n-gpus", "0"], "n_gpus must be >= 1"),
    (["--model", "7B", "--method", "qlora", "--precision", "fp32"], "makes no sense"),
    (["--model", "7B", "--offload-optimizer"], "needs ZeRO"),
    (["--model", "7B", "--device", "tpu"], "Unknown device"),
    (["--model", "7B", "--attention", "flash3"], "Unknown attention"),
    (["--model", "7B", "--method", "lora", "--lora-dropout", "1.5"], "lora_dropout must be"),
    (["--model", "7B", "--method", "qlora", "--bitsandbytes", "0.41"], "bitsandbytes"),
    (["--model", "7B", "--activation-offload"], "gradient_checkpointing=True"),
    (
        ["--model", "7B", "--optimizer-in-backward", "--gradient-accumulation", "4"],
        "needs gradient_accumulation=1",
    ),
    (["--model", "7B", "--optimizer-in-backward", "--n-gpus", "2"], "n_gpus=1"),
    (["--model", "7B", "--loss", "chunky"], "Unknown loss"),
    (["--model", "7B", "--loss-chunks", "4"], "applies to loss='chunked' only"),
    (["--model", "7B", "--loss", "chunked", "--loss-chunks", "0"], "loss_chunks"),
    (
        ["--model", "7B", "--loss", "chunked", "--seq-len", "4", "--loss-chunks", "8"],
        "at most seq_len",
    ),
    (
        [
            "--model",
            "7B",
            "--activation-offload",
            "--gradient-checkpointing",
            "--n-gpus",
            "2",
            "--zero-stage",
            "3",
        ],
        "zero_stage 0, 1 or 2",
    ),
    (["--model", "0.1"], "at least 1M parameters, got 0.1"),
    (["--model", "7GB"], "Or a size in parameters: '7B'"),
    (["--model", "7"], "got 7. A size counts parameters: '7B'"),
    (["--batch-size", "2"], "--model"),
]


@pytest.mark.parametrize(("argv", "message"), BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_input_exits_2_with_a_message(capsys, argv, message) -> None:
    try:
        code = main(["vram", *argv])
    except SystemExit as exit_:  # argparse's own errors (not a number, missing --model)
        code = exit_.code
    out, err = capsys.readouterr()
    assert code == 2
    assert message in err
    assert "Traceback" not in err and not out


def _subprocess(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "lessonkit", "vram", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_python_dash_m_fits_and_does_not_fit() -> None:
    ok = _subprocess("--model", "qwen2.5-0.5b", "--method", "lora", "--gpu", "t4")
    assert ok.returncode == 0, ok.stderr
    assert "it fits" in ok.stdout
    no = _subprocess("--model", "llama-2-70b", "--gpu", "h100 sxm")
    assert no.returncode == 1 and "does NOT fit" in no.stdout


def test_python_dash_m_bad_input() -> None:
    bad = _subprocess("--model", "llama-2-7b", "--seq-len", "100000000")
    assert bad.returncode == 2
    assert "seq_len" in bad.stderr and "Traceback" not in bad.stderr


def test_no_sync_reaches_the_estimate_and_its_fix(capsys) -> None:
    args = (
        "--model",
        "llama-2-7b",
        "--n-gpus",
        "8",
        "--zero-stage",
        "3",
        "--gradient-accumulation",
        "4",
        "--gradient-checkpointing",
    )
    code, out, _ = run(capsys, *args, "--no-sync", "--json")
    data = json.loads(out)
    kw = dict(n_gpus=8, zero_stage=3, gradient_accumulation=4, gradient_checkpointing=True)
    expected = estimate("llama-2-7b", no_sync=True, **kw)
    synced = estimate("llama-2-7b", **kw)
    assert code == 0 and data["total_bytes"] == expected.total_bytes
    assert data["settings"]["no_sync"] is True
    # 6.7B fp32 gradients in full on every GPU instead of an eighth of them each
    grads = data["settings"]["estimated"]["gradient_bytes"]
    assert grads == 8 * synced.settings["estimated"]["gradient_bytes"] > 26e9
    assert any("no_sync" in a and "unsharded" in a for a in data["assumptions"])
    # on a GPU where only the synced run fits, the first fix is to drop --no-sync
    from lessonkit.hardware.gpus import get_gpu

    code, out, _ = run(capsys, *args, "--no-sync", "--gpu", "L4")
    assert synced.total_bytes < get_gpu("L4").usable_bytes < expected.total_bytes
    assert "without --no-sync" in out


def test_no_sync_needs_several_gpus_and_accumulation(capsys) -> None:
    code, _, err = run(capsys, "--model", "llama-2-7b", "--no-sync")
    assert code == 2 and "no_sync" in err and "gradient_accumulation" in err
    code, _, err = run(
        capsys,
        "--model",
        "llama-2-7b",
        "--n-gpus",
        "4",
        "--zero-stage",
        "2",
        "--gradient-accumulation",
        "2",
        "--no-sync",
    )
    assert code == 2 and "ZeRO-2" in err and "Traceback" not in err


def test_a_fix_that_adds_a_flag_and_drops_another_says_both() -> None:
    from lessonkit.planning.fitting import change_flags

    assert change_flags({"no_sync": False, "gradient_checkpointing": True}) == (
        "--gradient-checkpointing, without --no-sync"
    )
    assert change_flags({"no_sync": False}) == "without --no-sync"
    assert change_flags({"batch_size": 2, "gradient_accumulation": 8}) == (
        "--batch-size 2 --gradient-accumulation 8"
    )


def test_chunked_loss_with_activation_offload(capsys) -> None:
    """torchtune's pair: the chunked loss and activation offloading, together."""
    args = ["--model", "llama-3.1-8b", "--method", "lora", "--precision", "bf16"]
    args += ["--batch-size", "4", "--seq-len", "2048", "--gradient-checkpointing", "--json"]
    code, out, _ = run(capsys, *args, "--loss", "chunked", "--activation-offload")
    data = json.loads(out)
    kw = dict(method="lora", precision="bf16", batch_size=4, seq_len=2048)
    kw |= dict(gradient_checkpointing=True)
    expected = estimate("llama-3.1-8b", loss="chunked", activation_offload=True, **kw)
    assert code == 0 and data["total_bytes"] == expected.total_bytes
    # in pure bf16, as torchtune runs it, the pair leaves less on the GPU than either alone
    chunked_only = estimate("llama-3.1-8b", loss="chunked", **kw)
    offload_only = estimate("llama-3.1-8b", activation_offload=True, **kw)
    assert data["total_bytes"] < min(chunked_only.total_bytes, offload_only.total_bytes)


def test_lora_on_the_output_head_reaches_the_estimate(capsys) -> None:
    """LitGPT's lora_head: --lora-targets names lm_head beside the layers' modules."""
    args = ["--model", "llama-2-7b", "--method", "lora", "--json"]
    code, out, _ = run(capsys, *args, "--lora-targets", "q_proj,v_proj,lm_head")
    data = json.loads(out)
    expected = estimate("llama-2-7b", method="lora", lora_targets=("q_proj", "v_proj", "lm_head"))
    assert code == 0 and data["total_bytes"] == expected.total_bytes
    assert data["settings"]["lora_targets"] == ["q_proj", "v_proj", "lm_head"]
    without = estimate("llama-2-7b", method="lora", lora_targets=("q_proj", "v_proj"))
    assert data["total_bytes"] > without.total_bytes


def test_lora_on_the_experts_reaches_the_estimate(capsys) -> None:
    """--lora-targets names a mixture of experts' 3D weights beside the attention's modules;
    a bare weight name is refused with the name to use."""
    args = ["--model", "qwen3-30b-a3b", "--method", "lora", "--json"]
    code, out, _ = run(capsys, *args, "--lora-targets", "q_proj,experts")
    data = json.loads(out)
    expected = estimate("qwen3-30b-a3b", method="lora", lora_targets=("q_proj", "experts"))
    assert code == 0 and data["total_bytes"] == expected.total_bytes
    assert data["settings"]["lora_targets"] == [
        "q_proj",
        "experts.gate_up_proj",
        "experts.down_proj",
    ]
    code, out, err = run(capsys, *args, "--lora-targets", "q_proj,down_proj")
    assert code != 0 and "'experts.down_proj'" in out + err


def test_fsdp_version_reaches_the_estimate(capsys) -> None:
    args = ("--model", "llama-2-7b", "--method", "lora", "--precision", "bf16")
    args += ("--lora-dtype", "bf16", "--n-gpus", "2", "--zero-stage", "3")
    args += ("--gradient-accumulation", "4", "--no-sync")
    kw = dict(
        method="lora",
        precision="bf16",
        lora_dtype="bf16",
        n_gpus=2,
        zero_stage=3,
        gradient_accumulation=4,
        no_sync=True,
    )
    code, out, _ = run(capsys, *args, "--fsdp-version", "1", "--json")
    data = json.loads(out)
    assert code == 0 and data["settings"]["fsdp_version"] == 1
    assert data["total_bytes"] == estimate("llama-2-7b", fsdp_version=1, **kw).total_bytes
    # FSDP1 keeps every layer's whole gradient unsharded under no_sync; FSDP2 the adapters'
    assert data["total_bytes"] > 1.5 * estimate("llama-2-7b", **kw).total_bytes
    assert any("ZeRO-3 as FSDP1" in a for a in data["assumptions"])
    code, out, err = run(capsys, "--model", "llama-2-7b", "--fsdp-version", "1")
    assert code != 0 and "applies to ZeRO-3 only" in out + err


def test_the_report_shows_the_loading_moment(capsys) -> None:
    """Loading the checkpoint before the step: its peak, what stays reserved, and which of
    loading and the step sets max_memory_reserved over the run."""
    code, out, _ = run(capsys, "--model", "llama-2-7b", "--method", "qlora")
    report = estimate("llama-2-7b", method="qlora")
    assert code == 0
    assert f"Loading (before step)     {report.loading.peak_allocated_bytes / 2**30:.2f} GiB" in out
    assert f"{report.loading.reserved_bytes / 2**30:.2f} GiB stays reserved" in out
    assert f"Reserved over the run     {report.run_reserved_bytes / 2**30:.2f} GiB" in out
    code, out, _ = run(capsys, "--model", "llama-2-7b", "--method", "qlora", "--json")
    data = json.loads(out)
    assert data["loading"]["reserved_bytes"] == report.loading.reserved_bytes
    assert data["run_reserved_bytes"] == report.run_reserved_bytes


def test_compile_reaches_the_estimate(capsys) -> None:
    args = ("--model", "llama-2-7b", "--precision", "bf16", "--batch-size", "4")
    args += ("--seq-len", "4096", "--json")  # activations decide the peak
    code, out, _ = run(capsys, *args, "--compile")
    data = json.loads(out)
    shape = dict(precision="bf16", batch_size=4, seq_len=4096)
    expected = estimate("llama-2-7b", compile=True, **shape)
    assert code == 0 and data["total_bytes"] == expected.total_bytes
    assert data["settings"]["compile"] is True
    assert data["total_bytes"] < estimate("llama-2-7b", **shape).total_bytes
    savers = ("--gradient-checkpointing", "--optimizer-in-backward", "--activation-offload")
    code, out, _ = run(capsys, *args, "--compile", *savers)
    saved = estimate(
        "llama-2-7b",
        compile=True,
        gradient_checkpointing=True,
        optimizer_in_backward=True,
        activation_offload=True,
        **shape,
    )
    assert code == 0 and json.loads(out)["total_bytes"] == saved.total_bytes
    assert saved.total_bytes < expected.total_bytes
    code, out, _ = run(capsys, *args, "--compile", "--n-gpus", "2", "--zero-stage", "3")
    sharded = estimate("llama-2-7b", compile=True, n_gpus=2, zero_stage=3, **shape)
    assert code == 0 and json.loads(out)["total_bytes"] == sharded.total_bytes
    code, _, err = run(capsys, *args, "--compile", "--n-gpus", "2", "--zero-stage", "2")
    assert code == 2 and "compile=True" in err and "ZeRO-2" in err
    code, out, _ = run(capsys, *args, "--compile", "--loss", "chunked")
    chunked = estimate("llama-2-7b", compile=True, loss="chunked", **shape)
    assert code == 0 and json.loads(out)["total_bytes"] == chunked.total_bytes
    assert chunked.total_bytes < expected.total_bytes  # no fp32 log-softmax kept
