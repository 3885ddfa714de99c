"""The tools' arguments, fuzzed: whatever text they get, tools/set_repository.py, present.py and
generate_exercises.py either do what was asked or end with one line naming what is wrong and
what is allowed (exit status 2), never a traceback; and what set_repository accepts always
writes valid TOML and install cells that are valid Python naming exactly that repository."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import tomllib
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[2]
set_repository = load_script("tools/set_repository.py")
bootstrap = load_script("tools/bootstrap.py")
present = load_script("tools/present.py")
generate_exercises = load_script("tools/generate_exercises.py")

FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# Text that looks like what the tools take, with the characters that once broke them.
NEAR = st.text(alphabet="abcvV0123456789./-_ \n\t\"'\\$`{}#@:;~^?*[]\x00é", max_size=40)
ANY = st.one_of(st.text(max_size=60), NEAR)
SAFE_VALUE = re.compile(r"[A-Za-z0-9._/-]+")  # nothing to escape in TOML, Python or a URL


def outcome(function, *args):
    """(what ``function(*args)`` returned, None) or (None, the exception it raised)."""
    try:
        return function(*args), None
    except Exception as err:
        return None, err


# ----- set_repository: the checks --------------------------------------------------------------
@FUZZ
@given(repository=ANY)
@example("someone/course\n")  # once accepted: it wrote invalid TOML
@example("someone/..")
@example("someone/a..b")
def test_a_repository_is_a_plain_owner_and_name_or_refused(repository):
    accepted, err = outcome(set_repository.check_repository, repository)
    if err is not None:
        assert type(err) is set_repository.SettingError
        assert "OWNER/NAME" in str(err) and len(str(err)) < 400
        return
    assert accepted == repository and SAFE_VALUE.fullmatch(repository)
    owner, name = repository.split("/")
    assert ".." not in repository and name not in (".", "") and owner
    cell = bootstrap.install_cell(repository, "0.1.0")
    compile(cell, "install cell", "exec")
    assert re.findall(r'^REPOSITORY = "(.*)"$', cell, re.M) == [repository]
    assert max(map(len, cell.splitlines())) <= 100  # ruff's line length


@FUZZ
@given(tag=ANY)
@example("v0.1.0\n")  # once accepted: every install cell became a SyntaxError
@example("main")
def test_a_tag_is_v_and_this_version_or_refused(tag):
    accepted, err = outcome(set_repository.check_tag, tag, "0.1.0")
    if err is not None:
        assert type(err) is set_repository.SettingError
        assert "tag" in str(err) and len(str(err)) < 400
        return
    assert accepted == tag == "v0.1.0"


@FUZZ
@given(version=st.from_regex(set_repository.TAG, fullmatch=True))
def test_every_accepted_tag_makes_a_cell_that_is_python(version):
    tag = version  # the pattern includes the leading v
    number = set_repository.TAG.fullmatch(tag).group("version")
    assert set_repository.check_tag(tag, number) == tag
    cell = bootstrap.install_cell("someone/course", number)
    compile(cell, "install cell", "exec")
    assert f'VERSION = "{number}"' in cell and "\n" not in number


# ----- set_repository: the command, on a copy of the course -----------------------------------
@pytest.fixture(scope="module")
def course_copy(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("course")
    for folder in ("notebooks", "exercises", "solutions"):
        shutil.copytree(ROOT / folder, root / folder)
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


ARGUMENT = st.one_of(
    ANY, st.sampled_from(["--ref", "--install", "--check", "git", "index", "v0.1.0", "-h"])
)


@settings(FUZZ, max_examples=120)
@given(argv=st.lists(ARGUMENT, max_size=4))
def test_set_repository_takes_any_arguments_without_a_traceback(course_copy, argv, capsys):
    before = (course_copy / "pyproject.toml").read_text()
    try:
        status = set_repository.main([*argv, "--root", str(course_copy)])
    except SystemExit as done:  # argparse: --help (0) or a refusal (2), with its one line
        status = done.code
    if status not in (0, 1):
        assert status == 2 and "error:" in capsys.readouterr().err
        assert (course_copy / "pyproject.toml").read_text() == before
        return
    assert status in (0, 1)
    settings_now = tomllib.loads((course_copy / "pyproject.toml").read_text())["tool"]["lessonkit"]
    set_repository.check_repository(settings_now["repository"])
    assert settings_now["release"] == "v0.1.0" and settings_now["install"] in ("index", "git")
    (course_copy / "pyproject.toml").write_text(before)  # the next example starts from the same


# ----- present and generate_exercises ---------------------------------------------------------
@FUZZ
@given(number=ANY)
@example("²")  # a digit that int() refuses
def test_present_finds_a_notebook_or_lists_the_choices(number):
    path, err = outcome(present.find_notebook, number)
    if err is not None:
        assert type(err) is present.PresentError
        assert "choose one of 01, 02, 03, 04, 05, 06" in str(err)
        return
    assert path.parent == present.NOTEBOOKS


@settings(FUZZ, max_examples=60)
@given(names=st.lists(ANY, min_size=1, max_size=3))
def test_present_mark_refuses_what_is_not_a_notebook(names, tmp_path, capsys):
    paths = [str(tmp_path / name.replace("\x00", "")) for name in names]
    status = present.main(["mark", "--check", *paths])
    assert status in (0, 1, 2)
    if status == 2:
        err = capsys.readouterr().err
        assert err.startswith("present: error: ") and err.count("\n") == 1


def test_present_mark_names_a_file_it_cannot_read(tmp_path, capsys):
    (tmp_path / "notes.ipynb").write_text("not json")
    assert present.main(["mark", "--check", str(tmp_path / "missing.ipynb")]) == 2
    assert "Cannot read" in capsys.readouterr().err
    assert present.main(["mark", "--check", str(tmp_path / "notes.ipynb")]) == 2
    assert "as a notebook" in capsys.readouterr().err


@settings(FUZZ, max_examples=60)
@given(folder=ANY)
def test_generate_exercises_refuses_a_folder_without_notebooks(folder, tmp_path, capsys):
    solutions = tmp_path / "in" / folder.replace("\x00", "").lstrip("/")
    status = generate_exercises.main(
        ["--check", "--solutions", str(solutions), "--exercises", str(tmp_path / "out")]
    )
    assert status == 2
    assert capsys.readouterr().err.startswith("generate_exercises: error: ")
