"""One repository and one release for every badge and install cell; an install cell that takes
the release from the package index first, stays hidden, survives ruff, and fails with one short
message naming the platform and the fix."""

from __future__ import annotations

import json
import os
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


def install_from(root: Path = ROOT) -> str:
    return tomllib.loads((root / "pyproject.toml").read_text())["tool"]["lessonkit"]["install"]


def notebooks(root: Path = ROOT) -> list[Path]:
    return [p for folder in FOLDERS for p in sorted((root / folder).glob("*.ipynb"))]


def links(path: Path) -> list[tuple[str, str]]:
    """(OWNER/NAME, ref) of every GitHub link in a notebook, and the install cell's release."""
    text = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
    found = re.findall(r"github(?:\.com)?/([\w.-]+/[\w.-]+)/blob/([^/\s)]+)/", text)
    found += [
        (repository, f"v{version}")
        for version, repository in re.findall(
            r'^VERSION = "([^"]+)"\nREPOSITORY = "([^"]+)"$', text, re.M
        )
    ]
    return found


def install_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if bootstrap.is_install_cell(c)]


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
        (cell,) = install_cells(path)
        assert "".join(cell["source"]) == bootstrap.install_cell(
            repository, ref[1:], install_from() == "index"
        )
    assert run_tool("--check").returncode == 0


def test_the_install_cell_is_hidden_and_titled_everywhere():
    for path in notebooks():
        cells = json.loads(path.read_text())["cells"]
        first = next(c for c in cells if c["cell_type"] == "code")
        assert install_cells(path) == [first], path.name
        assert first["metadata"]["cellView"] == "form"  # Colab's form view: the title only
        assert first["metadata"]["jupyter"] == {"source_hidden": True}  # JupyterLab, Notebook 7
        assert "".join(first["source"]).startswith("# @title Install lessonkit")


def ruff(*args: str, text: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--config", str(ROOT / "pyproject.toml"), "-"],
        input=text,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("repository", "version", "index"),
    [
        ("gpu-survival-guide/gpu-survival-guide", "0.1.0", True),
        ("someone/their-course", "12.3.4rc1", False),
        ("o" * 39 + "/" + "n" * 40, "1.2.3.post4.dev5", True),  # the longest accepted
    ],
)
def test_the_install_cell_is_ruff_clean_and_ruff_format_leaves_it(repository, version, index):
    """`make format` (ruff's fixes, then its formatter) runs over the notebooks: once it removed
    the cell's last `import lessonkit` and turned every cell into a SyntaxError's neighbour."""
    cell = bootstrap.install_cell(repository, version, index) + "\n"
    assert len(repository) <= bootstrap.MAX_REPOSITORY
    checked = ruff("check", "--stdin-filename", "cell.py", text=cell)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    formatted = ruff("format", "--stdin-filename", "cell.py", text=cell)
    assert formatted.returncode == 0 and formatted.stdout == cell, formatted.stdout
    fixed = ruff("check", "--fix", "--stdin-filename", "cell.py", text=cell)
    assert fixed.stdout == cell  # nothing for --fix to remove
    compile(cell, "cell", "exec")


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


def set_version(root: Path, version: str) -> None:
    path = root / "pyproject.toml"
    text = path.read_text()
    path.write_text(re.sub(r'(?m)^version = ".*"$', f'version = "{version}"', text, count=1))


