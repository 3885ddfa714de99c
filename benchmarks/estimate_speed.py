"""Median time of one estimate() call (sliders call it live; the target is well under 1 ms).

Usage: python benchmarks/estimate_speed.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lessonkit

CASES = [
    ("llama-2-7b", dict()),
    ("llama-3.1-8b", dict(method="qlora", batch_size=4, seq_len=1024, gradient_checkpointing=True)),
    ("qwen2.5-7b", dict(method="lora", lora_targets="all-linear", attention="eager")),
    ("llama-3.1-70b", dict(n_gpus=8, zero_stage=3, optimizer="adamw-8bit")),
    ("gpt2", dict(precision="fp32", optimizer="adafactor")),
    ("7B", dict(precision="bf16")),
]


def main(repeats: int = 2000) -> None:
    print(f"{'configuration':<60}{'median':>10}{'p95':>10}")
    medians = []
    for model, kw in CASES:
        lessonkit.estimate(model, **kw)  # warm the caches (preset lookup, data files)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            lessonkit.estimate(model, **kw)
            times.append(time.perf_counter() - start)
        times.sort()
        med, p95 = statistics.median(times), times[int(0.95 * len(times))]
        medians.append(med)
        label = f"{model} {kw}"[:58]
        print(f"{label:<60}{med * 1e6:>8.0f}us{p95 * 1e6:>8.0f}us")
    print(f"median over all: {statistics.median(medians) * 1e6:.0f} us per call (target < 1000 us)")


if __name__ == "__main__":
    main()
