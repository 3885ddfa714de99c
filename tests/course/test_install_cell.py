"""One repository and one release tag for every badge and install cell, and an install cell that
fails with one short message naming the platform and the fix."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "set_repository.py"
FOLDERS = ("notebooks", "exercises", "solutions")
sys.path.insert(0, str(ROOT / "tools"))
import bootstrap  # noqa: E402


def one_place(root: Path = ROOT) -> tuple[str, str]:
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    settings = pyproject["tool"]["lessonkit"]
    assert (
        pyproject["project"]["urls"]["Homepage"] == f"https://github.com/{settings['repository']}"
    )
    return settings["repository"], settings["release"]


def notebooks(root: Path = ROOT) -> list[Path]:
    return [p for folder in FOLDERS for p in sorted((root / folder).glob("*.ipynb"))]


def links(path: Path) -> list[tuple[str, str]]:
    """(OWNER/NAME, ref) of every GitHub link and git requirement in a notebook."""
    text = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
    found = re.findall(r"github(?:\.com)?/([\w.-]+/[\w.-]+)/blob/([^/\s)]+)/", text)
    found += re.findall(r"git\+https://github\.com/([\w.-]+/[\w.-]+)@([^\s\"']+)", text)
    return found


def run_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=120
    )


# ----- one place --------------------------------------------------------------------------------
def test_the_release_is_a_tag_of_this_version():
    repository, ref = one_place()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert ref == f"v{version}" and ref not in ("main", "master")
    assert re.fullmatch(r"[\w.-]+/[\w.-]+", repository)


def test_every_badge_and_install_cell_names_the_one_place():
    repository, ref = one_place()
    for path in notebooks():
        found = links(path)
        assert len(found) >= 3, f"{path}: two badges and an install cell expected, got {found}"
        assert set(found) == {(repository, ref)}, f"{path.relative_to(ROOT)}: {set(found)}"
        folder = path.parent.name
        assert f"blob/{ref}/{folder}/{path.name}" in path.read_text()  # the badge opens itself
    assert run_tool("--check").returncode == 0


@pytest.fixture
def course_copy(tmp_path: Path) -> Path:
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, tmp_path / folder)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_check_fails_when_a_notebook_disagrees(course_copy):
    target = course_copy / "notebooks" / "03_choosing_your_environment.ipynb"
    _, ref = one_place()
    target.write_text(target.read_text().replace(f"/blob/{ref}/", "/blob/main/", 1))
    check = run_tool("--check", "--root", str(course_copy))
    assert check.returncode == 1
    assert "notebooks/03_choosing_your_environment.ipynb: badges point elsewhere" in check.stderr
    assert run_tool("--root", str(course_copy)).returncode == 0  # rewriting repairs it
    assert run_tool("--check", "--root", str(course_copy)).returncode == 0


def test_set_repository_points_a_fork_everywhere_and_is_idempotent(course_copy):
    run = run_tool("someone/their-course", "--ref", "v0.2.0", "--root", str(course_copy))
    assert run.returncode == 0, run.stderr
    assert one_place(course_copy) == ("someone/their-course", "v0.2.0")
    for path in notebooks(course_copy):
        assert set(links(path)) == {("someone/their-course", "v0.2.0")}, path
        assert "gpu-survival-guide/" not in path.read_text()
    before = {p: p.read_bytes() for p in notebooks(course_copy)}
    again = run_tool("--root", str(course_copy))
    assert again.returncode == 0 and "0 notebooks rewritten" in again.stdout
    assert {p: p.read_bytes() for p in notebooks(course_copy)} == before
    assert run_tool("--check", "--root", str(course_copy)).returncode == 0


@pytest.mark.parametrize("args", [["someone/x", "--ref", "main"], ["not a repo"]])
def test_set_repository_refuses_branches_and_bad_names(course_copy, args):
    run = run_tool(*args, "--root", str(course_copy))
    assert run.returncode == 2 and "error:" in run.stderr
    assert one_place(course_copy) == one_place()


# ----- the install cell ---------------------------------------------------------------------------
def test_the_cells_platform_signals_are_lessonkits():
    """The cell runs before lessonkit exists, so it carries its own signals: the catalog's."""
    from lessonkit.hardware.environments import list_environments

    detect = {e.detect.get("platform", e.key): e.detect for e in list_environments() if e.detect}
    assert '"google.colab" in sys.modules' in bootstrap.CELL
    assert "google.colab" in detect["colab"]["modules"]
    assert '"KAGGLE_KERNEL_RUN_TYPE" in os.environ' in bootstrap.CELL
    assert "KAGGLE_KERNEL_RUN_TYPE" in detect["kaggle"]["env"]


