"""One precision default per method, the same for estimate, measure, the CLI and the OOM doctor,
and stated once in the README: the method's usual precision (bf16-mixed for full fine-tuning,
bf16 for LoRA and QLoRA); on a GPU without native bf16, `lessonkit vram --gpu` takes fp16-mixed
for full fine-tuning and says so."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest

import lessonkit
from lessonkit.cli.main import main
from lessonkit.memory.settings import usual_precision
from lessonkit.planning import fitting

ROOT = Path(__file__).resolve().parents[2]
RUN = dict(batch_size=4, seq_len=1024, gradient_checkpointing=True)
FLAGS = ["--batch-size", "4", "--seq-len", "1024", "--gradient-checkpointing"]


def vram_json(capsys, *argv: str) -> dict:
    assert main(["vram", *argv, "--json"]) in (0, 1)
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_python_and_the_cli_take_the_same_default_precision(method, capsys):
    report = lessonkit.estimate("llama-2-7b", method=method, **RUN)
    assert report.settings["precision"] == usual_precision(method)
    data = vram_json(capsys, "--model", "llama-2-7b", "--method", method, *FLAGS)
    assert data["settings"]["precision"] == usual_precision(method)
    assert data["total_bytes"] == report.total_bytes


def test_the_readme_example_gives_the_figure_it_shows():
    report = lessonkit.estimate("llama-2-7b", method="qlora", **RUN)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"peak per GPU: {report.total_bytes / 2**30:.2f} GiB" in readme


def test_estimate_measure_and_the_rule_agree():
    for function in (lessonkit.estimate, lessonkit.measure):
        assert inspect.signature(function).parameters["precision"].default is None
        assert "usual precision" in inspect.getdoc(function)
    assert fitting.usual_precision is usual_precision
    assert [usual_precision(m) for m in ("full", "lora", "qlora")] == ["bf16-mixed", "bf16", "bf16"]
    assert usual_precision("full", native_bf16=False) == "fp16-mixed"


def test_the_oom_doctor_takes_the_same_default(capsys):
    oom = (
        "CUDA out of memory. Tried to allocate 1002.00 MiB. GPU 0 has a total capacity of 14.74 "
        "GiB of which 382.12 MiB is free. Process 2571 has 14.36 GiB memory in use. Of the "
        "allocated memory 13.97 GiB is allocated by PyTorch, and 262.21 MiB is reserved by "
        "PyTorch but unallocated."
    )
    diagnosis = lessonkit.oom_doctor(oom, model="llama-3.2-3b", method="lora", batch_size=8)
    assert diagnosis.report.settings["precision"] == "bf16"
    flags = ["--model", "llama-3.2-3b", "--method", "lora", "--batch-size", "8", "--json"]
    assert main(["oom", oom, *flags]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["estimated_peak_bytes"] == diagnosis.report.total_bytes


def test_a_gpu_without_native_bf16_takes_fp16_for_full_fine_tuning_and_says_so(capsys):
    assert main(["vram", "--model", "gpt2", "--gpu", "t4"]) == 0
    out = capsys.readouterr().out
    assert "full, fp16-mixed" in out
    assert "Precision fp16-mixed: the T4 has no native bf16" in out
    assert main(["vram", "--model", "gpt2", "--gpu", "a100 80gb"]) == 0
    out = capsys.readouterr().out
    assert "full, bf16-mixed" in out and "no native bf16" not in out


def test_a_precision_given_is_kept_on_any_gpu(capsys):
    assert main(["vram", "--model", "gpt2", "--gpu", "t4", "--precision", "bf16-mixed"]) == 0
    out = capsys.readouterr().out
    assert "full, bf16-mixed" in out and "no native bf16" not in out


def test_lora_on_a_gpu_without_native_bf16_says_how_to_load_the_model(capsys):
    assert main(["vram", "--model", "gpt2", "--method", "lora", "--gpu", "t4"]) == 0
    out = capsys.readouterr().out
    assert "lora, bf16" in out and "the T4 has no native bf16" in out and "float16" in out


def test_the_readme_states_the_default_once():
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert len(re.findall(r"defaults? to the method's usual", readme)) == 1
    assert "pass it for them" not in readme
