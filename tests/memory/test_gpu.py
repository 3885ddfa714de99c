"""On a CUDA GPU: the health check, the calculator against real training steps, every notebook.

The same checks as scripts/gpu_check.py (whose functions these tests call), as pytest tests.
Without a GPU every test here is skipped with the reason (tests/conftest.py).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from script_loader import load_gpu_check

pytestmark = pytest.mark.gpu

gpu_check = load_gpu_check()
NOTEBOOKS = gpu_check.find_notebooks()


def test_health_check_agrees_with_torch_and_nvml() -> None:
    rows = gpu_check.health_rows()
    checked = {row["check"] for row in rows}
    assert {"name", "total memory (bytes)", "compute capability", "native bf16"} <= checked
    if gpu_check._nvml() is not None:
        assert {"name (NVML)", "total memory (NVML, bytes)", "driver version"} <= checked
    wrong = [
        f"{r['check']}: lessonkit {r['lessonkit']!r}, {r['source']} {r['reference']!r}"
        for r in rows
        if not r["ok"]
    ]
    assert not wrong, "; ".join(wrong)


@pytest.mark.parametrize("config", gpu_check.GPU_CONFIGS, ids=lambda c: c.name)
def test_measured_step_matches_the_estimate(config) -> None:
    missing = [m for m in config.needs if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed")
    row = gpu_check.run_config(config, "cuda")
    assert row["status"] != "error", row["reason"]
    measured, outer = row["measured"], row["outer"]
    # measure reports torch's own counters of the measured step.
    assert 0 < measured["allocated"] <= measured["reserved"]
    assert measured["allocated"] <= outer["max_memory_allocated"]
    assert measured["reserved"] <= outer["max_memory_reserved"]
    assert measured["driver"] > measured["reserved"], "the driver-level total includes the context"
    # Its storage tracking sees nearly every byte the allocator hands out (the rest: block
    # rounding and library workspaces).
    gap = measured["allocated"] - measured["tracked"]
    assert -0.01 * measured["allocated"] <= gap <= 0.05 * measured["allocated"] + 256 * 2**20, (
        f"tracked {measured['tracked'] / 1e9:.3f} GB, allocated {measured['allocated'] / 1e9:.3f} GB"
    )
    for key in gpu_check.READINGS:
        assert abs(row["margins"][key]) <= gpu_check.TOLERANCE[key], (
            f"{key}: estimate {row['estimate'][key] / 1e9:.3f} GB, measured "
            f"{measured[key] / 1e9:.3f} GB ({100 * row['margins'][key]:+.1f}%)"
        )


@pytest.mark.notebooks
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_runs_on_the_gpu(notebook: Path, tmp_path: Path) -> None:
    runner, reason = gpu_check.notebook_runner()
    if runner is None:
        pytest.skip(reason)
    runner(notebook, tmp_path / notebook.name)
