"""The install cell that every notebook opens with (notebooks/, solutions/, and so exercises/).

On Colab and Kaggle lessonkit is not installed: the cell installs the release named in
pyproject.toml ([tool.lessonkit]) with pip and leaves the platform's own packages alone (tests/
test_platforms.py checks that pip changes none of them, so no restart is needed there). Where
lessonkit is installed (``make course``) the cell does nothing. When pip fails (no network,
Kaggle with Internet off, any pip error) the student sees one short message that names the
platform and the fix, and Run All stops there: IPython shows what ``_render_traceback_``
returns instead of a traceback.

The cell cannot import anything of lessonkit's (it is not installed yet), so it is written into
the notebooks rather than imported: ``tools/set_repository.py`` writes it, and
``tools/generate_exercises.py`` copies it from solutions/ to exercises/.
"""

from __future__ import annotations

# The platform signals are those of lessonkit/data/environments.json ("detect"); a test keeps
# them in step.
CELL = """\
# Installs lessonkit, the course's helper package, where it is missing (Colab, Kaggle). The
# platform's own torch, numpy, matplotlib and ipywidgets stay as they are: no restart needed.
LESSONKIT = "lessonkit[measure] @ git+https://github.com/{repository}@{ref}"
try:
    import lessonkit
except ImportError:
    import importlib, os, re, subprocess, sys
    print("Installing lessonkit (about a minute)...")
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", LESSONKIT],
                         capture_output=True, text=True)
    if pip.returncode:
        class SetupFailed(Exception):
            def _render_traceback_(self):  # IPython shows this instead of a traceback
                return [str(self)]
        offline = re.search(r"resolve host|Failed to connect|connect to server|NewConnection"
                            r"|Network is unreachable|name resolution", pip.stderr)
        why = "no Internet connection" if offline else (pip.stderr.strip().splitlines() or ["pip failed"])[-1][:200]
        fix = ("On Colab: Runtime > Disconnect and delete runtime, then Runtime > Run all."
               if "google.colab" in sys.modules else
               "On Kaggle: switch on Settings > Internet (it needs a phone-verified account), then Run All."
               if "KAGGLE_KERNEL_RUN_TYPE" in os.environ else
               "On your own machine: run `make course` in the course folder and open the notebooks there.")
        raise SetupFailed(f"Could not install lessonkit ({{why}}). {{fix}}")
    importlib.invalidate_caches()
    import lessonkit
"""


def install_cell(repository: str, ref: str) -> str:
    """The install cell's source for ``OWNER/NAME`` at release ``ref``."""
    return CELL.format(repository=repository, ref=ref).rstrip("\n")


def requirement(repository: str, ref: str) -> str:
    """What the cell asks pip to install."""
    return f"lessonkit[measure] @ git+https://github.com/{repository}@{ref}"
