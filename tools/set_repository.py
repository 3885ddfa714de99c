#!/usr/bin/env python3
"""Point every notebook's badges and install cell at one repository and release.

The repository, the release tag and where the cell installs from live in pyproject.toml
([tool.lessonkit] repository, release and install, with [project.urls] Homepage). This tool
writes them there and into notebooks/ and solutions/, then regenerates exercises/ from
solutions/:

    python tools/set_repository.py                          # rewrite from pyproject.toml
    python tools/set_repository.py OWNER/NAME --ref v0.2.0  # a fork: set both, rewrite all
    python tools/set_repository.py OWNER/NAME --ref v0.2.0 --install git  # no package published
    python tools/set_repository.py --check                  # exit 1 when a notebook disagrees

The release tag is ``v`` and the version of pyproject.toml ([project] version): the install
cell installs ``lessonkit[measure]==<version>`` from the package index, where a published
version can never change, and the tag (which can be moved) only where the index does not have
it; ``--install git`` writes a cell that installs the tag alone, for a fork that publishes no
package. Anything but a plain OWNER/NAME and such a tag is refused (a branch, ``..``, spaces,
quotes, a newline). Publish the release too: push the tag (``git tag v0.2.0 && git push --tags``)
and .github/workflows/release.yml builds the sdist and wheel and uploads them to PyPI.

It only rewrites the Colab and Kaggle badges (the first markdown cell) and the install cell (the
first code cell, written by tools/bootstrap.py), so it can be run again at any time.
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
from bootstrap import MAX_REPOSITORY, METADATA, install_cell, is_install_cell  # noqa: E402

# GitHub's rules: an owner is letters, digits and single hyphens inside (39 at most); a
# repository name is letters, digits, '.', '_' and '-', and neither '.' nor '..'.
OWNER = re.compile(r"[A-Za-z0-9](?:-?[A-Za-z0-9]){0,38}")
NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")
# A release tag: 'v' and a version as pip writes it (1.2.3, 1.2.3rc1, 1.2.3.post1, 1.2.3.dev4).
TAG = re.compile(
    r"v(?P<version>\d{1,6}(?:\.\d{1,6}){0,3}(?:(?:a|b|rc)\d{1,6})?"
    r"(?:\.post\d{1,6})?(?:\.dev\d{1,6})?)"
)
INSTALL_FROM = ("index", "git")
BADGES = re.compile(
    r"\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)\s*\[!\[Open in Kaggle\]\([^)]*\)\]\([^)]*\)"
)
GLOSSARY_LINK = re.compile(r"https://github\.com/[^/\s)]+/[^/\s)]+/blob/[^/\s)]+/docs/glossary\.md")
FOLDERS = ("notebooks", "solutions")  # exercises/ are generated from solutions/


class SettingError(ValueError):
    """A repository, tag or install source that the notebooks must not be pointed at."""


def check_repository(repository: str) -> str:
    """``repository`` when it is a plain OWNER/NAME, else SettingError saying what is allowed."""
    owner, slash, name = repository.partition("/")
    if (
        not slash
        or not OWNER.fullmatch(owner)
        or not NAME.fullmatch(name)
        or ".." in name
        or name == "."
        or len(repository) > MAX_REPOSITORY
    ):
        raise SettingError(
            f"repository must be OWNER/NAME as on GitHub (letters, digits, '-' in the owner; "
            f"'.', '_' and '-' also in the name; no '..'; at most {MAX_REPOSITORY} characters), "
            f"got {repository[:120]!r}"
        )
    return repository


def check_tag(tag: str, version: str) -> str:
    """``tag`` when it is v<version> of pyproject.toml, else SettingError."""
    match = TAG.fullmatch(tag)
    if match is None:
        raise SettingError(
            f"--ref must be a release tag such as v0.2.0 (not a branch or a commit), got "
            f"{tag[:120]!r}"
        )
    if match.group("version") != version:
        raise SettingError(
            f"--ref {tag} is not this version's tag: pyproject.toml's version is {version}, so "
            f"the tag is v{version} (set [project] version first)"
        )
    return tag


def check_install(install: str) -> str:
    if install not in INSTALL_FROM:
        raise SettingError(f"install must be one of {', '.join(INSTALL_FROM)}, got {install!r}")
    return install


def read_settings(root: Path) -> tuple[str, str, str, str]:
    """(OWNER/NAME, tag, version, 'index' or 'git') as pyproject.toml has them (unchecked)."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    settings = pyproject["tool"]["lessonkit"]
    return (
        str(settings["repository"]),
        str(settings["release"]),
        str(pyproject["project"]["version"]),
        str(settings.get("install", "index")),
    )


