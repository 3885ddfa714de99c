"""The CI workflows are valid YAML and their jobs run the README's commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml is in the dev extra")

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


def readme_commands() -> dict[str, str]:
    """The test command from the README's set-up block and the GPU validation command."""
    text = (ROOT / "README.md").read_text()
    setup = text.split("## Set-up", 1)[1]
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", setup, re.S)
    assert block, "README.md's set-up section has no code block"
    commands = [line.split("#", 1) for line in block.group(1).splitlines() if line.strip()]
    tests = [
        cmd.strip()
        for cmd, *comment in commands
        if "test" in cmd or any("test" in c for c in comment)
    ]
    assert len(tests) == 1, f"expected one test command in the set-up block, got {tests}"
    gpu = sorted(set(re.findall(r"`(make [\w-]*gpu[\w-]*)`|^(make [\w-]*gpu[\w-]*)", text, re.M)))
    gpu_commands = sorted({a or b for a, b in gpu})
    assert len(gpu_commands) == 1, f"expected one GPU command in README.md, got {gpu_commands}"
    return {"test": tests[0], "gpu": gpu_commands[0]}


def load(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    assert isinstance(data, dict), f"{name} is not a YAML mapping"
    return data


def triggers(workflow: dict) -> dict:
    # YAML 1.1 reads the key `on` as True.
    on = workflow.get("on", workflow.get(True))
    return {on: None} if isinstance(on, str) else dict.fromkeys(on) if isinstance(on, list) else on


def run_lines(job: dict) -> list[str]:
    return [line.strip() for step in job["steps"] for line in str(step.get("run", "")).splitlines()]


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


def test_readme_commands_are_make_targets() -> None:
    commands = readme_commands()
    for command in commands.values():
        target = command.split()[1]
        assert target in makefile_targets(), f"README's {command!r} has no Makefile target"


@pytest.mark.parametrize("name", ["ci.yml", "gpu.yml"])
def test_workflow_is_well_formed(name: str) -> None:
    workflow = load(name)
    assert workflow.get("name") and triggers(workflow), f"{name} needs a name and triggers"
    assert workflow["jobs"], f"{name} has no jobs"
    for job_id, job in workflow["jobs"].items():
        assert job.get("runs-on"), f"{name}: job {job_id} has no runs-on"
        assert job.get("timeout-minutes"), f"{name}: job {job_id} has no timeout"
        uses = [step["uses"] for step in job["steps"] if "uses" in step]
        assert any(u.startswith("actions/checkout@") for u in uses), (
            f"{name}: {job_id} never checks out"
        )
        assert all(re.search(r"@v\d+$", u) for u in uses), f"{name}: unpinned action in {uses}"
        for step in job["steps"]:
            assert ("run" in step) != ("uses" in step), f"{name}: a step needs run or uses: {step}"


def test_cpu_job_runs_the_readme_test_command_on_a_hosted_runner() -> None:
    commands = readme_commands()
    workflow = load("ci.yml")
    assert {"push", "pull_request"} <= set(triggers(workflow))
    jobs = list(workflow["jobs"].values())
    cpu = [job for job in jobs if commands["test"] in run_lines(job)]
    assert cpu, f"no job in ci.yml runs {commands['test']!r}"
    assert all(job["runs-on"] == "ubuntu-latest" for job in cpu)
    assert not any(commands["gpu"] in run_lines(job) for job in jobs), "the CPU workflow has no GPU"


def test_gpu_job_runs_the_tests_and_the_gpu_check_on_a_gpu_runner() -> None:
    commands = readme_commands()
    workflow = load("gpu.yml")
    assert "workflow_dispatch" in triggers(workflow)
    gpu_jobs = [
        job
        for job in workflow["jobs"].values()
        if isinstance(job["runs-on"], list) and {"self-hosted", "gpu"} <= set(job["runs-on"])
    ]
    assert len(gpu_jobs) == 1, "gpu.yml needs one job on a self-hosted runner labelled gpu"
    lines = run_lines(gpu_jobs[0])
    assert commands["test"] in lines and commands["gpu"] in lines
    assert lines.index(commands["test"]) < lines.index(commands["gpu"])
    uploads = [
        s
        for s in gpu_jobs[0]["steps"]
        if str(s.get("uses", "")).startswith("actions/upload-artifact")
    ]
    default_out = gpu_check_default_out()
    assert uploads and (ROOT / uploads[0]["with"]["path"]).resolve() == default_out, (
        f"the GPU job should keep the results table, written to {default_out}"
    )


def gpu_check_default_out() -> Path:
    from script_loader import load_gpu_check

    return load_gpu_check().parse_args([]).out.resolve()
