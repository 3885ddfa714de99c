"""benchmarks/accuracy.py prints memory in GiB, as everything else: its tables of the guide's
case and of ZeRO-3, and the published runs (each published figure also as the source gave it,
in decimal GB). The full table takes long to regenerate; these sections are quick."""

from __future__ import annotations

import re

from script_loader import load_script

import lessonkit

GB, GiB = 10**9, 2**30


def table_rows(text: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith("| source |")
    ]


def test_the_guide_case_and_zero3_tables_are_in_gib(capsys):
    accuracy = load_script("benchmarks/accuracy.py")
    accuracy.guide_case()
    accuracy.zero3_case()
    out = capsys.readouterr().out
    a100 = lessonkit.get_gpu("A100 80GB")
    for cells in table_rows(out):
        if cells[0].startswith(("precision", "GPUs")):
            assert cells[-1] == "fits an A100 80GB"
            continue
        assert all(not re.search(r"\d GB\b", cell) for cell in cells), cells
        assert cells[1].endswith(("GiB", "B/param)")) and "GiB" in cells[2]
    peak_7b = lessonkit.estimate("llama-2-7b", precision="bf16-mixed", optimizer="adamw")
    assert f"| {peak_7b.total_bytes / GiB:.1f} GiB (peak in the" in out
    eight = lessonkit.estimate("llama-2-70b", n_gpus=8, zero_stage=3)
    verdict = "yes" if eight.fits(a100.usable_bytes) else "no"
    assert "| 8 | " in out and f"{eight.total_bytes / GiB:.1f} GiB (peak in the" in out
    assert f"(peak in the {eight.peak_phase}) | {verdict} |" in out
    assert "120GB to 160GB" in out and "111.8-149.0 GiB" in out  # the quote, converted


def test_the_published_runs_table_is_in_gib(capsys):
    published = load_script("benchmarks/published_runs.py")
    published.main()
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| source | run |"))
    assert "published (GiB)" in header and "estimate (GiB)" in header
    rows = [cells for cells in table_rows(out) if len(cells) == 9]
    assert len(rows) == len(published.ROWS)
    for cells, row in zip(rows, published.ROWS, strict=True):
        assert cells[2] == f"{row['published_gb'] * GB / GiB:.2f}"
        assert cells[3] == f"{row['published_gb']:.2f} GB"
        assert cells[4] == f"{published.estimated_gb(row) * GB / GiB:.2f}"
