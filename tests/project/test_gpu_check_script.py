"""scripts/gpu_check.py on the CPU: its dry run's tables, the constants it derives, its notebooks step."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from script_loader import load_gpu_check

ROOT = Path(__file__).resolve().parents[2]


gpu_check = load_gpu_check()


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The script's main() with --cpu: exit status, output, and both results files."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("gpu")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = gpu_check.main(["--cpu", "--no-notebooks", str(out)])
    assert status == 0, stdout.getvalue()
    return {
        "stdout": stdout.getvalue(),
        "json": json.loads((out / "results.json").read_text()),
        "md": (out / "results.md").read_text(),
    }


def test_script_runs_from_a_checkout_as_a_command() -> None:
    # -S: no site-packages, so lessonkit is found in the checkout, as on a GPU box without it.
    proc = subprocess.run(
        [sys.executable, "-S", str(ROOT / "scripts" / "gpu_check.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT / "scripts",
    )
    assert proc.returncode == 0, proc.stderr
    assert "--write-constants" in proc.stdout and "--cpu" in proc.stdout


def test_gpu_configurations_cover_the_validation_plan() -> None:
    from lessonkit.models.presets import resolve_model

    configs = gpu_check.GPU_CONFIGS
    assert len({c.name for c in configs}) == len(configs)
    plain = [c for c in configs if c.method != "qlora"]
    assert len(plain) >= 6
    for c in configs:
        assert 0.4e9 <= resolve_model(c.model).n_params <= 1.8e9, c.model
    assert {c.method for c in plain} == {"full", "lora"}
    assert {"bf16", "bf16-mixed"} <= {c.precision for c in plain}
    assert {True, False} == {c.gradient_checkpointing for c in plain}
    assert max(c.seq_len for c in plain) >= 4096
    qlora = [c for c in configs if c.method == "qlora"]
    assert qlora and all("bitsandbytes" in c.needs for c in qlora)


def test_dry_run_writes_both_tables_with_the_agreed_columns(dry_run: dict) -> None:
    results = dry_run["json"]
    configs = gpu_check.cpu_configs()
    assert results["columns"] == list(gpu_check.COLUMNS)
    assert [row["config"] for row in results["table"]] == [c.name for c in configs]
    assert all(list(row) == list(gpu_check.COLUMNS) for row in results["table"])
    lines = dry_run["md"].splitlines()
    header = "| " + " | ".join(gpu_check.COLUMNS) + " |"
    start = lines.index(header)
    body = lines[start + 2 : start + 2 + len(configs)]
    assert [line.split(" | ")[0].strip("| ") for line in body] == [c.name for c in configs]
    assert all(line.count(" | ") == len(gpu_check.COLUMNS) - 1 for line in body)
    assert results["passed"] is True and "passed" in dry_run["stdout"]


def test_dry_run_records_the_machine(dry_run: dict) -> None:
    import torch
    import transformers

    env = dry_run["json"]["environment"]
    assert env["device"] == "cpu" and "dry run" in env["gpu"]
    assert env["torch"] == torch.__version__ and env["transformers"] == transformers.__version__
    assert env["date"] == dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    assert f"| torch | {torch.__version__} |" in dry_run["md"]
    assert dry_run["json"]["derived_constants"] is None, "a CPU run measures no CUDA constants"


def test_dry_run_numbers_are_lessonkit_s_estimate_and_measurement(dry_run: dict) -> None:
    import lessonkit

    rows = {row["config"]: row for row in dry_run["json"]["configurations"]}
    table = {row["config"]: row for row in dry_run["json"]["table"]}
    for config in gpu_check.cpu_configs():
        row, cells = rows[config.name], table[config.name]
        model = gpu_check.model_for(config, "cpu")
        estimate = lessonkit.estimate(model, **config.kwargs(), device="cpu")
        assert row["estimate"]["allocated"] == estimate.tensor_bytes
        assert row["estimate"]["driver"] == estimate.total_bytes
        assert row["measured_report"]["breakdown"]["cuda_context"] == 0
        for key in gpu_check.READINGS:
            expected = row["estimate"][key] / row["measured"][key] - 1
            assert row["margins"][key] == pytest.approx(expected)
            assert cells[f"{key} margin"] == round(100 * expected, 1)
        assert cells["estimate total GB"] == pytest.approx(estimate.total_bytes / 1e9, rel=1e-3)
        assert cells["batch x seq"] == f"{config.batch_size} x {config.seq_len}"
        within = all(abs(row["margins"][k]) <= gpu_check.TOLERANCE[k] for k in gpu_check.READINGS)
        assert cells["status"].startswith("ok" if within else "fail")
    # The measurement column is measure()'s own reading: re-measure one configuration here.
    config = gpu_check.cpu_configs()[0]
    measured = lessonkit.measure(
        gpu_check.model_for(config, "cpu"), **config.kwargs(), device="cpu"
    )
    assert rows[config.name]["measured"]["allocated"] == measured.tensor_bytes


def test_readings_and_margins_from_a_report() -> None:
    from lessonkit.memory.report import MemoryReport
    from lessonkit.models.presets import get_preset

    report = MemoryReport(
        model=get_preset("gpt2"),
        settings={},
        peak_phase="backward",
        breakdown={
            "weights": 600,
            "activations": 400,
            "cuda_context": 500,
            "allocator_margin": 100,
        },
    )
    assert gpu_check.readings(report) == {
        "allocated": 1000,
        "reserved": 1100,
        "driver": 1600,
        "context": 500,
    }
    assert gpu_check.margin(1100, 1000) == pytest.approx(0.1)
    assert gpu_check.margin(900, 1000) == pytest.approx(-0.1)
    assert gpu_check.margin(5, 0) is None
    assert gpu_check.gb(1_387_720) == 0.001388 and gpu_check.gb(25_374_000_000) == 25.37


def _row(allocated: int, reserved: int, driver: int) -> dict:
    return {"measured": {"allocated": allocated, "reserved": reserved, "driver": driver}}


def test_derived_constants_take_the_largest_context_and_margin() -> None:
    rows = [_row(1000, 1100, 1600), _row(2000, 2500, 2900), {"status": "skipped"}]
    derived = gpu_check.derive_constants(rows)
    assert derived["cuda_context_bytes"] == 500
    assert derived["cuda_context_bytes_range"] == [400, 500]
    assert derived["allocator_margin_ratio"] == 1.25
    assert derived["allocator_margin_ratio_range"] == [1.1, 1.25]
    assert derived["n_configurations"] == 2
    assert gpu_check.derive_constants([{"status": "skipped"}]) is None


def test_written_constants_cite_the_measurement_and_keep_other_fields(tmp_path: Path) -> None:
    path = tmp_path / "cuda_constants.json"
    path.write_text(json.dumps({"about": "kept", "cuda_context_bytes": 1, "source": "old"}))
    env = {
        "gpu": "NVIDIA H200",
        "driver": "580.1",
        "cuda": "13.0",
        "torch": "2.11.0",
        "date": "2026-12-01",
    }
    derived = gpu_check.derive_constants([_row(1000, 1100, 1600), _row(2000, 2500, 2900)])
    gpu_check.write_constants(path, derived, env)
    data = json.loads(path.read_text())
    assert data["about"] == "kept"
    assert data["cuda_context_bytes"] == 500 and data["allocator_margin_ratio"] == 1.25
    assert "NVIDIA H200" in data["source"] and "2026-12-01" in data["source"]
    assert data["as_of"] == "2026-12-01"


def test_write_constants_is_refused_for_a_cpu_run(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        gpu_check.parse_args(["--cpu", "--write-constants"])
    assert exit_.value.code == 2
    assert "needs a GPU measurement" in capsys.readouterr().err


def test_unknown_configuration_is_named(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        gpu_check.parse_args(["--only", "qwen-7b-full"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "qwen-7b-full" in err and gpu_check.GPU_CONFIGS[0].name in err


def test_without_cuda_the_script_says_so_and_exits_2(capsys: pytest.CaptureFixture) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert gpu_check.main(["--no-notebooks"]) == 2
    assert "--cpu" in capsys.readouterr().err


def test_update_docs_replaces_only_the_results_section(tmp_path: Path) -> None:
    doc = tmp_path / "gpu-validation.md"
    original = (ROOT / "docs" / "gpu-validation.md").read_text()
    doc.write_text(original)
    gpu_check.update_docs(doc, "| new | table |\n")
    text = doc.read_text()
    head, _ = original.split(gpu_check.DOCS_START)
    assert text.startswith(head)
    assert f"{gpu_check.DOCS_START}\n| new | table |\n{gpu_check.DOCS_END}" in text
    assert text.endswith(original.split(gpu_check.DOCS_END)[1])


def test_docs_say_plainly_whether_a_gpu_run_is_recorded() -> None:
    text = (ROOT / "docs" / "gpu-validation.md").read_text()
    section = text.split(gpu_check.DOCS_START)[1].split(gpu_check.DOCS_END)[0]
    constants = (
        json.loads(gpu_check.CONSTANTS_FILE.read_text())
        if gpu_check.CONSTANTS_FILE.exists()
        else {}
    )
    measured = "scripts/gpu_check.py" in str(constants.get("source", ""))
    if measured:  # the constants cite a run: its table must be here
        assert "| config |" in section and constants["as_of"] in section
    else:
        assert "No GPU run has been recorded yet" in section and "| config |" not in section


def test_every_notebook_of_the_course_is_run() -> None:
    found = gpu_check.find_notebooks()
    for folder in ("notebooks", "solutions", "exercises"):
        assert [p for p in found if p.parent.name == folder] == sorted(
            (ROOT / folder).glob("*.ipynb")
        )


def test_notebooks_are_skipped_with_the_reason_without_papermill(
    monkeypatch, tmp_path: Path
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "papermill" else real(name, *a),
    )
    rows = gpu_check.run_notebooks([tmp_path / "a.ipynb"], tmp_path, deadline=float("inf"))
    assert rows == [{"notebook": "a.ipynb", "status": "skipped", "reason": rows[0]["reason"]}]
    assert "papermill" in rows[0]["reason"] and "docs/gpu-validation.md" in rows[0]["reason"]


def test_notebooks_run_and_failures_are_reported(tmp_path: Path) -> None:
    pytest.importorskip("papermill")
    pytest.importorskip("ipykernel")
    nbformat = pytest.importorskip("nbformat")
    paths = []
    for name, source in (
        ("good.ipynb", "import lessonkit\nx = 1 + 1"),
        ("bad.ipynb", "raise RuntimeError('broken cell')"),
    ):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
        nb.metadata["kernelspec"] = {
            "name": "python3",
            "display_name": "Python 3",
            "language": "python",
        }
        paths.append(tmp_path / name)
        nbformat.write(nb, paths[-1])
    rows = gpu_check.run_notebooks(paths, tmp_path / "out", deadline=float("inf"))
    assert [(r["notebook"], r["status"]) for r in rows] == [
        ("good.ipynb", "ok"),
        ("bad.ipynb", "fail"),
    ]
    assert "broken cell" in rows[1]["reason"]
    assert (tmp_path / "out" / "notebooks" / tmp_path.name / "good.ipynb").exists()
    late = gpu_check.run_notebooks(paths[:1], tmp_path / "out", deadline=0.0)
    assert late[0]["status"] == "skipped" and "time budget" in late[0]["reason"]


def test_readings_of_a_cuda_measurement_are_torch_s_counters() -> None:
    from lessonkit.memory.report import MemoryReport
    from lessonkit.models.presets import get_preset

    cuda = {"max_memory_allocated": 1010, "max_memory_reserved": 1200}
    report = MemoryReport(
        model=get_preset("gpt2"),
        settings={"measured": {"cuda": cuda}},
        peak_phase="backward",
        breakdown={"weights": 1000, "cuda_context": 300, "allocator_margin": 200},
    )
    assert gpu_check.readings(report) == {
        "allocated": 1010,
        "reserved": 1200,
        "driver": 1500,
        "context": 300,
        "tracked": 1000,
    }


def test_cuda_branch_with_a_simulated_gpu(monkeypatch, tmp_path: Path) -> None:
    """Every line of the CUDA branch runs here, against a stand-in for torch.cuda and measure."""
    from types import SimpleNamespace

    torch = pytest.importorskip("torch")
    import lessonkit

    props = SimpleNamespace(name="Simulated GPU", total_memory=80 * 2**30, major=9, minor=0)
    counters = {"allocated": 0, "reserved": 0}
    for name, value in {
        "is_available": lambda: True,
        "get_device_properties": lambda i=0: props,
        "empty_cache": lambda: None,
        "reset_peak_memory_stats": lambda: None,
        "synchronize": lambda: None,
        "mem_get_info": lambda: (
            props.total_memory - counters["reserved"] - 2**29,
            props.total_memory,
        ),
        "max_memory_allocated": lambda: counters["allocated"],
        "max_memory_reserved": lambda: counters["reserved"],
        "memory_reserved": lambda: counters["reserved"],
    }.items():
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(gpu_check, "_nvml", lambda: None)

    def fake_measure(model, device, **kwargs):
        report = lessonkit.estimate(model, device="cpu", **kwargs)  # tensors as the "step"
        tensors = report.tensor_bytes
        counters.update(allocated=int(tensors * 1.02), reserved=int(tensors * 1.10))
        report.breakdown["allocator_margin"] = counters["reserved"] - tensors
        report.breakdown["cuda_context"] = 2**29
        report.settings["measured"] = {
            "cuda": {
                "max_memory_allocated": counters["allocated"],
                "max_memory_reserved": counters["reserved"],
            }
        }
        return report

    device = SimpleNamespace(
        name="Simulated GPU",
        total_memory_bytes=props.total_memory,
        compute_capability=(9, 0),
        native_bf16=True,
        smoke_test="passed",
    )
    monkeypatch.setattr(lessonkit, "measure", fake_measure)
    monkeypatch.setattr(
        lessonkit,
        "check_gpu_health",
        lambda *a, **k: SimpleNamespace(gpus=[device], driver_version="999.1"),
    )
    constants, doc = tmp_path / "cuda_constants.json", tmp_path / "gpu-validation.md"
    constants.write_text(gpu_check.CONSTANTS_FILE.read_text())
    doc.write_text((ROOT / "docs" / "gpu-validation.md").read_text())
    out = tmp_path / "out"
    only = [c.name for c in gpu_check.GPU_CONFIGS if not c.needs][:2]
    args = [
        str(out),
        "--no-notebooks",
        "--write-constants",
        "--constants",
        str(constants),
        "--update-docs",
        str(doc),
    ] + [a for name in only for a in ("--only", name)]
    status = gpu_check.main(args)

    results = json.loads((out / "results.json").read_text())
    assert [h["check"] for h in results["health"] if not h["ok"]] == []
    assert [r["config"] for r in results["configurations"]] == only
    for row in results["configurations"]:
        assert row["measured"]["reserved"] / row["measured"]["allocated"] == pytest.approx(
            1.10 / 1.02, rel=1e-6
        )
        assert row["measured"]["context"] == 2**29
        assert row["outer"]["outside_allocator_after"] == 2**29
    derived = results["derived_constants"]
    assert derived["cuda_context_bytes"] == 2**29
    assert derived["allocator_margin_ratio"] == pytest.approx(1.10 / 1.02, abs=1e-4)
    written = json.loads(constants.read_text())
    assert written["cuda_context_bytes"] == 2**29 and "Simulated GPU" in written["source"]
    assert "| config |" in doc.read_text() and "Simulated GPU" in doc.read_text()
    assert results["environment"]["gpu"] == "Simulated GPU"
    # Simulated counters 2% and 10% above the tensor peak are within the tolerances.
    assert results["passed"] is True and status == 0
    assert all(
        abs(m) <= gpu_check.TOLERANCE[k]
        for r in results["configurations"]
        for k, m in r["margins"].items()
    )
