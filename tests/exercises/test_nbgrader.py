"""The real nbgrader on the course: generate, release and autograde with the kit's settings.

The solutions are nbgrader source notebooks; ``nbgrader generate_assignment`` (default
enforcement: a solution region outside a solution cell is an error) must release exactly the
notebooks in exercises/, and ``nbgrader autograde`` must give each checked question its points for
a right answer and nothing for a wrong or blank one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lessonkit.exercises.checking import answer_key, question_ids
from lessonkit.exercises.expected import bank as _bank

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = (
    "01_vram_equation",
    "02_gpu_selection_matrix",
    "03_choosing_your_environment",
    "04_hardware_decision_flow",
    "05_checking_your_environment",
    "06_summary_and_reflection",
)
ASSIGNMENT = "gpu-survival-guide"
COURSE_ID = "gsg-course"
BIN = Path(sys.executable).parent  # nbgrader calls `alembic` from PATH
GRADE_ID = re.compile(r"^[a-zA-Z0-9_\-]*$")

if os.environ.get("CI"):  # CI installs the dev extra: nbgrader must be there
    import nbgrader
else:
    nbgrader = pytest.importorskip("nbgrader", reason="pip install -e '.[grade]'")


def read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def meta(cell: dict) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def run_nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        JUPYTER_CONFIG_DIR=str(course / ".jupyter"),
        MPLBACKEND="Agg",
    )
    result = subprocess.run(
        # the interpreter running the tests, so that its lessonkit is the one graded (a console
        # script may belong to another environment)
        [sys.executable, "-m", "nbgrader", *args],
        cwd=course,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{result.stderr[-4000:]}"
    return result


# ----- the source notebooks, without running nbgrader ----------------------------------------
@pytest.mark.parametrize("name", SECTIONS)
def test_solutions_carry_nbgrader_cells_for_every_question(name):
    cells = read(ROOT / "solutions" / f"{name}.ipynb")["cells"]
    text = "\n".join(source(c) for c in cells)
    ids = [meta(c)["grade_id"] for c in cells if meta(c)]
    assert all(GRADE_ID.match(i) for i in ids) and len(ids) == len(set(ids))
    for cell in cells:
        has_marker = "BEGIN SOLUTION" in source(cell) or "END SOLUTION" in source(cell)
        # Markers only inside solution cells (no prose that nbgrader would take for one).
        assert has_marker == bool(meta(cell).get("solution")), (name, cell["id"])
    for qid in question_ids(name):
        question = _bank()[qid]
        at = next(i for i, c in enumerate(cells) if f'check("{qid}"' in source(c))
        assert meta(cells[at])["solution"] is True and meta(cells[at])["grade"] is False
        if question["kind"] == "text":  # the explanation above it is graded by hand
            explain = cells[at - 1]
            assert explain["cell_type"] == "markdown" and meta(explain)["grade"] is True
            assert meta(explain)["points"] == question["points"]
            continue
        test = cells[at + 1]
        assert meta(test) == {
            "grade": True,
            "grade_id": test["id"],
            "locked": True,
            "points": question["points"],
            "schema_version": 3,
            "solution": False,
            "task": False,
        }, qid
        assert f'autograde("{qid}", ' in source(test)
    assert "BEGIN SOLUTION" not in text.replace("### BEGIN SOLUTION\n", "")


def test_the_config_uses_the_generators_stubs():
    gen = _generator()
    config = (ROOT / "nbgrader_config.py").read_text(encoding="utf-8")
    assert f'c.ClearSolutions.code_stub = {{"python": "{gen.CODE_STUB}"}}' in config
    assert f'c.ClearSolutions.text_stub = "{gen.TEXT_STUB}"' in config
    assert "NotImplementedError" not in gen.CODE_STUB


def _generator():
    from script_loader import load_script

    return load_script("tools/generate_exercises.py")


def test_the_generator_refuses_what_nbgrader_refuses(tmp_path):
    gen = _generator()
    nb = read(ROOT / "solutions" / "01_vram_equation.ipynb")
    answer = next(c for c in nb["cells"] if c["id"] == "q01-1-answer")
    answer["metadata"].pop("nbgrader")  # a region in a cell that is not a solution cell
    with pytest.raises(gen.GeneratorError, match="without nbgrader solution metadata"):
        gen.make_exercise(nb, "01_vram_equation.ipynb")
    nb = read(ROOT / "solutions" / "01_vram_equation.ipynb")
    next(c for c in nb["cells"] if c["id"] == "q01-1-test")["metadata"]["nbgrader"]["grade_id"] = (
        "01.1"
    )
    with pytest.raises(gen.GeneratorError, match="nbgrader's rule"):
        gen.make_exercise(nb, "01_vram_equation.ipynb")


# ----- the real nbgrader ---------------------------------------------------------------------
def _answer_cells(solution: dict) -> dict[str, str]:
    """grade id -> source of each solution cell of a solution notebook."""
    return {meta(c)["grade_id"]: source(c) for c in solution["cells"] if meta(c).get("solution")}


def _wrong(qid: str) -> str:
    """Code giving a wrong answer of the right kind to question ``qid``."""
    question = _bank()[qid]
    kind = question["kind"]
    if kind == "number":
        return f"answer = {float(answer_key(qid)) * 1.5 + 1!r}"
    if kind == "table":
        return f"answer = {{row: value * 1.5 for row, value in {answer_key(qid)!r}.items()}}"
    if kind in ("choice", "multi"):
        expected = answer_key(qid)
        accepted = {expected} if isinstance(expected, str) else set(expected)
        source_ = question.get("options_from")
        names = (
            {
                "gpus": ["T4", "H100 SXM"],
                "environments": ["aws-sagemaker", "lambda"],
                "models": ["gpt2", "qwen2.5-0.5b"],
                "categories": ["weights", "activations"],
                "methods": ["full"],
            }[source_]
            if source_
            else [o["name"] if isinstance(o, dict) else o for o in question["options"]]
        )
        from lessonkit.exercises.expected import CATALOGS as _CATALOGS

        wrong = [n for n in names if (_CATALOGS[source_](n) if source_ else n) not in accepted]
        return f"answer = {wrong[0]!r}" if kind == "choice" else f"answer = {wrong[:1]!r}"
    raise AssertionError(kind)


def _student_copy(release: dict, solution: dict, plan: dict[str, str]) -> dict:
    """A released notebook answered per ``plan`` (question id -> right, wrong or blank)."""
    right = _answer_cells(solution)
    nb = json.loads(json.dumps(release))
    for index, cell in enumerate(nb["cells"]):
        if not meta(cell).get("solution"):
            continue
        if cell["cell_type"] == "markdown":  # a written explanation, graded by hand
            following = source(nb["cells"][index + 1])
            qid = re.search(r'check\("(\d\d\.\d+)"', following).group(1)
            if plan.get(qid) == "right":
                cell["source"] = right[meta(cell)["grade_id"]]
            continue
        qid = re.search(r'check\("(\d\d\.\d+)"', source(cell)).group(1)
        how = plan.get(qid, "blank")
        if how == "right":
            cell["source"] = right[meta(cell)["grade_id"]]
        elif how == "wrong":
            if _bank()[qid]["kind"] == "function":  # the guide's own broken line
                cell["source"] = source(cell).replace(
                    "answer = ...  # your answer here",
                    "vram_total = torch.cuda.get_total_memory(0) / (1024**3)",
                )
            elif _bank()[qid]["kind"] != "text":
                cell["source"] = source(cell).replace(
                    "answer = ...  # your answer here", _wrong(qid)
                )
    return nb


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """A course directory with the kit's config, the solutions as source, generated and released."""
    course = tmp_path_factory.mktemp("course")
    exchange = course / "exchange"
    exchange.mkdir()
    config = (ROOT / "nbgrader_config.py").read_text(encoding="utf-8")
    config += (
        f"\nc.CourseDirectory.root = {str(course)!r}\nc.CourseDirectory.course_id = "
        f"{COURSE_ID!r}\nc.Exchange.root = {str(exchange)!r}\n"
        "c.ExecutePreprocessor.timeout = 300\n"
    )
    (course / "nbgrader_config.py").write_text(config, encoding="utf-8")
    (course / "source" / ASSIGNMENT).mkdir(parents=True)
    for name in SECTIONS:
        shutil.copy(ROOT / "solutions" / f"{name}.ipynb", course / "source" / ASSIGNMENT)
    run_nbgrader(course, "generate_assignment", ASSIGNMENT, "--force")
    run_nbgrader(course, "release_assignment", ASSIGNMENT, "--force")
    return course


