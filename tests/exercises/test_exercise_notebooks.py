"""Exercise and solution notebooks: one source, in sync, and every check reports as it should."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from script_loader import load_script

from lessonkit.exercises.checking import key_points_found, question_ids

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "tools" / "generate_exercises.py"
SECTIONS = (
    "01_vram_equation",
    "02_gpu_selection_matrix",
    "03_choosing_your_environment",
    "04_hardware_decision_flow",
    "05_checking_your_environment",
    "06_summary_and_reflection",
)
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
    "lessonkit"
]
REPO_URL, REF = f"https://github.com/{PYPROJECT['repository']}", PYPROJECT["release"]


def load_generator():
    return load_script("tools/generate_exercises.py")


gen = load_generator()


def run_generator(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GENERATOR), *args], capture_output=True, text=True)


def source(cell: dict) -> str:
    return "".join(cell["source"])


def read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


# ----- one source, in sync ------------------------------------------------------------------
def test_every_section_has_a_solution_and_an_exercise():
    assert sorted(p.stem for p in (ROOT / "solutions").glob("*.ipynb")) == list(SECTIONS)
    assert sorted(p.stem for p in (ROOT / "exercises").glob("*.ipynb")) == list(SECTIONS)
    sections = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if sections:  # the section notebooks carry the same names
        assert sections == list(SECTIONS)


def test_committed_exercises_match_their_solutions():
    result = run_generator("--check")
    assert result.returncode == 0, result.stderr


@pytest.fixture
def copy_of_notebooks(tmp_path: Path) -> tuple[Path, Path]:
    solutions, exercises = tmp_path / "solutions", tmp_path / "exercises"
    shutil.copytree(ROOT / "solutions", solutions)
    shutil.copytree(ROOT / "exercises", exercises)
    return solutions, exercises


def test_check_fails_on_a_hand_edited_exercise(copy_of_notebooks):
    solutions, exercises = copy_of_notebooks
    dirs = ["--solutions", str(solutions), "--exercises", str(exercises)]
    assert run_generator("--check", *dirs).returncode == 0
    target = exercises / "02_gpu_selection_matrix.ipynb"
    target.write_text(target.read_text().replace("answer = ...", "answer = 80", 1))
    result = run_generator("--check", *dirs)
    assert result.returncode == 1
    assert (
        "02_gpu_selection_matrix.ipynb: differs" in result.stderr and "answer = 80" in result.stderr
    )
    assert run_generator(*dirs).returncode == 0  # regenerating repairs it
    assert run_generator("--check", *dirs).returncode == 0


def test_check_fails_on_an_edited_solution_missing_or_extra_exercise(copy_of_notebooks):
    solutions, exercises = copy_of_notebooks
    dirs = ["--solutions", str(solutions), "--exercises", str(exercises)]
    nb = read(solutions / "01_vram_equation.ipynb")
    nb["cells"][0]["source"].append("\nA new sentence.")
    (solutions / "01_vram_equation.ipynb").write_text(json.dumps(nb))
    (exercises / "03_choosing_your_environment.ipynb").unlink()
    shutil.copy(exercises / "04_hardware_decision_flow.ipynb", exercises / "99_stray.ipynb")
    result = run_generator("--check", *dirs)
    assert result.returncode == 1
    for expected in (
        "01_vram_equation.ipynb: differs",
        "03_choosing_your_environment.ipynb: missing",
        "99_stray.ipynb: has no solution notebook",
    ):
        assert expected in result.stderr


def test_generation_is_deterministic(copy_of_notebooks, tmp_path):
    solutions, _ = copy_of_notebooks
    first, second = tmp_path / "first", tmp_path / "second"
    for out in (first, second):
        assert run_generator("--solutions", str(solutions), "--exercises", str(out)).returncode == 0
    for path in first.glob("*.ipynb"):
        assert path.read_bytes() == (second / path.name).read_bytes()
        assert path.read_bytes() == (ROOT / "exercises" / path.name).read_bytes()


# ----- what the generator writes ------------------------------------------------------------
def test_code_regions_become_the_placeholder_that_keeps_the_check_working():
    text = (
        "x = 1\n### BEGIN SOLUTION\nhelper = 2\nanswer = helper * x\n### END SOLUTION\n"
        'check("01.1", answer)'
    )
    assert gen.replace_regions(text, "code", "t") == (
        'x = 1\nanswer = ...  # your answer here\ncheck("01.1", answer)',
        True,
    )
    # Indented like the marker line, as nbgrader does; check() reports such a function as
    # not answered rather than failing.
    nested = "def f():\n    x = 1\n    ### BEGIN SOLUTION\n    y = 2\n    ### END SOLUTION\n    return y\n"
    assert gen.replace_regions(nested, "code", "t") == (
        "def f():\n    x = 1\n    answer = ...  # your answer here\n    return y\n",
        True,
    )
    assert gen.replace_regions("x = 1", "code", "t") == ("x = 1", False)


def test_markdown_regions_become_a_prompt():
    text = "**Why?**\n\n### BEGIN SOLUTION\nBecause of bandwidth.\n### END SOLUTION\n"
    assert gen.replace_regions(text, "markdown", "t") == ("**Why?**\n\n_Your answer here._\n", True)


@pytest.mark.parametrize(
    "text",
    [
        "### BEGIN SOLUTION\nx = 1\n",
        "x = 1\n### END SOLUTION\n",
        "### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n",
    ],
)
def test_unbalanced_markers_are_an_error(text):
    with pytest.raises(gen.GeneratorError, match="SOLUTION"):
        gen.replace_regions(text, "code", "solutions/x.ipynb cell 3")


@pytest.mark.parametrize("name", SECTIONS)
def test_exercise_notebooks_are_clean_and_say_where_they_come_from(name):
    solution = read(ROOT / "solutions" / f"{name}.ipynb")
    exercise = read(ROOT / "exercises" / f"{name}.ipynb")
    # Where it comes from is in the metadata, for the instructor; no cell a student reads says it.
    provenance = exercise["metadata"]["lessonkit"]
    assert provenance["generated_from"] == f"solutions/{name}.ipynb"
    assert provenance["generator"] == "tools/generate_exercises.py"
    assert "generate_exercises" not in json.dumps(exercise["cells"])
    for nb in (solution, exercise):
        for cell in nb["cells"]:
            assert cell.get("outputs", []) == [] and cell.get("execution_count") is None
            # cellView and jupyter hide the install cell (tools/bootstrap.py), and no other.
            # ... and the grading cells, whose code a student does not need to read.
            allowed = {"tags", "nbgrader", "deletable", "editable"}
            grading = (
                cell["metadata"].get("nbgrader", {}).get("grade") and cell["cell_type"] == "code"
            )
            if grading or cell is next(c for c in nb["cells"] if c["cell_type"] == "code"):
                allowed |= {"cellView", "jupyter"}
                assert cell["metadata"].get("jupyter", {}).get("source_hidden") or not grading
            assert set(cell["metadata"]) <= allowed, cell["metadata"]
        assert "widgets" not in nb["metadata"]
    text = json.dumps(exercise)
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    assert "solution-only" not in text and "solution notebook**" not in text
    badges = source(exercise["cells"][0])
    assert (
        f"colab.research.google.com/github/{REPO_URL[19:]}/blob/{REF}/exercises/{name}.ipynb"
        in badges
    )
    assert f"kaggle.com/kernels/welcome?src={REPO_URL}/blob/{REF}/exercises/{name}.ipynb" in badges
    install = next(source(c) for c in exercise["cells"] if c["cell_type"] == "code")
    assert "except ImportError:" in install  # only where missing
    assert f'VERSION = "{REF[1:]}"' in install and f'REPOSITORY = "{REPO_URL[19:]}"' in install
    assert not re.search(r"(torch|numpy|matplotlib)\s*[=<>]=", install)


@pytest.mark.parametrize("name", SECTIONS)
def test_each_notebook_checks_exactly_its_sections_questions(name):
    for folder in ("solutions", "exercises"):
        nb = read(ROOT / folder / f"{name}.ipynb")
        checked = re.findall(
            r'^check\("(\d\d\.\d+)"', "\n".join(source(c) for c in nb["cells"]), re.M
        )
        assert checked == question_ids(name), folder


def test_feedback_titles_match_the_notebook_headings():
    from lessonkit.exercises.expected import bank as _bank

    for name in SECTIONS:
        text = "\n".join(source(c) for c in read(ROOT / "solutions" / f"{name}.ipynb")["cells"])
        headings = dict(re.findall(r"^## (\d\d\.\d+) (.+)$", text, re.M))
        assert list(headings) == question_ids(name), name
        for qid, heading in headings.items():
            assert _bank()[qid]["title"] == heading.strip(), qid


def test_the_breakdown_is_shown_after_the_question_that_asks_for_its_largest_part():
    """01.5 says "decide first": no code before its check may estimate the run (exercise form)."""
    cells = read(ROOT / "exercises" / "01_vram_equation.ipynb")["cells"]
    code = [source(c) for c in cells if c["cell_type"] == "code"]
    at = next(i for i, text in enumerate(code) if 'check("01.5"' in text)
    assert not [text for text in code[:at] if "estimate(" in text]
    assert any("estimate(" in text for text in code[at + 1 :])


# ----- running them -------------------------------------------------------------------------
def check_outputs(nb) -> list[tuple[str, str, str]]:
    """(question id, status, text) of every check shown, in order."""
    found = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            html = output.get("data", {}).get("text/html", "")
            match = re.search(r"data-question='([^']+)' data-status='([^']+)'", html)
            if match:
                found.append((match.group(1), match.group(2), output["data"]["text/plain"]))
    return found


def errors(nb) -> list[str]:
    return [
        f"{o.ename}: {o.evalue}"
        for c in nb.cells
        for o in c.get("outputs", [])
        if o.output_type == "error"
    ]


@pytest.mark.notebooks
@pytest.mark.parametrize("name", SECTIONS)
def test_solution_notebook_passes_all_its_checks(name, tmp_path):
    import nbformat
    import papermill

    out = tmp_path / f"{name}.ipynb"
    papermill.execute_notebook(
        str(ROOT / "solutions" / f"{name}.ipynb"),
        str(out),
        kernel_name="python3",
        cwd=str(ROOT),
        progress_bar=False,
        log_output=False,
    )
    shown = check_outputs(nbformat.read(out, as_version=4))
    assert [qid for qid, _, _ in shown] == question_ids(name)  # each shown once
    for qid, status, text in shown:
        if status == "self-check":
            assert "(not mentioned)" not in text, (
                f"{qid}: the model answer misses a key point\n{text}"
            )
        else:
            assert status == "correct", text


@pytest.mark.notebooks
@pytest.mark.parametrize("name", SECTIONS)
def test_exercise_notebook_runs_and_reports_not_answered(name, tmp_path):
    import nbclient
    import nbformat

    nb = nbformat.read(ROOT / "exercises" / f"{name}.ipynb", as_version=4)
    nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    assert errors(nb) == []
    shown = check_outputs(nb)
    assert [qid for qid, _, _ in shown] == question_ids(name)
    assert {status for _, status, _ in shown} == {"not answered"}


def model_answers() -> list[tuple[str, str]]:
    """(question id, code of the solution region) of each free-text model answer."""
    found = []
    for name in SECTIONS:
        for cell in read(ROOT / "solutions" / f"{name}.ipynb")["cells"]:
            match = re.search(
                r'### BEGIN SOLUTION\n(.*?answer = f?""".*?""")\n### END SOLUTION\n'
                r'check\("([\d.]+)"',
                source(cell),
                re.S,
            )
            if match:
                found.append((match.group(2), match.group(1)))
    return found


def test_model_answers_in_the_solutions_cover_their_key_points():
    """The same as the notebook run checks, without a kernel: each model answer string."""
    import lessonkit

    answers = model_answers()
    assert {qid for qid, _ in answers} >= {"01.6", "02.6", "06.3", "06.5"}
    for qid, code in answers:
        namespace = {"lessonkit": lessonkit}
        exec(code, namespace)  # figures in an answer are computed by lessonkit (f-strings)
        found, total = key_points_found(qid, namespace["answer"])
        assert found == total, qid


def test_written_answers_in_the_solutions_type_no_figures_that_lessonkit_computes():
    """Model answers quote the calculator and the catalogs through f-strings; the prose keeps
    only definitions (bytes per parameter) and the names of cards."""
    allowed = re.compile(r"\d+ bytes per param|80 GB (card|A100)")
    figure = re.compile(r"~?\d[\d.,]*\s*(?:GB|GiB|MB|TB|x\b|times\b|%)")
    for name in SECTIONS:
        for cell in read(ROOT / "solutions" / f"{name}.ipynb")["cells"]:
            for region in re.findall(
                r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", source(cell), re.S
            ):
                texts = (
                    [region]
                    if cell["cell_type"] == "markdown"
                    else re.findall(r'answer = f?"""(.*?)"""', region, re.S)
                )
                for text in texts:
                    text = allowed.sub("", re.sub(r"\{[^{}]*\}", "{}", text))
                    assert not figure.search(text), (name, figure.search(text).group(0), text)
