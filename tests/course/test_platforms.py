"""Colab and Kaggle as students meet them: installing lessonkit changes none of the packages they
preinstall, and the notebooks and explorers work with Colab's versions.

The profiles (tests/platforms/colab.txt, kaggle.txt) list what each platform preinstalls, with
source and date. Two checks use them:

- a pip dry run (``pip install --dry-run --report``) of lessonkit[measure] into an environment
  whose installed packages are exactly a profile's (metadata only, so no download of torch or
  CUDA): the report must install lessonkit and nothing that the platform already has;
- the Colab test environment (``make colab-env``, built by ``make test``): Colab's versions of
  everything lessonkit and the kernel use, with the local torch build and this machine's Python,
  and lessonkit installed from the wheel ``make dist`` builds (as students install it from
  PyPI), never from the source tree. Every notebook runs there under nbval and papermill, and
  the widget tests drive every explorer callback with ipywidgets 7.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from repository import source_copy  # tests/repository.py

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "platforms"))
import profiles  # noqa: E402  (tests/platforms/profiles.py)

COLAB_VENV = Path(os.environ.get("LESSONKIT_COLAB_VENV", ROOT / ".venv-colab"))
COLAB_KERNEL = "lessonkit-colab"
MATTERS = ("torch", "numpy", "matplotlib", "ipywidgets", "transformers", "peft", "ipykernel")


# ----- the profiles ---------------------------------------------------------------------------
@pytest.mark.parametrize("platform", profiles.PLATFORMS)
def test_profiles_say_where_their_versions_come_from(platform):
    head = profiles.header(platform)
    assert re.search(r"# Source: \S+/\S+, \S+\.txt at commit\s+#\s+[0-9a-f]{40}", head), head
    assert re.search(r"# As of: observed \d{4}-\d{2}-\d{2}", head), head
    assert re.search(r"# Python there: 3\.\d+", head), head
    versions = profiles.read(platform)
    assert set(MATTERS) <= set(versions)
    assert all(re.fullmatch(r"[\w.+]+", v) for v in versions.values())


def test_colab_ships_ipywidgets_7_and_kaggle_8():
    """What pyproject's ipywidgets range is for: both must stay inside it."""
    assert profiles.read("colab")["ipywidgets"].startswith("7.7.")
    assert profiles.read("kaggle")["ipywidgets"].startswith("8.")


# ----- pip's dry run against each platform ----------------------------------------------------
@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = source_copy(tmp_path_factory.mktemp("source"))  # not in place: no build/ there
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
            str(out),
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PIP_NO_INDEX="1"),
    )
    assert build.returncode == 0, build.stderr
    return next(out.glob("lessonkit-*.whl"))


