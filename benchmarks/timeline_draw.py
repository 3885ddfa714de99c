"""Drawing time of the memory timeline (charts.memory_timeline): median and p90, milliseconds.

A draw is what a control change of the timeline explorer costs (and most of what a notebook cell
does): the chart's bands, phases, peak and labels updated, the figure rendered and saved as the
PNG the explorer shows (widgets/explorer.py: Agg canvas, PNG compression level 1). Timed for an
estimate (a 7B with and without checkpointing, and an 80-layer 70B) and for a measured step
(gpt2 on CPU, every allocation, thinned to at most 1,500 moments). Target: median under 200 ms.

    python benchmarks/timeline_draw.py [--repeats N]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time

os.environ.setdefault("MPLBACKEND", "Agg")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()

    import lessonkit as lk
    from lessonkit import charts
    from lessonkit.widgets.explorer import new_figure

    reports = {
        "estimate 7B LoRA, batch 4 x 1024": lk.estimate(
            "llama-2-7b", method="lora", precision="bf16", batch_size=4, seq_len=1024
        ),
        "estimate 7B LoRA, checkpointing": lk.estimate(
            "llama-2-7b",
            method="lora",
            precision="bf16",
            batch_size=4,
            seq_len=1024,
            gradient_checkpointing=True,
        ),
        "estimate 70B QLoRA, checkpointing": lk.estimate(
            "llama-2-70b",
            method="qlora",
            precision="bf16",
            batch_size=1,
            seq_len=2048,
            gradient_checkpointing=True,
        ),
        "measure gpt2 (CPU, FakeTensorMode)": lk.measure("gpt2", batch_size=1, seq_len=256),
    }
    figure = new_figure(8.5, 3.6, left=0.08, right=0.74, bottom=0.12, top=0.9)
    chart = charts.TimelineChart(figure.add_subplot())
    from PIL import Image

    def draw(report: object) -> None:
        chart.update(report)
        figure.canvas.draw()
        width, height = figure.canvas.get_width_height()
        image = Image.frombuffer(
            "RGBA", (width, height), figure.canvas.buffer_rgba(), "raw", "RGBA", 0, 1
        ).convert("RGB")
        image.save(io.BytesIO(), format="png", compress_level=1)

    for report in reports.values():  # warm up matplotlib's caches
        draw(report)
    print(f"memory_timeline drawing time, {args.repeats} repeats (target: median < 200 ms)")
    worst = 0.0
    for name, report in reports.items():
        times, cpu = [], []
        for _ in range(args.repeats):
            start, start_cpu = time.perf_counter(), time.process_time()
            draw(report)
            times.append((time.perf_counter() - start) * 1e3)
            cpu.append((time.process_time() - start_cpu) * 1e3)
        times.sort()
        median = statistics.median(times)
        worst = max(worst, median)
        print(
            f"  {name:<38} {len(report.timeline):>5} moments   median {median:6.1f} ms   "
            f"p90 {times[min(len(times) - 1, int(0.9 * len(times)))]:6.1f} ms   "
            f"(CPU median {statistics.median(cpu):5.1f} ms)"
        )
    print(
        f"slowest median {worst:.1f} ms: {'within' if worst < 200 else 'OVER'} the target "
        "(wall time; the CPU time is steadier on a busy machine)"
    )


if __name__ == "__main__":
    main()
