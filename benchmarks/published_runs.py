"""The calculator against published measured runs: prints a Markdown section.

Reads tests/published_runs.json (each source with repository, path, commit, address, date and
what it measured; each row with the published figure, the source's own words and the settings)
and prints, for each row, the estimate's counterpart of the measured figure and its error, the
median |error| of each source and of all single-GPU rows, and the runs not compared yet. The
same rows are asserted by tests/memory/test_published_runs.py.
Usage: python benchmarks/published_runs.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.memory.test_published_runs import (  # noqa: E402
    DATA,
    ROWS,
    error,
    estimated_gb,
    median_error,
    single_gpu,
)

GB, GiB = 10**9, 2**30


def sentence(text: str) -> str:
    return text.rstrip(".") + "."


def cell(text: str) -> str:
    return text.replace("|", "\\|") or "-"


def main() -> None:
    print("## Published runs\n")
    print(
        "Runs whose peak memory was published with complete settings, next to the estimate "
        "with the same settings (`tests/published_runs.json`, asserted by "
        "`tests/memory/test_published_runs.py`; this section is printed by "
        "`benchmarks/published_runs.py`). Sizes in GiB (2**30 bytes); the published figure "
        "also as the source gives it, in decimal GB (1e9 bytes), as do the sources' own notes "
        "quoted below and in the table's last columns. "
        "*Measured* says what the source measured; the estimate's figure is its counterpart: "
        "for `torch.cuda.max_memory_allocated` the allocated peak (no CUDA context, no "
        "allocator margin, no paged optimizer states), for `torch.cuda.max_memory_reserved` "
        "that peak plus the allocator margin. Each row in the JSON file also quotes the "
        "source's line and the settings it was read from.\n"
    )
    for key, source in DATA["sources"].items():
        print(
            f"- **{key}**: {source['title']}: `{source['repository']}` "
            f"`{source['path']}` at commit `{source['commit']}` ({source['url']}), "
            f"as of {source['as_of']} ({source['as_of_basis']}) "
            f"Run: {sentence(source['run'])} Settings: {sentence(source['settings_from'])} "
            f"Measured: {sentence(source['measured'])} {source['differences']}"
        )
    rows = single_gpu(ROWS)
    print("\nMedian |error| (target: within 10% over the single-GPU rows of all sources):\n")
    print("| source | single-GPU rows | median \\|error\\| | worst |")
    print("|---|---|---|---|")
    for key in DATA["sources"]:
        mine = [r for r in rows if r["source"] == key]
        if mine:
            print(
                f"| {key} | {len(mine)} | {median_error(mine):.1%} | "
                f"{max(abs(error(r)) for r in mine):.1%} |"
            )
    print(
        f"| **all** | {len(rows)} | **{median_error(rows):.1%}** | "
        f"{max(abs(error(r)) for r in rows):.1%} |\n"
    )
    print(
        "| source | run | published (GiB) | as published | estimate (GiB) | error | in target "
        "| note | explained |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for row in ROWS:
        print(
            f"| {row['source']} | {row['label']} | {row['published_gb'] * GB / GiB:.2f} | "
            f"{row['published_gb']:.2f} GB | {estimated_gb(row) * GB / GiB:.2f} | "
            f"{error(row):+.1%} | "
            f"{'yes' if row['in_target'] else 'no'} | {cell(row.get('note', ''))} | "
            f"{cell(row.get('explained', ''))} |"
        )
    print("\nNot compared yet:\n")
    for item in DATA["not_compared"]:
        print(f"- {item['source']}: {item['runs']}; needs {item['needs']}.")


if __name__ == "__main__":
    main()