def test_set_repository_points_a_fork_everywhere_and_is_idempotent(course_copy):
    set_version(course_copy, "0.2.0")  # a fork's release: its version, then its tag
    run = run_tool("someone/their-course", "--ref", "v0.2.0", "--root", str(course_copy))
    assert run.returncode == 0, run.stderr
    assert one_place(course_copy) == ("someone/their-course", "v0.2.0")
    for path in notebooks(course_copy):
        assert set(links(path)) == {("someone/their-course", "v0.2.0")}, path
        assert "gpu-survival-guide/" not in path.read_text()
        (cell,) = install_cells(path)
        assert 'f"lessonkit[measure]=={VERSION}",' in "".join(cell["source"])  # the index first
    before = {p: p.read_bytes() for p in notebooks(course_copy)}
    again = run_tool("--root", str(course_copy))
    assert again.returncode == 0 and "0 notebooks rewritten" in again.stdout
    assert {p: p.read_bytes() for p in notebooks(course_copy)} == before
    assert run_tool("--check", "--root", str(course_copy)).returncode == 0


def test_a_fork_without_a_package_gets_a_cell_that_installs_its_tag(course_copy):
    run = run_tool("someone/their-course", "--install", "git", "--root", str(course_copy))
    assert run.returncode == 0, run.stderr
    assert install_from(course_copy) == "git"
    tomllib.loads((course_copy / "pyproject.toml").read_text())  # still TOML
    for path in notebooks(course_copy):
        (cell,) = install_cells(path)
        text = "".join(cell["source"])
        assert text == bootstrap.install_cell("someone/their-course", "0.1.0", index=False)
        assert "lessonkit[measure]==" not in text
    assert run_tool("--check", "--root", str(course_copy)).returncode == 0


REFUSED = {
    "a branch": ["someone/x", "--ref", "main"],
    "a tag of another version": ["someone/x", "--ref", "v9.9.9"],
    "a tag with a newline": ["someone/x", "--ref", "v0.1.0\n"],
    "an owner with a newline": ["someone\n/x"],
    "a name with a newline": ["someone/x\n"],
    "a name with ..": ["someone/x..y"],
    "a name that is ..": ["someone/.."],
    "a path": ["someone/x/y"],
    "spaces": ["not a repo"],
    "a quote": ['someone/x"y'],
    "a ref with ..": ["someone/x", "--ref", "v0.1.0/../main"],
    "a commit": ["someone/x", "--ref", "3f2a1b9"],
    "a tag without v": ["someone/x", "--ref", "0.1.0"],
    "an unknown source": ["someone/x", "--install", "pypi"],
}


@pytest.mark.parametrize("args", list(REFUSED.values()), ids=list(REFUSED))
def test_set_repository_refuses_all_but_a_plain_name_and_this_versions_tag(course_copy, args):
    before = {p: p.read_bytes() for p in [course_copy / "pyproject.toml", *notebooks(course_copy)]}
    run = run_tool(*args, "--root", str(course_copy))
    assert run.returncode == 2 and "error:" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    after = {p: p.read_bytes() for p in [course_copy / "pyproject.toml", *notebooks(course_copy)]}
    assert after == before  # nothing written


def test_settings_that_were_edited_by_hand_are_checked_too(course_copy):
    path = course_copy / "pyproject.toml"
    path.write_text(path.read_text().replace('release = "v0.1.0"', 'release = "v0.1.0\\n"'))
    run = run_tool("--root", str(course_copy))
    assert run.returncode == 2 and "pyproject.toml [tool.lessonkit]" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


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
# No network: every proxy points at a closed local port, as on Kaggle with Internet off. pip
# reads no configuration, tries once, and ignores the lessonkit installed here (as if absent).
OFFLINE = {
    **dict.fromkeys(
        ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"),
        "http://127.0.0.1:9",
    ),
    "PIP_CONFIG_FILE": os.devnull,
    "PIP_FIND_LINKS": "",
    "PIP_RETRIES": "0",
    "PIP_IGNORE_INSTALLED": "1",
}


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
    """The index does not give the release (offline), and the tag cannot be fetched without
    git (none on PATH): the message quotes pip's last line, about git, and the fix."""
    monkeypatch.setenv("PATH", str(tmp_path))  # the kernel starts from its full path
    _, cell_out, later = run_cell_without_lessonkit(
        "", {"KAGGLE_KERNEL_RUN_TYPE": "Batch"}, monkeypatch
    )
    shown = assert_one_short_message(cell_out, ["On Kaggle:", "git"])
    assert "no Internet connection" not in shown and later == []


