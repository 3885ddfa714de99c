"""The calculator against published measured runs: prints a Markdown table.

Reads tests/published_runs.json (each row: its source with repository, path and commit, what
it measured, the published figure, the settings) and prints, for each row, the estimate's
tensor peak and its error. The same rows are asserted by tests/test_published_runs.py.
Usage: python benchmarks/published_runs.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_published_runs import DATA, ROWS, error, estimated_gb  # noqa: E402


def main() -> None:
    print("## Published runs\n")
    print("Runs whose peak memory was published with complete settings, next to the estimate "
          "with the same settings (`tests/published_runs.json`, asserted by "
          "`tests/test_published_runs.py`). Sizes in GB (1e9 bytes), as the sources give them. "
          "*Measured* says what the source measured; the estimate's figure is its tensor peak "
          "(no CUDA context, no allocator margin), the counterpart of "
          "`torch.cuda.max_memory_allocated`.\n")
    for key, source in DATA["sources"].items():
        print(f"- **{key}**: {source['title']}: `{source['repository']}` "
              f"`{source['path']}` at commit `{source['commit']}` (as of {source['as_of']}). "
              f"Run: {source['run']}. Settings: {source['settings_from']}. "
              f"Measured: {source['measured']}. {source['differences']}")
    target = [abs(error(r)) for r in ROWS if r["in_target"]]
    print(f"\nMedian |error| over the {len(target)} rows in the target: "
          f"{statistics.median(target):.1%} (target: within 10%); worst {max(target):.1%}.\n")
    print("| source | run | published | estimate | error | in target | note |")
    print("|---|---|---|---|---|---|---|")
    for row in ROWS:
        print(f"| {row['source']} | {row['label']} | {row['published_gb']:.2f} | "
              f"{estimated_gb(row):.2f} | {error(row):+.1%} | "
              f"{'yes' if row['in_target'] else 'no'} | {row['note'] or '-'} |")


if __name__ == "__main__":
    main()