def the_install_cell() -> str:
    nb = json.loads((ROOT / "notebooks" / "01_vram_equation.ipynb").read_text())
    return "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])


PLATFORMS = {
    "colab": (
        "import sys, types\nsys.modules['google.colab'] = types.ModuleType('google.colab')",
        {},
        ["On Colab:", "Disconnect and delete runtime"],
    ),
    "kaggle": (
        "",
        {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"},
        ["On Kaggle:", "Settings > Internet", "phone-verified"],
    ),
    "local": ("", {}, ["On your own machine:", "make course"]),
}
# No network: every proxy points at a closed local port, as on Kaggle with Internet off.
OFFLINE = dict.fromkeys(
    ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"),
    "http://127.0.0.1:9",
)


def run_cell_without_lessonkit(setup: str, env: dict[str, str], monkeypatch) -> list[dict]:
    """Run the install cell in a kernel where lessonkit cannot be imported; return the outputs of
    [setup, install cell, a later cell]."""
    import nbclient
    import nbformat

    for key, value in {**OFFLINE, "GIT_TERMINAL_PROMPT": "0", **env}.items():
        monkeypatch.setenv(key, value)
    if "KAGGLE_KERNEL_RUN_TYPE" not in env:
        monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    hide = "import sys\nsys.modules['lessonkit'] = None  # as where it is not installed\n"
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(hide + setup),
            nbformat.v4.new_code_cell(the_install_cell()),
            nbformat.v4.new_code_cell("print('the next cell ran')"),
        ]
    )
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300)
    with pytest.raises(nbclient.exceptions.CellExecutionError):
        client.execute()
    return [c.outputs for c in nb.cells]


def assert_one_short_message(outputs: list[dict], expected: list[str]) -> str:
    """The cell printed that it installs, then failed with one short message and no traceback."""
    assert [o.get("text") for o in outputs[:-1]] == ["Installing lessonkit (about a minute)...\n"]
    outputs = outputs[-1:]
    assert outputs[0]["output_type"] == "error", outputs
    shown = "\n".join(outputs[0]["traceback"])
    assert outputs[0]["traceback"] == [shown] and len(shown) < 400, shown
    assert shown.startswith("Could not install lessonkit (")
    for word in expected:
        assert word in shown, shown
    for noise in ("Traceback", "ModuleNotFoundError", "restart the kernel", 'File "', "----"):
        assert noise not in shown, shown
    return shown


@pytest.mark.parametrize("platform", PLATFORMS)
def test_offline_the_cell_names_the_platform_and_the_fix(platform, monkeypatch):
    setup, env, expected = PLATFORMS[platform]
    setup_out, cell_out, later = run_cell_without_lessonkit(setup, env, monkeypatch)
    assert setup_out == []
    shown = assert_one_short_message(cell_out, expected)
    assert "(no Internet connection)" in shown
    assert later == []  # Run All stops at the cell


def test_a_pip_failure_shows_pips_own_last_line(monkeypatch, tmp_path):
    """Not the network: pip cannot run git (none on PATH); the message quotes pip and the fix."""
    monkeypatch.setenv("PATH", str(tmp_path))  # the kernel starts from its full path
    setup_out, cell_out, later = run_cell_without_lessonkit(
        "", {"KAGGLE_KERNEL_RUN_TYPE": "Batch"}, monkeypatch
    )
    shown = assert_one_short_message(cell_out, ["On Kaggle:", "git"])
    assert "no Internet connection" not in shown and later == []
