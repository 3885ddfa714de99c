"""Packaging promises: a cheap import, environment.yml agreeing with pyproject, CI = README."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
import yaml
from repository import source_copy  # tests/repository.py

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "matplotlib", "peft", "ipywidgets")


def test_import_is_light():
    """``import lessonkit`` loads its top module and a handful of the standard library's, nothing
    heavy (the seconds it takes: benchmarks/import_speed.py)."""
    code = (
        "import sys; before = set(sys.modules); import lessonkit; "
        "print(','.join(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = out.stdout.strip().split(",")
    assert not [m for m in loaded if m.split(".")[0] in HEAVY], (
        f"import lessonkit pulled in {loaded}"
    )
    assert [m for m in loaded if m.startswith("lessonkit")] == ["lessonkit"], loaded
    assert len(loaded) <= 15, loaded


def test_public_names_resolve_to_what_their_modules_define():
    code = (
        "import importlib, types, lessonkit\n"
        "for name, module in lessonkit._EXPORTS.items():\n"
        "    value = getattr(lessonkit, name)\n"
        "    assert not isinstance(value, types.ModuleType), name\n"
        "    assert value is getattr(importlib.import_module('lessonkit.' + module), name), name\n"
        "import lessonkit.memory.measuring, lessonkit.planning.recommender\n"
        "assert callable(lessonkit.measure) and callable(lessonkit.recommend)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_environment_yml_agrees_with_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    project = _pyproject()["project"]
    assert "conda-forge" in env["channels"]
    deps = env["dependencies"]
    python = next(d for d in deps if isinstance(d, str) and d.startswith("python"))
    assert python.replace("python", "") == project["requires-python"]
    pip_lines = next(d["pip"] for d in deps if isinstance(d, dict))
    # Python packages come from pyproject alone: environment.yml installs the project itself.
    conda_packages = {re.split(r"[<>=]", d)[0] for d in deps if isinstance(d, str)}
    assert conda_packages == {"python", "pip"}
    extras = set(project["optional-dependencies"])
    for line in pip_lines:
        match = re.fullmatch(r"-e \.\[([a-z,]+)\]", line)
        assert match, f"unexpected pip line {line!r}"
        assert set(match.group(1).split(",")) <= extras


def test_torch_is_a_range_in_the_package_and_pinned_for_development():
    measure = _pyproject()["project"]["optional-dependencies"]["measure"]
    torch_req = next(r for r in measure if r.startswith("torch"))
    assert "==" not in torch_req and ">=" in torch_req
    assert "TORCH_SPEC ?= torch==" in (ROOT / "Makefile").read_text()


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    setup = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in setup.splitlines() if line.strip()]
    assert len(commands) == 2, commands
    test_command = commands[1]
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_cli_output_piped_into_a_closed_reader_does_not_crash():
    # The pipe's reading end is closed before the CLI starts, so every write meets a closed pipe
    # (no race with a reader that exits in its own time).
    reader, writer = os.pipe()
    os.close(reader)
    try:
        run = subprocess.run(
            [sys.executable, "-m", "lessonkit", "recommend", "--model", "7B"],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            timeout=300,
        )
    finally:
        os.close(writer)
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""


def test_run_times_read_in_sensible_units():
    from lessonkit.units import format_hours

    assert format_hours(0.03) == "2 min"
    assert format_hours(0.001) == "1 min"
    assert format_hours(5.3) == "5.3 h"
    assert format_hours(300) == "12.5 days"
    assert format_hours(0.999) == "1.0 h" and format_hours(47.99) == "2.0 days"
    assert format_hours(float("inf")) == "never"


def _fake_venv(tmp_path: Path) -> Path:
    """A venv stand-in whose `jupyter` prints its arguments, already marked as installed."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    jupyter = venv / "bin" / "jupyter"
    jupyter.write_text('#!/bin/sh\necho "jupyter $*"\n')
    jupyter.chmod(0o755)
    (venv / ".installed-course").touch()
    return venv


@pytest.mark.parametrize("extra", ["", "--no-browser --port 8899"])
def test_make_course_passes_jupyter_args_and_allows_root_when_root(tmp_path, extra):
    venv = _fake_venv(tmp_path)
    run = subprocess.run(
        ["make", "-s", "course", f"VENV={venv}", f"JUPYTER_ARGS={extra}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    args = run.stdout.split("jupyter lab", 1)[1].split()
    assert ("--allow-root" in args) == (os.getuid() == 0)
    # JupyterLab at the repository root, so exercises/ and solutions/ open from it too; it
    # starts on the first notebook.
    course = ("--ServerApp.root_dir=.", "notebooks/01_vram_equation.ipynb")
    assert tuple(args[-2:]) == course and (ROOT / course[1]).exists()
    assert " ".join(a for a in args if a not in ("--allow-root", *course)) == extra


def test_pyproject_uses_an_spdx_licence_and_ships_the_data_package():
    project = _pyproject()
    assert project["project"]["license"] == "MIT"
    assert project["project"]["license-files"] == ["LICENSE"]
    setuptools_req = next(
        r for r in project["build-system"]["requires"] if r.startswith("setuptools")
    )
    assert int(setuptools_req.split(">=")[1].split(".")[0]) >= 77
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["lessonkit*"]


def test_the_wheel_builds_without_warnings_and_holds_the_data(tmp_path):
    pytest.importorskip("setuptools", minversion="77")
    source = source_copy(tmp_path / "source")  # a build in place writes build/ and *.egg-info/
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "wheel"),
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PIP_NO_INDEX="1"),
    )
    assert build.returncode == 0, build.stderr
    for warning in ("SetuptoolsDeprecationWarning", "License classifiers", "is absent from the"):
        assert warning not in build.stdout + build.stderr
    wheel = zipfile.ZipFile(next((tmp_path / "wheel").glob("lessonkit-*.whl")))
    names = set(wheel.namelist())
    data = {p.name for p in (ROOT / "lessonkit" / "data").glob("*.json")}
    assert data and {f"lessonkit/data/{n}" for n in data} <= names
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "lessonkit").rglob("*.py")}
    assert modules and modules <= names, sorted(modules - names)
    metadata = wheel.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "License-Expression: MIT" in metadata


