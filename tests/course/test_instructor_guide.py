"""docs/instructor-guide.md: every notebook planned, data-driven parts in step, commands real."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lessonkit.exercises.checking import question_ids
from lessonkit.exercises.expected import bank as _bank

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "instructor-guide.md"
TOOL = ROOT / "tools" / "instructor_guide.py"
SECTIONS = (
    "01_vram_equation",
    "02_gpu_selection_matrix",
    "03_choosing_your_environment",
    "04_hardware_decision_flow",
    "05_checking_your_environment",
    "06_summary_and_reflection",
)
PARTS = (
    "**Objectives.**",
    "**Timing.**",
    "**Live demo",
    "**Discussion prompts.**",
    "**Common mistakes**",
    "**Grading.**",
)
EXPLORERS = {
    "01": "VRAM explorer",
    "02": "GPU matrix explorer",
    "03": "environment explorer",
    "04": "decision-flow explorer",
}


def sections() -> dict[str, str]:
    """Notebook number -> the text of its section of the guide."""
    text = GUIDE.read_text(encoding="utf-8")
    parts = re.split(r"^## ", text, flags=re.M)
    found = {}
    for part in parts:
        match = re.match(r"Notebook (\d): .*?\((\d+) minutes\)", part)
        if match:
            found[f"0{match.group(1)}"] = part
    return found


def test_the_guide_is_in_step_with_the_exercise_data():
    result = subprocess.run([sys.executable, str(TOOL), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_check_fails_when_the_data_moves(tmp_path, monkeypatch):
    from script_loader import load_script

    tool = load_script("tools/instructor_guide.py")
    text = GUIDE.read_text(encoding="utf-8")
    edited = text.replace("That is 4 bytes per parameter: fp32, not 16-bit.", "Something else.")
    assert edited != text and tool.render(edited) == text


def test_every_notebook_has_a_plan():
    found = sections()
    assert sorted(found) == [s[:2] for s in SECTIONS]
    minutes = 0
    for number, text in found.items():
        for part in PARTS:
            assert part in text, (number, part)
        minutes += int(re.search(r"\((\d+) minutes\)", text).group(1))
        objectives = text.split("**Objectives.**")[1].split("**Timing.**")[0]
        assert len(re.findall(r"^- ", objectives, re.M)) >= 3, number
        timing = text.split("**Timing.**")[1].split("**Live demo")[0]
        planned = sum(int(m) for m in re.findall(r"(\d+) min\b", timing))
        assert planned == int(re.search(r"\((\d+) minutes\)", text).group(1)), number
        if number in EXPLORERS:
            demo = text.split("**Live demo")[1].split("**Discussion")[0]
            assert EXPLORERS[number] in text and "**Reset**" in demo, number
    hours = re.search(r"about (\d+) hours? (\d+) minutes", GUIDE.read_text(encoding="utf-8"))
    assert minutes == int(hours.group(1)) * 60 + int(hours.group(2))


@pytest.mark.parametrize("section", SECTIONS)
def test_points_in_the_guide_match_the_solution_notebooks(section):
    cells = json.loads((ROOT / "solutions" / f"{section}.ipynb").read_text())["cells"]
    graded = sum(
        c["metadata"]["nbgrader"]["points"]
        for c in cells
        if c["metadata"].get("nbgrader", {}).get("grade")
    )
    block = sections()[section[:2]].split("<!-- points:")[1]
    assert f"= {graded}." in block
    assert graded == sum(_bank()[q]["points"] for q in question_ids(section))


def test_every_recorded_mistake_is_in_its_notebooks_section():
    found = sections()
    for qid, question in _bank().items():
        for mistake in question.get("mistakes", []):
            assert mistake["hint"] in found[qid[:2]], qid


def test_the_documented_commands_exist():
    text = GUIDE.read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in re.findall(r"`make (\w+)", text):
        assert re.search(rf"^{target}:", makefile, re.M), target
    assert (ROOT / "nbgrader_config.py").exists() and "tools/present.py" in text
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/instructor-guide.md" in readme
