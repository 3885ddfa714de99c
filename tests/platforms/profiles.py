"""Platform profiles: the packages Colab and Kaggle preinstall (colab.txt, kaggle.txt).

    python tests/platforms/profiles.py constraints colab    # pip constraints for the test env
    python tests/platforms/profiles.py requirements          # what the test env installs
    python tests/platforms/profiles.py lowest                # the oldest versions allowed

The Colab test environment (``make colab-env``, part of ``make test``) installs lessonkit's own
requirements and the kernel and test tools Colab ships, every one at the version in colab.txt.
Two things differ from Colab itself: torch stays the local build (TORCH_SPEC, a CPU build of
torch 2.13.0 here, not Colab's CUDA build) and Python is this machine's (3.11 here, 3.12 there).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PLATFORMS = ("colab", "kaggle")
# Not taken from the profile: torch and the packages built for it (the local torch build is
# used instead), and setuptools (that torch build needs setuptools>=77; Colab has 75.2.0).
LOCAL = {"torch", "torchaudio", "torchvision", "torchcodec", "torchao", "triton", "setuptools"}
# Besides lessonkit's requirements: the kernel and the test tools, which Colab ships too.
TOOLS = ("pip", "ipykernel", "ipython", "jupyter-client", "pytest", "nbformat")


def normalize(name: str) -> str:
    """A package name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read(platform: str) -> dict[str, str]:
    """Normalized package name -> version, from ``tests/platforms/<platform>.txt``."""
    versions = {}
    for line in (HERE / f"{platform}.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            versions[normalize(name)] = version
    return versions


def header(platform: str) -> str:
    """The comment lines at the top of a profile (source, date, Python)."""
    lines = (HERE / f"{platform}.txt").read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if line.startswith("#"))


def constraints(platform: str) -> list[str]:
    """``name==version`` lines for pip's ``-c``, without the packages kept local."""
    return [
        f"{name}=={version}"
        for name, version in sorted(read(platform).items())
        if name not in LOCAL and "+" not in version
    ]


def requirements() -> list[str]:
    """lessonkit's requirements (with the measure extra, torch left to the local build) and
    the kernel and test tools."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    needed = [*project["dependencies"], *project["optional-dependencies"]["measure"]]
    return [r for r in needed if normalize(re.split(r"[<>=!~ \[;]", r)[0]) not in LOCAL] + list(
        TOOLS
    )


def lowest() -> list[str]:
    """The oldest releases pyproject.toml allows of what the charts and explorers use
    ("matplotlib>=3.6" becomes "matplotlib==3.6.*"), with the numpy they were built for."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pins = []
    for requirement in project["dependencies"]:
        floor = re.search(r"^([\w-]+)\s*>=\s*(\d+\.\d+)", requirement)
        pins.append(f"{floor.group(1)}=={floor.group(2)}.*")
    return [*pins, "numpy<2", "ipython", "pytest"]


def main(argv: list[str]) -> int:
    if argv[:1] == ["constraints"] and len(argv) == 2 and argv[1] in PLATFORMS:
        print("\n".join(constraints(argv[1])))
    elif argv == ["requirements"]:
        print("\n".join(requirements()))
    elif argv == ["lowest"]:
        print("\n".join(lowest()))
    else:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