# ----- where the cell installs from -------------------------------------------------------------
# A stand-in for `python -m pip install -q REQUIREMENT` that logs what it was asked, fails as the
# test says, and on success makes lessonkit importable again.
FAKE_PYTHON = """#!/bin/sh
echo "$5" >> "{log}"
case "$5" in
  *"=="*) if [ "{index}" != yes ]; then
            echo "ERROR: No matching distribution found for $5" >&2; exit 1; fi ;;
  *) if [ "{tag}" != yes ]; then
       echo "ERROR: Could not find a tag or branch 'v0.1.0'" >&2; exit 1; fi ;;
esac
touch "{installed}"
"""
HIDE_UNTIL_INSTALLED = """
import os, sys
class NotInstalledYet:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "lessonkit" and not os.path.exists({installed!r}):
            raise ModuleNotFoundError(f"No module named {{name!r}}")
sys.meta_path.insert(0, NotInstalledYet())
for name in [m for m in sys.modules if m.split(".")[0] == "lessonkit"]:
    del sys.modules[name]
sys.executable = {python!r}
"""


def run_cell_with_fake_pip(tmp_path: Path, index: bool, tag: bool) -> tuple[list, list[str]]:
    """(the install cell's outputs, the requirements it asked pip for, in order)."""
    import nbclient
    import nbformat

    log, installed, python = tmp_path / "asked", tmp_path / "installed", tmp_path / "python"
    python.write_text(
        FAKE_PYTHON.format(
            log=log, installed=installed, index="yes" if index else "no", tag="yes" if tag else "no"
        )
    )
    python.chmod(0o755)
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                HIDE_UNTIL_INSTALLED.format(installed=str(installed), python=str(python))
            ),
            nbformat.v4.new_code_cell(the_install_cell()),
        ]
    )
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=120, allow_errors=True)
    client.execute()
    asked = log.read_text().splitlines() if log.exists() else []
    return nb.cells[1].outputs, asked


def test_the_cell_installs_the_pinned_release_from_the_package_index(tmp_path):
    repository, ref = one_place()
    outputs, asked = run_cell_with_fake_pip(tmp_path, index=True, tag=True)
    assert asked == [f"lessonkit[measure]=={ref[1:]}"]  # the tag is never fetched
    assert "".join(o.get("text", "") for o in outputs) == (
        f"Installing lessonkit (about a minute)...\nlessonkit {ref[1:]} is installed.\n"
    )
    assert bootstrap.requirements(repository, ref[1:]) == [
        asked[0],
        f"lessonkit[measure] @ git+https://github.com/{repository}@{ref}",
    ]


def test_only_where_the_index_has_not_the_release_the_cell_takes_the_tag(tmp_path):
    repository, ref = one_place()
    outputs, asked = run_cell_with_fake_pip(tmp_path, index=False, tag=True)
    assert asked == bootstrap.requirements(repository, ref[1:])
    assert "".join(o.get("text", "") for o in outputs).endswith(
        f"lessonkit {ref[1:]} is installed.\n"
    )


def test_when_neither_gives_it_the_message_quotes_the_last_try(tmp_path):
    outputs, asked = run_cell_with_fake_pip(tmp_path, index=False, tag=False)
    assert len(asked) == 2
    shown = assert_one_short_message(outputs, ["On your own machine:"])
    assert "(ERROR: Could not find a tag or branch 'v0.1.0')" in shown


def test_the_docs_name_the_release_the_cells_install():
    _, ref = one_place()
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"installs `lessonkit[measure]=={ref[1:]}`, the release the badges name" in readme
    guide = (ROOT / "docs" / "instructor-guide.md").read_text()
    assert f'pip install "lessonkit[grade]=={ref[1:]}"' in guide
