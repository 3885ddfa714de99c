#!/usr/bin/env python3
"""Point every notebook's badges and install cell at one repository and release tag.

The repository and the tag live in pyproject.toml ([tool.lessonkit] repository and release, with
[project.urls] Homepage). This tool writes them there and into notebooks/ and solutions/, then
regenerates exercises/ from solutions/:

    python tools/set_repository.py                          # rewrite from pyproject.toml
    python tools/set_repository.py OWNER/NAME --ref v0.2.0  # a fork: set both, rewrite all
    python tools/set_repository.py --check                  # exit 1 when a notebook disagrees

It only rewrites the Colab and Kaggle badges (the first markdown cell) and the install cell (the
first code cell, written by tools/bootstrap.py), so it can be run again at any time. Push the
tag too (``git tag v0.2.0 && git push --tags``): the install cell installs that tag.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bootstrap import install_cell  # noqa: E402

REPOSITORY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+$")
REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
BADGES = re.compile(
    r"\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)\s*\[!\[Open in Kaggle\]\([^)]*\)\]\([^)]*\)"
)
FOLDERS = ("notebooks", "solutions")  # exercises/ are generated from solutions/


def read_settings(root: Path) -> tuple[str, str]:
    """(OWNER/NAME, tag) from pyproject.toml."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    settings = pyproject["tool"]["lessonkit"]
    return settings["repository"], settings["release"]


def write_settings(root: Path, repository: str, ref: str) -> None:
    path = root / "pyproject.toml"
    text = path.read_text(encoding="utf-8")
    text = re.sub(r'(?m)^repository = ".*"$', f'repository = "{repository}"', text, count=1)
    text = re.sub(r'(?m)^release = ".*"$', f'release = "{ref}"', text, count=1)
    text = re.sub(
        r'(?m)^Homepage = ".*"$', f'Homepage = "https://github.com/{repository}"', text, count=1
    )
    path.write_text(text, encoding="utf-8")


def badges(repository: str, ref: str, path: str) -> str:
    """The Colab and Kaggle badges for the notebook at ``path`` (relative to the repository)."""
    url = f"github.com/{repository}/blob/{ref}/{path}"
    return (
        f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        f"(https://colab.research.google.com/{url.replace('github.com', 'github', 1)}) "
        f"[![Open in Kaggle](https://kaggle.com/static/images/open-in-kaggle.svg)]"
        f"(https://kaggle.com/kernels/welcome?src=https://{url})"
    )


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def is_install_cell(cell: dict) -> bool:
    text = _source(cell)
    return cell["cell_type"] == "code" and "import lessonkit" in text and "pip" in text


class NotebookError(Exception):
    """A notebook without the badges or the install cell this tool rewrites."""


def rewrite(notebook: dict, path: str, repository: str, ref: str) -> list[str]:
    """Rewrite ``notebook`` in place; return what did not match (empty when all is in place)."""
    problems = []
    cells = notebook["cells"]
    first_md = next(
        (c for c in cells if c["cell_type"] == "markdown" and BADGES.search(_source(c))), None
    )
    if first_md is None:
        raise NotebookError(f"{path}: no Colab and Kaggle badges in a markdown cell")
    else:
        new = BADGES.sub(badges(repository, ref, path), _source(first_md), count=1)
        if new != _source(first_md):
            problems.append("badges point elsewhere")
            first_md["source"] = new.splitlines(keepends=True)
    first_code = next((c for c in cells if c["cell_type"] == "code"), None)
    if first_code is None or not is_install_cell(first_code):
        raise NotebookError(f"{path}: the first code cell is not the install cell")
    if _source(first_code) != install_cell(repository, ref):
        problems.append("install cell differs from tools/bootstrap.py's")
        first_code["source"] = install_cell(repository, ref).splitlines(keepends=True)
    return problems


def dumps(notebook: dict) -> str:
    """As Jupyter and tools/strip_notebooks.py write notebooks."""
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def regenerate_exercises(root: Path, check: bool) -> int:
    spec = importlib.util.spec_from_file_location(
        "generate_exercises", HERE / "generate_exercises.py"
    )
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    args = ["--solutions", str(root / "solutions"), "--exercises", str(root / "exercises")]
    return generator.main(args + (["--check"] if check else []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repository", nargs="?", help="OWNER/NAME on GitHub (default: pyproject's)")
    parser.add_argument(
        "--ref", help="the release tag the notebooks install (default: pyproject's)"
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 on disagreement"
    )
    parser.add_argument("--root", type=Path, default=HERE.parent, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    repository, ref = read_settings(args.root)
    if args.repository or args.ref:
        if args.check:
            parser.error("--check compares with pyproject.toml; give no repository or --ref")
        repository, ref = args.repository or repository, args.ref or ref
        if not REPOSITORY.match(repository):
            parser.error(f"repository must be OWNER/NAME as on GitHub, got {repository!r}")
        if not REF.match(ref) or ref in ("main", "master"):
            parser.error(f"--ref must be a release tag such as v0.2.0 (not a branch), got {ref!r}")
        write_settings(args.root, repository, ref)
    status, written = 0, 0
    for folder in FOLDERS:
        for path in sorted((args.root / folder).glob("*.ipynb")):
            notebook = json.loads(path.read_text(encoding="utf-8"))
            try:
                problems = rewrite(notebook, f"{folder}/{path.name}", repository, ref)
            except NotebookError as err:
                print(f"set_repository: error: {err}", file=sys.stderr)
                status = 1
                continue
            if args.check:
                for problem in problems:
                    print(f"{folder}/{path.name}: {problem}", file=sys.stderr)
                status |= bool(problems)
            elif dumps(notebook) != path.read_text(encoding="utf-8"):
                path.write_text(dumps(notebook), encoding="utf-8")
                written += 1
    if not args.check:
        print(f"{repository} @ {ref}: {written} notebooks rewritten.")
    status |= regenerate_exercises(args.root, args.check)
    return int(bool(status))


if __name__ == "__main__":
    sys.exit(main())
