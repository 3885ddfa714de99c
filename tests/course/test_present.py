"""Presenter mode: slide metadata in step, slides built by nbconvert, Voilà dashboards that run.

The Voilà dashboard in a real browser (a slider moved, then Reset) is in test_browser.py.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "present.py"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
WITH_EXPLORERS = ("01", "02", "03", "04")


def load_tool():
    return load_script("tools/present.py")


present = load_tool()
bootstrap = load_script("tools/bootstrap.py")


def run_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=600
    )


# ----- slide metadata -----------------------------------------------------------------------
def test_committed_notebooks_carry_the_slide_metadata():
    result = run_tool("mark", "--check")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_slides_follow_the_headings(path):
    cells = nbformat.read(path, as_version=4).cells
    types = [c.metadata["slideshow"]["slide_type"] for c in cells]
    assert types[0] == "slide"
    for cell, kind in zip(cells, types, strict=True):
        first = cell.source.lstrip().splitlines()[0] if cell.source.strip() else ""
        if cell.cell_type == "markdown" and first.startswith("## ") and first != "## Settings":
            assert kind == "slide", first
        if bootstrap.is_install_cell(cell) or "parameters" in cell.metadata.get("tags", []):
            assert kind == "skip"
        if cell.cell_type == "code" and present.EXPLORER_CALL.search(cell.source):
            assert kind != "skip"  # an explorer is shown on its slide
    assert types.count("slide") >= 3
    first_section = next(
        i
        for i, c in enumerate(cells)
        if i
        and c.cell_type == "markdown"
        and c.source.startswith("## ")
        and not c.source.startswith("## Settings")
    )
    assert set(types[1:first_section]) == {"skip"}  # install, settings, imports: set-up


def test_mark_finds_a_notebook_out_of_step_and_is_idempotent(tmp_path):
    target = tmp_path / NOTEBOOKS[0].name
    shutil.copy(NOTEBOOKS[0], target)
    nb = nbformat.read(target, as_version=4)
    nb.cells.insert(5, nbformat.v4.new_markdown_cell("## A section added by another branch"))
    nbformat.write(nb, target)
    assert run_tool("mark", "--check", str(target)).returncode == 1
    assert run_tool("mark", str(target)).returncode == 0
    first = target.read_bytes()
    assert run_tool("mark", "--check", str(target)).returncode == 0
    assert run_tool("mark", str(target)).returncode == 0 and target.read_bytes() == first
    new = nbformat.read(target, as_version=4).cells[5]
    assert new.metadata["slideshow"] == {"slide_type": "slide"}


def test_strip_keeps_the_slide_metadata():
    strip = load_script("tools/strip_notebooks.py")
    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    assert [c.metadata.get("slideshow") for c in strip.strip(nb).cells] == [
        c.metadata.get("slideshow") for c in nb.cells
    ]


# ----- slides -------------------------------------------------------------------------------
def _sections(html: str) -> int:
    return len(re.findall(r"<section\b", html))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_nbconvert_builds_slides_of_every_notebook(path, tmp_path):
    out = present.build_slides(path, tmp_path, execute=False)
    html = out.read_text(encoding="utf-8")
    assert "reveal" in html.lower()
    kinds = [c.metadata["slideshow"]["slide_type"] for c in nbformat.read(path, as_version=4).cells]
    # One <section> per slide, plus one per sub-slide inside it (reveal.js's vertical stack).
    assert _sections(html) >= kinds.count("slide") + kinds.count("subslide")
    assert "Installing lessonkit" not in html and "@title" not in html  # skipped: set-up


@pytest.mark.notebooks
def test_the_slides_command_runs_the_notebook_and_shows_its_charts(tmp_path):
    out = present.build_slides(present.find_notebook("04"), tmp_path)
    html = out.read_text(encoding="utf-8")
    assert html.count("data:image/png") >= 2  # the flow chart and the explorer's picture
    assert "Traceback" not in html


def test_unknown_notebooks_are_clear_errors():
    result = run_tool("slides", "9")
    assert result.returncode == 2 and "choose one of 01, 02, 03, 04, 05, 06" in result.stderr
    result = run_tool("voila", "05", "--print-only")
    assert result.returncode == 2 and "has no explorers" in result.stderr
    assert present.find_notebook("1") == present.find_notebook("01_vram_equation")


# ----- Voilà dashboards ---------------------------------------------------------------------
@pytest.mark.parametrize("number", WITH_EXPLORERS)
def test_dashboards_hold_the_settings_and_the_explorers(number, tmp_path):
    path = present.write_dashboard(present.find_notebook(number), tmp_path)
    nb = nbformat.read(path, as_version=4)
    source = present.find_notebook(number)
    explorers = [
        c.source
        for c in nbformat.read(source, as_version=4).cells
        if c.cell_type == "code" and present.EXPLORER_CALL.search(c.source)
    ]
    assert [c.source for c in nb.cells if present.EXPLORER_CALL.search(c.source)] == explorers
    # Voilà runs every cell it shows: the install cell must not be one of them.
    assert not any(bootstrap.is_install_cell(c) for c in nb.cells)
    assert not any("Installing lessonkit" in c.source for c in nb.cells)
    assert nb.cells[0].source.endswith(": explorers")


@pytest.mark.notebooks
@pytest.mark.parametrize("number", WITH_EXPLORERS)
def test_dashboards_run_and_show_live_explorers(number, tmp_path):
    import nbclient

    path = present.write_dashboard(present.find_notebook(number), tmp_path)
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    views = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(views) == sum(bool(present.EXPLORER_CALL.search(c.source)) for c in nb.cells)


def test_the_voila_command_serves_the_dashboard(tmp_path, monkeypatch, capsys):
    write = present.write_dashboard
    monkeypatch.setattr(present, "write_dashboard", lambda path: write(path, tmp_path))
    assert present.main(["voila", "01", "--print-only", "--port", "8899", "--no-browser"]) == 0
    command = capsys.readouterr().out.strip().split()
    assert command[1:3] == ["-m", "voila"]
    assert command[3] == str(tmp_path / "01_vram_equation.ipynb")
    assert (tmp_path / "01_vram_equation.ipynb").is_file()
    assert present.DASHBOARDS == ROOT / "artifacts" / "presenter"  # where `make voila` writes
    assert "--port=8899" in command and "--no-browser" in command
    assert importlib.util.find_spec("voila") is not None


def test_jupyterlab_rise_is_installed_and_enabled():
    result = subprocess.run(
        [sys.executable, "-m", "jupyter", "labextension", "list"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    listing = result.stdout + result.stderr
    line = next((entry for entry in listing.splitlines() if "jupyterlab-rise" in entry), "")
    assert "enabled" in line and "OK" in line, listing
