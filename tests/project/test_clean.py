"""`make clean` leaves the tree as a clone has it: in a fresh clone littered with one example of
every path .gitignore names (and of what the tools and tests make), `make clean` leaves
`git status --ignored` empty."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    shutil.which("make") is None or shutil.which("git") is None or os.name != "posix",
    reason="needs make and git",
)
# What a run of the course, the tests and the tools leaves, beyond the patterns' own examples.
LITTER = [
    "artifacts/screenshots/01_vram_equation.png",
    "artifacts/slides/01_vram_equation.slides.html",
    "artifacts/presenter/01_vram_equation.ipynb",
    "artifacts/gpu/results.md",
    ".hypothesis/constants/0a1b2c",
    ".hypothesis/examples/x/y",
    "lessonkit/__pycache__/units.cpython-311.pyc",
    "lessonkit/planning/__pycache__/oom.cpython-311.pyc",
    "tests/memory/__pycache__/test_vram.cpython-311-pytest-8.pyc",
    "notebooks/.ipynb_checkpoints/01_vram_equation-checkpoint.ipynb",
    ".pytest_cache/v/cache/lastfailed",
    ".mypy_cache/3.11/lessonkit/units.meta.json",
    ".ruff_cache/0.17.6/123",
    "build/lib/lessonkit/__init__.py",
    "build/bdist.linux-x86_64/wheel/x",
    "dist/lessonkit-0.1.0-py3-none-any.whl",
    "lessonkit.egg-info/PKG-INFO",
    ".venv/bin/python",
    ".venv-colab/bin/python",
    ".venv-oldest/bin/python",
    ".whl/lessonkit-0.1.0-py3-none-any.whl",
]


def example_of(pattern: str) -> str:
    """A path that the .gitignore pattern matches."""
    name = pattern.strip("/").replace("*", "lessonkit")
    return f"{name}/x" if pattern.endswith("/") else name


def git(*args: str, cwd: Path) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_make_clean_leaves_the_tree_as_a_clone_has_it(tmp_path):
    clone = tmp_path / "clone"
    git("clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone), cwd=tmp_path)
    # the working tree's Makefile and .gitignore, committed or not
    for name in ("Makefile", ".gitignore"):
        shutil.copy(ROOT / name, clone / name)
    git(
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "commit",
        "-qam",
        "tree",
        "--allow-empty",
        cwd=clone,
    )
    patterns = [
        line.strip()
        for line in (clone / ".gitignore").read_text().splitlines()
        if line.strip() and not line.startswith(("#", "!"))
    ]
    for path in LITTER + [example_of(p) for p in patterns]:
        target = clone / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("made by a run\n")
    littered = git("status", "--porcelain", "--ignored", "--untracked-files=all", cwd=clone)
    assert len(littered.splitlines()) >= len(LITTER)
    make = subprocess.run(
        ["make", "-s", "clean"], cwd=clone, capture_output=True, text=True, timeout=300
    )
    assert make.returncode == 0, make.stderr
    left = git("status", "--porcelain", "--ignored", "--untracked-files=all", cwd=clone)
    assert left == "", f"make clean left:\n{left}"
    assert (clone / "lessonkit" / "__init__.py").is_file()  # the source itself stays


def test_the_tools_caches_are_ignored_as_well():
    ignored = (ROOT / ".gitignore").read_text().split()
    for cache in (".mypy_cache/", ".ruff_cache/", ".hypothesis/", "artifacts/", "build/"):
        assert cache in ignored