def _comparable(nb: dict) -> list[tuple]:
    cells = []
    for cell in nb["cells"]:
        metadata = json.loads(json.dumps(cell.get("metadata", {})))
        for key in ("checksum", "cell_type"):  # added by nbgrader's ComputeChecksums
            metadata.get("nbgrader", {}).pop(key, None)
        cells.append((cell["cell_type"], cell.get("id"), source(cell), metadata))
    return cells


@pytest.mark.notebooks
def test_nbgrader_releases_exactly_the_exercises(course):
    released = sorted((course / "release" / ASSIGNMENT).glob("*.ipynb"))
    assert [p.stem for p in released] == list(SECTIONS)
    outbound = course / "exchange" / COURSE_ID / "outbound" / ASSIGNMENT
    assert sorted(p.stem for p in outbound.glob("*.ipynb")) == list(SECTIONS)
    for path in released:
        exercise = read(ROOT / "exercises" / path.name)
        assert _comparable(read(path)) == _comparable(exercise), path.name
        assert (outbound / path.name).read_bytes() == path.read_bytes()
        assert "solutions/" not in json.dumps(read(path))


def _plan(qids: list[str]) -> dict[str, str]:
    """Right, wrong and blank in turn over a notebook's checked questions."""
    return {qid: ("right", "wrong", "blank")[i % 3] for i, qid in enumerate(qids)}


