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


# ----- the release: built on a tag, published with trusted publishing ------------------------
def test_ci_builds_the_wheel_that_the_colab_environment_installs() -> None:
    lines = run_lines(next(iter(load("ci.yml")["jobs"].values())))
    assert "make dist" in lines and lines.index("make dist") < lines.index("make test")
    makefile = (ROOT / "Makefile").read_text()
    rule = re.search(r"^\$\(COLAB_VENV\)/\.installed-wheel: (.*?)\n\n", makefile, re.M | re.S)
    assert rule and "$(WHEEL)" in rule.group(1).splitlines()[0], "the Colab env needs the wheel"
    assert '"lessonkit[measure] @ file://$(CURDIR)/$(WHEEL)"' in rule.group(1)
    colab_rules = re.findall(r"^\$\(COLAB_VENV\)/\.installed.*?\n\n", makefile, re.M | re.S)
    assert len(colab_rules) == 2
    assert not any(re.search(r"echo .*\.pth", rule) for rule in colab_rules)  # never the tree
    assert re.search(r"^test: .*\$\(COLAB_VENV\)/\.installed-wheel", makefile, re.M)
    assert re.search(r"^\$\(WHEEL\): .*\n\trm -rf dist\n\t\$\(PY\) -m build ", makefile, re.M)


def test_release_builds_on_a_tag_and_publishes_with_trusted_publishing() -> None:
    workflow = load("release.yml")
    assert triggers(workflow) == {"push": {"tags": ["v*"]}}
    assert workflow["permissions"] == {"contents": "read"}  # nothing more, except where needed
    jobs = workflow["jobs"]
    build, publish = jobs["build"], jobs["publish"]
    for job in jobs.values():
        assert job["runs-on"] == "ubuntu-latest" and job.get("timeout-minutes")
        for step in job["steps"]:
            assert ("run" in step) != ("uses" in step), step
            uses = step.get("uses", "")
            # Pinned: a major version of GitHub's own actions, an exact release of the others.
            assert not uses or re.search(
                r"^actions/[\w-]+@v\d+$|^pypa/gh-action-pypi-publish@v\d+\.\d+\.\d+$", uses
            ), uses
            assert "${{" not in str(step.get("run", "")), "no expressions inside shell scripts"
    lines = run_lines(build)
    assert "python -m build" in lines and "python -m twine check --strict dist/*" in lines
    assert "python tools/set_repository.py --check" in lines
    assert any('"$GITHUB_REF_NAME" != "v$version"' in line for line in lines)  # tag = version
    assert any(
        line.startswith("/tmp/wheel-check/bin/python -m pip install dist/") for line in lines
    )
    upload = next(s for s in build["steps"] if s.get("uses", "").startswith("actions/upload-art"))
    assert upload["with"]["path"] == "dist/" and "permissions" not in build
    # Publishing is its own job: the only one with an OIDC token, in an environment, running
    # no code of the repository (no checkout, no run step), with no password or token.
    assert publish["needs"] == "build"
    assert publish["permissions"] == {"id-token": "write"}
    assert publish["environment"]["name"] == "pypi"
    assert [s.get("uses", "").split("@")[0] for s in publish["steps"]] == [
        "actions/download-artifact",
        "pypa/gh-action-pypi-publish",
    ]
    download = publish["steps"][0]["with"]
    assert download == {"name": upload["with"]["name"], "path": "dist/"}
    assert "with" not in publish["steps"][1]  # no password, no token: trusted publishing
    assert not [
        j for j, job in jobs.items() if "id-token" in job.get("permissions", {}) and j != "publish"
    ]


def test_make_clean_removes_everything_git_ignores() -> None:
    """`make clean` leaves the tree as a clone has it: whatever .gitignore names, it removes."""
    recipe = re.search(r"^clean:\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    words = set(
        re.findall(
            r"[\w.*-]+",
            recipe.replace("$(VENV)", ".venv")
            .replace("$(COLAB_VENV)", ".venv-colab")
            .replace("$(OLDEST_VENV)", ".venv-oldest")
            .replace("$(CLASSIC_ENV)", ".venv-classic"),
        )
    )
    ignored = [
        line.strip().rstrip("/")
        for line in (ROOT / ".gitignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert [name for name in ignored if name not in words] == []
