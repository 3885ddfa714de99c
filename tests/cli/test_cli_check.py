"""`lessonkit check` and `lessonkit recommend`: output, JSON and the documented exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import lessonkit.health.check as health
from lessonkit.cli.main import main
from lessonkit.health.report import Device, HealthReport
from lessonkit.units import GiB


def _report(usable: bool) -> HealthReport:
    report = HealthReport(status="ok" if usable else "no_gpu", backend="cuda")
    if usable:
        report.devices.append(
            Device(
                0,
                "NVIDIA A100-SXM4-80GB",
                "cuda",
                int(79.15 * GiB),
                int(78 * GiB),
                (8, 0),
                "sm_80",
                True,
                True,
                108,
                True,
                "passed",
                catalog_name="A100 80GB",
            )
        )
    report.verdict = ["a verdict line"]
    return report


@pytest.fixture
def fake_check(monkeypatch):
    def use(usable: bool) -> None:
        monkeypatch.setattr(health, "check_gpu_health", lambda model="7B": _report(usable))

    return use


@pytest.mark.parametrize(
    ("usable", "args", "code"),
    [
        (True, [], 0),
        (True, ["--require-gpu"], 0),
        (False, [], 0),
        (False, ["--require-gpu"], 1),
    ],
)
def test_check_exit_codes(fake_check, capsys, usable, args, code):
    fake_check(usable)
    assert main(["check", *args]) == code
    assert "GPU health check" in capsys.readouterr().out


def test_check_json(fake_check, capsys):
    fake_check(True)
    assert main(["check", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "ok" and data["devices"][0]["compute_capability"] == [8, 0]


def test_check_on_this_machine_says_what_to_do_next(capsys):
    code = main(["check", "--model", "llama-3.1-8b"])
    out = capsys.readouterr().out
    assert code == 0 and "GPU health check" in out and "llama-3.1-8b" in out
    if "NO_GPU" in out:
        assert "Free Google Colab" in out and "To rent" in out


def test_check_bad_model_is_exit_2(capsys):
    assert main(["check", "--model", "lama-2-7b"]) == 2
    assert "Did you mean" in capsys.readouterr().err


def test_check_help_documents_the_exit_codes():
    out = subprocess.run(
        [sys.executable, "-m", "lessonkit", "check", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "exit codes" in out and "--require-gpu" in out and "1  --require-gpu" in out


def test_recommend_text_and_json(capsys):
    assert main(["recommend", "--model", "7B", "--budget", "low", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Recommendation for 7B") and "\n3. " in out and "\n4. " not in out
    assert (
        main(["recommend", "--model", "70B", "--method", "lora", "--tokens", "20M", "--json"]) == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["tokens"] == 20e6 and all(o["method"] == "lora" for o in data["options"])
    assert all(o["cost_usd"] > 0 for o in data["options"])


def test_recommend_says_which_offer_is_left_out_and_why(capsys):
    from lessonkit.hardware.environments import list_environments

    assert main(["recommend", "--model", "7B"]) == 0
    left_out = next(
        line for line in capsys.readouterr().out.splitlines() if line.startswith("Left out:")
    )
    assert "broken" not in left_out
    for env in list_environments():
        for offer in env.offers:
            if offer.broken:
                assert f"not usable ({offer.gpu.name} on {env.name}: {offer.note})" in left_out


def test_recommend_nothing_fits_is_exit_1(capsys):
    # 2T parameters at 32k tokens per sequence: no setup of up to 1024 GPUs holds it.
    assert main(["recommend", "--model", "2T", "--method", "full", "--seq-len", "32768"]) == 1
    out = capsys.readouterr().out
    assert "Nothing in the catalog fits" in out and "fits no GPU setup" in out
    assert "batch 1 x 32768" in out


def test_recommend_batch_size_and_seq_len_reach_the_recommender(capsys):
    assert (
        main(
            [
                "recommend",
                "--model",
                "7B",
                "--method",
                "lora",
                "--batch-size",
                "1",
                "--seq-len",
                "256",
                "--json",
            ]
        )
        == 0
    )
    options = json.loads(capsys.readouterr().out)["options"]
    assert options and all(
        o["settings"]["batch_size"] == 1 and o["settings"]["seq_len"] == 256 for o in options
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--budget", "-5"], "budget"),
        (["--tokens", "0"], "tokens"),
        (["--tokens", "many"], "tokens"),
        (["--platform", "runpdo"], "Did you mean 'runpod'"),
        (["--method", "qlroa"], "qlora"),
        (["--model", "seven"], "model"),
        (["--batch-size", "0"], "batch_size"),
        (["--seq-len", "-1"], "seq_len"),
    ],
)
def test_recommend_bad_input_is_exit_2(capsys, args, message):
    assert main(["recommend", *args]) == 2
    assert message in capsys.readouterr().err


def test_recommend_non_numeric_mfu_is_exit_2(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["recommend", "--mfu", "abc"])
    assert caught.value.code == 2 and "invalid float" in capsys.readouterr().err
