"""The install cell that every notebook opens with (notebooks/, solutions/, and so exercises/).

On Colab and Kaggle lessonkit is not installed: the cell installs ``lessonkit[measure]==VERSION``
from the package index (PyPI), where a published version can never change, and only where the
index does not give it (not reachable, or a fork that publishes no package) the same release
from its git tag. It leaves the platform's own packages alone (tests/course/test_platforms.py
checks that pip changes none of them, so no restart is needed there). Where lessonkit is
installed (``make course``) the cell does nothing. When pip fails (no network, Kaggle with
Internet off, any pip error) the student sees one short message that names the platform and the
fix, and Run All stops there: IPython shows what ``_render_traceback_`` returns instead of a
traceback.

The cell is hidden by default: Colab shows its ``# @title`` line as a form (cell metadata
``cellView: form``), JupyterLab and Notebook 7 collapse its source (``jupyter.source_hidden``).
It is ruff-clean and ``ruff format`` leaves it as it is (a test runs both), so ``make format``
over the notebooks cannot change it.

The cell cannot import anything of lessonkit's (it is not installed yet), so it is written into
the notebooks rather than imported: ``tools/set_repository.py`` writes it, and
``tools/generate_exercises.py`` copies it from solutions/ to exercises/.
"""

from __future__ import annotations

import re

TITLE = "# @title Install lessonkit, the course's helper package"
METADATA = {"cellView": "form", "jupyter": {"source_hidden": True}}
# The longest repository name whose line in the cell stays within ruff's 100 characters.
MAX_REPOSITORY = 80

# The platform signals are those of lessonkit/data/environments.json ("detect"); a test keeps
# them in step. {index_line} is the package-index requirement, or nothing for a fork's cell.
CELL = """\
{title}
{about}
VERSION = "{version}"
REPOSITORY = "{repository}"
try:
    import lessonkit
except ImportError:
    import importlib
    import os
    import re
    import subprocess
    import sys

    print("Installing lessonkit (about a minute)...")
    requirements = [{index_line}
        f"lessonkit[measure] @ git+https://github.com/{{REPOSITORY}}@v{{VERSION}}",
    ]
    for requirement in requirements:
        command = [sys.executable, "-m", "pip", "install", "-q", requirement]
        pip = subprocess.run(command, capture_output=True, text=True)
        if pip.returncode == 0:
            break
    else:

        class SetupFailed(Exception):
            def _render_traceback_(self):  # IPython shows this instead of a traceback
                return [str(self)]

        offline = re.search(
            r"resolve host|Failed to connect|connect to server|NewConnection"
            r"|Network is unreachable|name resolution",
            pip.stderr,
        )
        last = (pip.stderr.strip().splitlines() or ["pip failed"])[-1][:200]
        why = "no Internet connection" if offline else last
        if "google.colab" in sys.modules:
            fix = "On Colab: Runtime > Disconnect and delete runtime, then Runtime > Run all."
        elif "KAGGLE_KERNEL_RUN_TYPE" in os.environ:
            fix = (
                "On Kaggle: switch on Settings > Internet (it needs a phone-verified account), "
                "then Run All."
            )
        else:
            fix = (
                "On your own machine: run `make course` in the course folder and open the "
                "notebooks there."
            )
        raise SetupFailed(f"Could not install lessonkit ({{why}}). {{fix}}")
    importlib.invalidate_caches()
    import lessonkit

    print(f"lessonkit {{lessonkit.__version__}} is installed.")
"""
ABOUT_INDEX = """\
# Where lessonkit is missing (Colab, Kaggle) this installs the release below from the package
# index (PyPI), or from its git tag where the index does not have it. The platform's own torch,
# numpy, matplotlib and ipywidgets stay as they are: no restart needed."""
ABOUT_GIT = """\
# Where lessonkit is missing (Colab, Kaggle) this installs the release below from its git tag.
# The platform's own torch, numpy, matplotlib and ipywidgets stay as they are: no restart needed."""
INDEX_LINE = (
    '\n        f"lessonkit[measure]=={VERSION}",  # the package index: a version never changes'
)


def install_cell(repository: str, version: str, index: bool = True) -> str:
    """The install cell's source for ``OWNER/NAME`` at release ``version`` (tag ``v<version>``);
    ``index=False`` for a fork that publishes no package (its git tag only)."""
    return CELL.format(
        title=TITLE,
        version=version,
        repository=repository,
        about=ABOUT_INDEX if index else ABOUT_GIT,
        index_line=INDEX_LINE if index else "",
    ).rstrip("\n")


def requirements(repository: str, version: str, index: bool = True) -> list[str]:
    """What the cell asks pip to install, in the order it tries them."""
    git = f"lessonkit[measure] @ git+https://github.com/{repository}@v{version}"
    return [f"lessonkit[measure]=={version}", git] if index else [git]


def is_install_cell(cell: dict) -> bool:
    """The install cell, today's or an older one (the tools leave it out of slides and
    dashboards and rewrite it)."""
    source = cell.get("source", "")
    text = "".join(source) if isinstance(source, list) else str(source)
    if cell.get("cell_type") != "code":
        return False
    return text.startswith(TITLE) or bool(
        "import lessonkit" in text and re.search(r"\bpip\b", text) and "install" in text
    )
