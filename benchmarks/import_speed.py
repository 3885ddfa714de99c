"""Seconds that ``import lessonkit`` takes in a fresh Python (target: under 0.2 s), median of
several runs; tests/project/test_package.py bounds what it loads instead.

Usage: python benchmarks/import_speed.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = "import time; t = time.perf_counter(); import lessonkit; print(time.perf_counter() - t)"


def main(runs: int = 9) -> None:
    seconds = [
        float(
            subprocess.run(
                [sys.executable, "-c", CODE], capture_output=True, text=True, check=True, cwd=ROOT
            ).stdout
        )
        for _ in range(runs)
    ]
    print(
        f"import lessonkit: median {statistics.median(seconds) * 1e3:.1f} ms, slowest "
        f"{max(seconds) * 1e3:.1f} ms over {runs} runs (target < 200 ms)"
    )


if __name__ == "__main__":
    main()