def write_settings(root: Path, repository: str, ref: str, install: str) -> None:
    """Write checked settings into pyproject.toml (plain values: nothing to escape)."""
    path = root / "pyproject.toml"
    text = path.read_text(encoding="utf-8")
    if not re.search(r'(?m)^install = ".*"$', text):
        text = re.sub(r'(?m)^(release = ".*")$', r'\1\ninstall = "index"', text, count=1)
    for key, value in (
        ("repository", repository),
        ("release", ref),
        ("install", install),
        ("Homepage", f"https://github.com/{repository}"),
    ):
        line = f'{key} = "{value}"'
        text = re.sub(rf'(?m)^{key} = ".*"$', lambda _, line=line: line, text, count=1)
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


class NotebookError(Exception):
    """A notebook without the badges or the install cell this tool rewrites."""


def rewrite(notebook: dict, path: str, repository: str, ref: str, install: str) -> list[str]:
    """Rewrite ``notebook`` in place; return what did not match (empty when all is in place)."""
    problems = []
    cells = notebook["cells"]
    first_md = next(
        (c for c in cells if c["cell_type"] == "markdown" and BADGES.search(_source(c))), None
    )
    if first_md is None:
        raise NotebookError(f"{path}: no Colab and Kaggle badges in a markdown cell")
    new = BADGES.sub(lambda _: badges(repository, ref, path), _source(first_md), count=1)
    if new != _source(first_md):
        problems.append("badges point elsewhere")
        first_md["source"] = new.splitlines(keepends=True)
    glossary = f"https://github.com/{repository}/blob/{ref}/docs/glossary.md"
    for cell in cells:  # the links to the glossary, at the same repository and tag
        if cell["cell_type"] != "markdown":
            continue
        text = GLOSSARY_LINK.sub(glossary, _source(cell))
        if text != _source(cell):
            if "glossary links point elsewhere" not in problems:
                problems.append("glossary links point elsewhere")
            cell["source"] = text.splitlines(keepends=True)
    first_code = next((c for c in cells if c["cell_type"] == "code"), None)
    if first_code is None or not is_install_cell(first_code):
        raise NotebookError(f"{path}: the first code cell is not the install cell")
    cell = install_cell(repository, ref[1:], index=install == "index")
    if _source(first_code) != cell:
        problems.append("install cell differs from tools/bootstrap.py's")
        first_code["source"] = cell.splitlines(keepends=True)
    metadata = first_code.setdefault("metadata", {})
    if any(metadata.get(key) != value for key, value in METADATA.items()):
        problems.append("install cell is not hidden (cellView and jupyter.source_hidden)")
        metadata.update(json.loads(json.dumps(METADATA)))
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
    parser.add_argument("--ref", help="the release tag, v<version> (default: pyproject's)")
    parser.add_argument(
        "--install",
        choices=INSTALL_FROM,
        help="index: the package index, the tag where it has not the release (the default); "
        "git: the tag alone, for a fork that publishes no package",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 on disagreement"
    )
    parser.add_argument("--root", type=Path, default=HERE.parent, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        repository, ref, version, install = read_settings(args.root)
    except (OSError, KeyError, tomllib.TOMLDecodeError) as err:
        parser.error(f"cannot read the settings in {args.root / 'pyproject.toml'}: {err!r}")
    given = args.repository or args.ref or args.install
    if given and args.check:
        parser.error("--check compares with pyproject.toml; give no repository, --ref or --install")
    try:
        repository = check_repository(args.repository or repository)
        ref = check_tag(args.ref or ref, version)
        install = check_install(args.install or install)
    except SettingError as err:
        parser.error(str(err) if given else f"pyproject.toml [tool.lessonkit]: {err}")
    if given:
        write_settings(args.root, repository, ref, install)
    status, written = 0, 0
    for folder in FOLDERS:
        for path in sorted((args.root / folder).glob("*.ipynb")):
            notebook = json.loads(path.read_text(encoding="utf-8"))
            try:
                problems = rewrite(notebook, f"{folder}/{path.name}", repository, ref, install)
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
        print(f"{repository} @ {ref} ({install}): {written} notebooks rewritten.")
    status |= regenerate_exercises(args.root, args.check)
    return int(bool(status))


if __name__ == "__main__":
    sys.exit(main())
