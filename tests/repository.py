"""The repository as the tests see it: a copy of its source to build from (building in place
writes build/ and *.egg-info/ into it), and the paths a clone does not have, which no test may
leave behind (tests/conftest.py checks them after every session)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What tools (not tests) make: Python's bytecode, pytest's, mypy's and ruff's caches, the venvs.
TOOL_PATHS = ("__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".venv")


def source_copy(dest: Path) -> Path:
    """The files git tracks (or, outside a checkout, the source folders), copied to ``dest``."""
    files = _tracked_files()
    if files is None:
        ignore = shutil.ignore_patterns(".venv*", "__pycache__", "build", "*.egg-info", ".git")
        shutil.copytree(ROOT, dest, ignore=ignore, dirs_exist_ok=True)
        return dest
    for name in files:
        source = ROOT / name
        if source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest


def _tracked_files() -> list[str] | None:
    try:
        listed = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if listed.returncode != 0:
        return None
    return [name for name in listed.stdout.split("\0") if name]


def stray_paths() -> set[str] | None:
    """Untracked and ignored paths at the top of each untracked folder (as ``git status``
    shows them) and every entry at the top of the repository (git shows no empty folder), less
    those the tools make; None outside a git checkout."""
    try:
        status = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--ignored=matching", "-z"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if status.returncode != 0:
        return None
    paths = {entry.name + ("/" if entry.is_dir() else "") for entry in os.scandir(ROOT)}
    for entry in status.stdout.split("\0"):
        if entry[:3] in ("?? ", "!! "):
            path = entry[3:]
            paths.add(path)
    return {path for path in paths if not any(p.startswith(TOOL_PATHS) for p in Path(path).parts)}