@pytest.mark.notebooks
@pytest.mark.slow
def test_autograding_gives_each_question_its_points(course):
    from nbgrader.api import Gradebook

    students = {"all-right": lambda qids: dict.fromkeys(qids, "right"), "mixed": _plan}
    expected: dict[tuple[str, str], tuple[float, float]] = {}
    for student, plan_for in students.items():
        folder = course / "submitted" / student / ASSIGNMENT
        folder.mkdir(parents=True)
        for name in SECTIONS:
            qids = [q for q in question_ids(name) if _bank()[q]["kind"] != "text"]
            plan = plan_for(question_ids(name) if student == "all-right" else qids)
            release = read(course / "release" / ASSIGNMENT / f"{name}.ipynb")
            solution = read(ROOT / "solutions" / f"{name}.ipynb")
            (folder / f"{name}.ipynb").write_text(
                json.dumps(_student_copy(release, solution, plan)), encoding="utf-8"
            )
            auto = sum(_bank()[q]["points"] for q in qids if plan[q] == "right")
            total = sum(_bank()[q]["points"] for q in question_ids(name))
            expected[student, name] = (auto, total)
        run_nbgrader(course, "autograde", ASSIGNMENT, "--student", student, "--force")

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for (student, name), (auto, total) in expected.items():
            notebook = gradebook.find_submission_notebook(name, ASSIGNMENT, student)
            assert notebook.max_score == total, (student, name)
            assert notebook.score == auto, (student, name, notebook.score, auto)
            graded = {g.name: g.score for g in notebook.grades if g.auto_score is not None}
            for qid in question_ids(name):
                test_id = "q" + qid.replace(".", "-") + "-test"
                if test_id in graded and student == "mixed":
                    right = (
                        _plan([q for q in question_ids(name) if _bank()[q]["kind"] != "text"])[qid]
                        == "right"
                    )
                    assert graded[test_id] == (_bank()[qid]["points"] if right else 0), qid
            # Written explanations: a blank one scores 0 at once, a written one waits for a person.
            manual = [g for g in notebook.grades if g.cell.cell_type == "markdown"]
            reflections = [q for q in question_ids(name) if _bank()[q]["kind"] == "text"]
            assert len(manual) == len(reflections)
            for grade in manual:
                if student == "all-right":
                    assert grade.needs_manual_grade and grade.auto_score is None
                else:
                    assert grade.auto_score == 0 and not grade.needs_manual_grade


# The 05.1 answer of a student who tries to grade themselves: the function that check runs
# rewrites the checker (every result correct, its own expected answers, its number checker),
# and every other answer of the notebook is wrong.
TAMPERING_ANSWER = """import torch


def check_gpu_health():
    import lessonkit.exercises.check_result as check_result
    import lessonkit.exercises.checking as checking
    import lessonkit.exercises.expected as expected

    check_result.CheckResult.correct = property(lambda self: True)
    for qid in list(expected.EXPECTED):
        expected.EXPECTED[qid] = lambda: 0
    checking._CHECKERS["number"] = lambda qid, question, answer: check_result.CheckResult(
        qid, "", "correct", "Correct."
    )
    print("Total VRAM: 15.84 GB")


check("05.1", check_gpu_health)
"""


@pytest.mark.notebooks
@pytest.mark.slow
def test_a_submission_that_tampers_with_the_checker_gets_no_points(course):
    from nbgrader.api import Gradebook

    student, name = "tamperer", "05_checking_your_environment"
    release = read(course / "release" / ASSIGNMENT / f"{name}.ipynb")
    solution = read(ROOT / "solutions" / f"{name}.ipynb")
    nb = _student_copy(release, solution, dict.fromkeys(question_ids(name), "wrong"))
    answer = next(c for c in nb["cells"] if meta(c).get("grade_id") == "q05-1-answer")
    answer["source"] = TAMPERING_ANSWER
    folder = course / "submitted" / student / ASSIGNMENT
    folder.mkdir(parents=True)
    (folder / f"{name}.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    run_nbgrader(course, "autograde", ASSIGNMENT, "--student", student, "--force")

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        notebook = gradebook.find_submission_notebook(name, ASSIGNMENT, student)
        graded = {g.name: g.score for g in notebook.grades if g.auto_score is not None}
        assert len(graded) == len(question_ids(name)), graded  # every test cell ran
        assert notebook.score == 0, graded