def _readme_block(heading: str, lang: str) -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split(heading, 1)[1]
    return re.search(rf"```{lang}\n(.*?)```", section, re.S).group(1)


def test_readme_python_example_runs_and_prints_what_it_says(capsys):
    code = _readme_block("## lessonkit in five lines", "python")
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    report = namespace["report"]
    assert report.settings["method"] == "qlora" and report.settings["gradient_checkpointing"]
    claimed = re.search(r"peak per GPU: ([\d.]+) GiB, during the (\w+)", code)
    assert claimed, "the README's comment no longer states the peak"
    from lessonkit.units import GiB

    assert (
        claimed.group(1) == f"{report.total_bytes / GiB:.2f}"
        and claimed.group(2) == report.peak_phase
    )
    assert f"{report.total_bytes / GiB:.2f} GiB" in out


def test_readme_python_example_as_a_script_prints_what_the_cli_prints():
    """Run as a script, the five lines show the health report and the recommendations as
    `lessonkit check` and `lessonkit recommend` print them, not reprs."""
    code = _readme_block("## lessonkit in five lines", "python")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    script = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT
    )
    assert script.returncode == 0, script.stderr
    budget = re.search(r'recommend\("(\w+)", budget=(\d+), tokens=([\de.]+)\)', code)
    cli = [
        subprocess.run(
            [sys.executable, "-m", "lessonkit", *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            cwd=ROOT,
        ).stdout
        for argv in (
            ["check"],
            [
                "recommend",
                "--model",
                budget.group(1),
                "--budget",
                budget.group(2),
                "--tokens",
                budget.group(3),
            ],
        )
    ]
    assert script.stdout.endswith(cli[0] + cli[1])
    assert "GPU health check:" in cli[0] and cli[1].startswith("Recommendation for 70B")
    assert "HealthReport(" not in script.stdout and "Recommendation(" not in script.stdout
    breakdown = script.stdout[: -len(cli[0] + cli[1])]
    promised = re.search(r"peak per GPU: ([\d.]+ GiB)", code)  # what the comment says it prints
    assert promised and promised.group(1) in breakdown


def test_readme_gives_the_measured_size_of_the_environment():
    """The size the README states for .venv/ (CPU build of torch), against this environment."""
    import torch

    if ".venv" not in Path(sys.prefix).name or "+cpu" not in torch.__version__:
        pytest.skip("measured on the .venv/ that make test builds with the CPU build of torch")
    readme = " ".join((ROOT / "README.md").read_text().split())
    stated = float(
        re.search(
            r"`\.venv/` measured ([\d.]+) GB after `make test` with the CPU "
            r"build of torch",
            readme,
        ).group(1)
    )
    used = subprocess.run(["du", "-sb", sys.prefix], capture_output=True, text=True, check=True)
    measured = int(used.stdout.split()[0]) / 1e9  # GB, as the README writes sizes
    assert abs(measured - stated) / stated < 0.15, f"{measured:.2f} GB here, README says {stated}"


def test_readme_cli_examples_run_and_print_what_it_says():
    commands = [
        line
        for line in _readme_block("The same from a shell:", "text").splitlines()
        if line.startswith("lessonkit vram")
    ]
    readme = " ".join((ROOT / "README.md").read_text().split())
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    vram = subprocess.run(
        [sys.executable, "-m", "lessonkit", *commands[0].split()[1:]],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert vram.returncode == 0, vram.stderr
    verdict = next(line for line in vram.stdout.splitlines() if line.startswith("T4 "))
    assert verdict in readme
    # the same without --gradient-checkpointing: the README quotes its peak and the suggested fix
    argv = [a for a in commands[0].split()[1:] if a != "--gradient-checkpointing"]
    without = subprocess.run(
        [sys.executable, "-m", "lessonkit", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert without.returncode == 1
    need = re.search(r"this run needs ([\d.]+ GiB)", without.stdout).group(1)
    fix = next(line.strip() for line in without.stdout.splitlines() if "It fits with" in line)
    assert f"the run above needs {need}" in readme and f"`{fix}`" in readme
    for line in _readme_block("The same from a shell:", "text").splitlines():
        if "[" not in line:  # the check line shows optional flags
            assert (
                subprocess.run(
                    [sys.executable, "-m", "lessonkit", *line.split()[1:]],
                    capture_output=True,
                    env=env,
                    timeout=120,
                ).returncode
                == 0
            ), line


def test_the_release_tag_names_the_package_version():
    """The tag every badge and install cell pins is this version's tag, so a version bump that
    forgets the notebooks (or the reverse) fails here."""
    data = _pyproject()
    assert data["tool"]["lessonkit"]["release"] == "v" + data["project"]["version"]
