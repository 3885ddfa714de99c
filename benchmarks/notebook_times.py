"""Print how long each course notebook takes to run top to bottom (default parameters).

    .venv/bin/python benchmarks/notebook_times.py

Each notebook runs in a fresh kernel with nbclient, as nbval and papermill run them; the figure
is the wall time of executing its cells (kernel start-up is printed apart).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def main() -> None:
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    total = startup = 0.0
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(
            nb,
            timeout=600,
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
        )
        start = time.perf_counter()
        with client.setup_kernel():
            ready = time.perf_counter()
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index)
            done = time.perf_counter()
        startup += ready - start
        total += done - ready
        print(f"{path.name:<40}{done - ready:7.1f} s")
    print(f"{'all notebooks (cells only)':<40}{total:7.1f} s")
    print(f"{'kernel start-ups':<40}{startup:7.1f} s")


if __name__ == "__main__":
    main()