def preinstalled_env(path: Path, versions: dict[str, str]) -> Path:
    """A Python environment whose installed distributions are ``versions`` (metadata only)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    site = Path(
        subprocess.run(
            [
                str(path / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_path('purelib'))",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for name, version in versions.items():
        info = site / f"{re.sub(r'[-.]+', '_', name)}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("pip\n")
    return path / "bin" / "python"


def dry_run(
    python: Path, requirement: str, report: Path, own_pip: bool = False
) -> list[tuple[str, str]]:
    """(name, version) of every distribution ``pip install requirement`` would install into
    ``python``'s environment (with that environment's own pip, or with this one's)."""
    pip = (
        [str(python), "-m", "pip"]
        if own_pip
        else [sys.executable, "-m", "pip", "--python", str(python)]
    )
    run = subprocess.run(
        [*pip, "install", "--dry-run", "--quiet", "--report", str(report), requirement],
        capture_output=True,
        text=True,
        timeout=600,
        # a PYTHONPATH with this checkout on it would show pip lessonkit as installed already
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    installs = json.loads(report.read_text())["install"]
    return [(profiles.normalize(i["metadata"]["name"]), i["metadata"]["version"]) for i in installs]


def changed(installs: list[tuple[str, str]], versions: dict[str, str]) -> list[str]:
    return [
        f"{name} {versions[name]} -> {version}" for name, version in installs if name in versions
    ]


@pytest.mark.parametrize("platform", profiles.PLATFORMS)
def test_installing_lessonkit_changes_no_preinstalled_package(platform, wheel, tmp_path):
    versions = profiles.read(platform)
    python = preinstalled_env(tmp_path / "env", versions)
    installs = dry_run(python, f"lessonkit[measure] @ {wheel.as_uri()}", tmp_path / "report.json")
    assert "lessonkit" in [name for name, _ in installs]
    assert changed(installs, versions) == [], f"pip would change {platform}'s packages"


def test_the_dry_run_sees_an_upgrade(wheel, tmp_path):
    """The check can fail: a platform with a matplotlib older than lessonkit allows."""
    versions = {**profiles.read("colab"), "matplotlib": "3.5.3"}
    python = preinstalled_env(tmp_path / "env", versions)
    installs = dry_run(python, f"lessonkit[measure] @ {wheel.as_uri()}", tmp_path / "report.json")
    assert [c for c in changed(installs, versions) if c.startswith("matplotlib 3.5.3 -> ")]


# ----- the Colab test environment ---------------------------------------------------------------
def built(venv: Path, target: str, stamp: str = ".installed") -> Path:
    """The Python of a test environment that make builds (skipped without it, but not in CI)."""
    if not (venv / stamp).exists():
        if os.environ.get("CI"):
            pytest.fail(f"no test environment at {venv}: CI runs 'make test', which builds it")
        pytest.skip(f"no test environment at {venv}: run 'make {target}'")
    return venv / "bin" / "python"


@pytest.fixture(scope="module")
def colab_python() -> Path:
    return built(COLAB_VENV, "colab-env", ".installed-wheel")


def test_the_colab_environment_has_lessonkit_from_a_wheel_of_this_tree(colab_python):
    """Installed from a wheel file (not editable, not a path into the tree), and the files it
    installed are this tree's: a stale wheel would test old code."""
    code = (
        "import importlib.metadata as m, json, pathlib, lessonkit\n"
        "d = m.distribution('lessonkit')\n"
        "print(json.dumps({'file': lessonkit.__file__, 'url': json.loads("
        "d.read_text('direct_url.json') or '{}'), 'files': {str(f): f.read_text() for f in "
        "d.files if str(f).startswith('lessonkit/') and f.suffix in ('.py', '.json')}}))"
    )
    # -P: not the working directory (the tree) first on sys.path, only what is installed.
    run = subprocess.run(
        [str(colab_python), "-P", "-c", code], capture_output=True, text=True, cwd=ROOT
    )
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    assert Path(found["file"]).resolve().is_relative_to(COLAB_VENV.resolve()), found["file"]
    assert "archive_info" in found["url"] and found["url"]["url"].endswith(".whl"), found["url"]
    tree = {
        str(p.relative_to(ROOT)): p.read_text()
        for p in (ROOT / "lessonkit").rglob("*")
        if p.suffix in (".py", ".json") and "__pycache__" not in p.parts
    }
    stale = sorted(set(tree) ^ set(found["files"]))
    stale += sorted(name for name in tree if found["files"].get(name, tree[name]) != tree[name])
    assert stale == [], (
        f"the Colab environment's lessonkit is not this tree's: make colab-env {stale[:5]}"
    )


def installed(python: Path) -> dict[str, str]:
    out = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {profiles.normalize(p["name"]): p["version"] for p in json.loads(out)}


def test_the_colab_environment_holds_colabs_versions(colab_python):
    colab, have = profiles.read("colab"), installed(colab_python)
    assert set(MATTERS) - {"torch"} <= set(have)
    differ = [
        f"{n}: {have[n]} here, {v} on Colab"
        for n, v in colab.items()
        if n in have and n not in profiles.LOCAL and have[n] != v
    ]
    assert differ == []
    python = subprocess.run(
        [
            str(colab_python),
            "-c",
            "import sys, torch; print(sys.version_info[:2], torch.__version__)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert python.strip()  # torch imports there (the local build)


def test_in_the_colab_environment_installing_lessonkit_changes_nothing(
    colab_python, wheel, tmp_path
):
    # lessonkit itself is there already (from the working tree), so pip may or may not list it.
    have = {k: v for k, v in installed(colab_python).items() if k != "lessonkit"}
    installs = dry_run(
        colab_python,
        f"lessonkit[measure] @ {wheel.as_uri()}",
        tmp_path / "report.json",
        own_pip=True,
    )  # Colab's pip version
    assert changed(installs, have) == []
    assert [name for name, _ in installs if name != "lessonkit"] == []


def test_every_explorer_callback_with_colabs_ipywidgets(colab_python):
    """tests/widgets/test_widgets.py again, in the Colab environment (ipywidgets 7.7, its traitlets)."""
    version = subprocess.run(
        [str(colab_python), "-c", "import ipywidgets; print(ipywidgets.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version == profiles.read("colab")["ipywidgets"]
    run = subprocess.run(
        [
            str(colab_python),
            "-P",  # lessonkit from the environment's wheel, not from the tree
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/widgets/test_widgets.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, MPLBACKEND="Agg"),
    )
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", run.stdout).group(1))
    assert passed >= 35 and " failed" not in run.stdout


def test_charts_and_explorers_with_the_oldest_versions_pyproject_allows():
    """matplotlib 3.6 and ipywidgets 7.7 (pyproject's floors), numpy 1.x: the chart and widget
    tests in .venv-oldest/ (make test builds it)."""
    python = built(
        Path(os.environ.get("LESSONKIT_OLDEST_VENV", ROOT / ".venv-oldest")), "oldest-env"
    )
    shown = subprocess.run(
        [
            str(python),
            "-c",
            "import matplotlib, ipywidgets; print(matplotlib.__version__, ipywidgets.__version__)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    floors = [pin.split("==")[1].rstrip("*") for pin in profiles.lowest()[:2]]
    assert [v.startswith(f) for v, f in zip(shown, floors, strict=True)] == [True, True], (
        shown,
        floors,
    )
    run = subprocess.run(
        [
            str(python),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/charts/test_charts.py",
            "tests/widgets/test_widgets.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, MPLBACKEND="Agg"),
    )
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
    assert int(re.search(r"(\d+) passed", run.stdout).group(1)) >= 50


def kernel_env() -> dict[str, str]:
    """The test's environment, with the Colab kernel visible to Jupyter."""
    from test_notebooks import kernel_env as base

    env = base()
    env["JUPYTER_PATH"] = os.pathsep.join(
        [str(COLAB_VENV / "share" / "jupyter"), *filter(None, [env.get("JUPYTER_PATH")])]
    )
    return env


@pytest.mark.notebooks
def test_the_colab_kernel_runs_colabs_packages(colab_python, tmp_path, monkeypatch):
    import nbclient
    import nbformat

    for key, value in kernel_env().items():
        monkeypatch.setenv(key, value)
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                "import ipywidgets, matplotlib, numpy, lessonkit, sys\n"
                "print(ipywidgets.__version__, matplotlib.__version__, numpy.__version__, "
                "sys.executable, lessonkit.__file__)"
            )
        ]
    )
    client = nbclient.NotebookClient(
        nb, kernel_name=COLAB_KERNEL, timeout=120, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    shown = nb.cells[0].outputs[0]["text"].split()
    colab = profiles.read("colab")
    assert shown[:3] == [colab["ipywidgets"], colab["matplotlib"], colab["numpy"]]
    assert Path(shown[3]).parent.parent.resolve() == COLAB_VENV.resolve()
    assert Path(shown[4]).resolve().is_relative_to(COLAB_VENV.resolve())  # the wheel's


@pytest.mark.notebooks
@pytest.mark.parametrize("name", [p.name for p in sorted((ROOT / "notebooks").glob("*.ipynb"))])
def test_nbval_with_colabs_packages(colab_python, name):
    """Every cell runs and every checked number comes out the same as in the main environment."""
    from test_notebooks import SANITIZE

    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--nbval-lax",
            f"--nbval-kernel-name={COLAB_KERNEL}",
            f"--nbval-sanitize-with={SANITIZE}",
            "--nbval-cell-timeout=300",
            str(ROOT / "notebooks" / name),
        ],
        cwd=ROOT,
        env=kernel_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert re.search(r"\d+ passed", run.stdout)


@pytest.mark.notebooks
@pytest.mark.parametrize("name", [p.name for p in sorted((ROOT / "solutions").glob("*.ipynb"))])
def test_solution_notebooks_with_colabs_packages(colab_python, name, tmp_path, monkeypatch):
    import nbformat
    import papermill

    for key, value in kernel_env().items():
        monkeypatch.setenv(key, value)
    out = tmp_path / name
    papermill.execute_notebook(
        str(ROOT / "solutions" / name),
        str(out),
        kernel_name=COLAB_KERNEL,
        cwd=str(ROOT / "solutions"),  # not the root: lessonkit must come from the wheel
        progress_bar=False,
        log_output=False,
        execution_timeout=300,
    )
    statuses = re.findall(r"data-status='([^']+)'", json.dumps(nbformat.read(out, as_version=4)))
    assert statuses and set(statuses) <= {"correct", "self-check"}, statuses


def test_the_readme_quotes_the_profiles():
    readme = " ".join((ROOT / "README.md").read_text().split())
    colab, kaggle = profiles.read("colab"), profiles.read("kaggle")
    assert (
        f"ipywidgets {colab['ipywidgets']}, matplotlib {colab['matplotlib']}, numpy "
        f"{colab['numpy']}, ipykernel {colab['ipykernel']}"
    ) in readme
    assert (
        f"ipywidgets ({colab['ipywidgets'][:3]} on Colab, {kaggle['ipywidgets'][:3]} on Kaggle)"
        in readme
    )
    major_minor = colab["torch"].split("+")[0]
    assert f"Colab has {major_minor} with CUDA 12.8" in readme and colab["torch"].endswith("+cu128")
    assert "Colab has 3.12" in readme and "# Python there: 3.12" in profiles.header("colab")
