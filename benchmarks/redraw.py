"""Redraw time of the live explorers: median and p90 of one control change, in milliseconds.

A redraw is what a slider move costs in the kernel: the estimate, updating the chart's artists,
rendering the PNG and setting the chart Image's bytes; the readout's advice (the changes that
make a run fit, where it fits no GPU) is in it. Target: every explorer's median at
most 30 ms in the kernel (the browser test prints the control-change-to-new-chart latency in the
page, target 150 ms median). For comparison, the same chart drawn as a new figure per change is
timed too. The method toggle goes round three methods ten times: after the first round each
method's axes are a saved picture (widgets/explorer.py), so its median is that of a return to a state
seen before; the first visit draws the axes again (p90). The memory-saver controls go round
checkpointing, activation offload, the chunked loss and the optimizer step in backward (a change
that switches another control off redraws once).

    python benchmarks/redraw.py [--repeats N]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time

os.environ.setdefault("MPLBACKEND", "Agg")


def timings(action, values, repeats: int) -> tuple[list[float], list[float]]:
    """Wall-clock and CPU milliseconds of each call (CPU time is steadier on a busy machine)."""
    wall, cpu = [], []
    for _ in range(repeats):
        for value in values:
            start, start_cpu = time.perf_counter(), time.process_time()
            action(value)
            wall.append((time.perf_counter() - start) * 1e3)
            cpu.append((time.process_time() - start_cpu) * 1e3)
    return wall, cpu


def summary(name: str, ms: tuple[list[float], list[float]]) -> str:
    wall, cpu = sorted(ms[0]), ms[1]
    p90 = wall[min(len(wall) - 1, int(0.9 * len(wall)))]
    return (
        f"{name:<44} median {statistics.median(wall):6.1f} ms   p90 {p90:6.1f} ms   "
        f"(CPU median {statistics.median(cpu):5.1f} ms, n={len(wall)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from matplotlib.figure import Figure

    from lessonkit import charts
    from lessonkit.memory.estimating import estimate
    from lessonkit.widgets import explorers as widgets

    batches = list(range(1, 65))
    explorer = widgets.vram_explorer("7B", method="lora")

    def move_batch(value: int) -> None:
        explorer.controls["batch_size"].value = value

    move_batch(2)  # warm-up
    lines = [
        summary(
            "vram_explorer: batch slider (reused figure)",
            timings(move_batch, batches, args.repeats),
        )
    ]
    # Where it fits no GPU, the readout gives the kit's changes that make it fit (its search
    # for `lessonkit vram --gpu`), each with its new peak: that advice is in these figures.
    advised = widgets.vram_explorer("7B", method="full", seq_len=4096)
    advised.controls["batch_size"].value = 2  # warm-up
    lines.append(
        summary(
            "vram_explorer: batch slider, no fit (advice)",
            timings(
                lambda v: setattr(advised.controls["batch_size"], "value", v), batches, args.repeats
            ),
        )
    )
    methods = ["full", "lora", "qlora"] * 10
    lines.append(
        summary(
            "vram_explorer: method toggle",
            timings(lambda v: setattr(explorer.controls["method"], "value", v), methods, 1),
        )
    )
    # the memory savers: checkpointing, activation offload, chunked loss, optimizer in backward
    savers = [
        ("gradient_checkpointing", True),
        ("activation_offload", True),
        ("loss", "chunked"),
        ("loss", "standard"),
        ("activation_offload", True),
        ("gradient_checkpointing", False),
        ("optimizer_in_backward", True),
        ("optimizer_in_backward", False),
    ] * 5
    lines.append(
        summary(
            "vram_explorer: memory-saver controls",
            timings(lambda nv: setattr(explorer.controls[nv[0]], "value", nv[1]), savers, 1),
        )
    )

    def new_figure(value: int) -> None:
        fig = Figure(figsize=(7.5, 3.6), dpi=widgets.CHART_DPI)
        fig.subplots_adjust(left=0.1, right=0.77, bottom=0.2, top=0.9)
        charts.draw_breakdown(fig.add_subplot(), estimate("7B", method="lora", batch_size=value))
        fig.savefig(io.BytesIO(), format="png")

    lines.append(summary("same chart as a new figure per change", timings(new_figure, batches, 1)))
    for name, make, control, values in (
        (
            "gpu_matrix_explorer: batch slider",
            widgets.gpu_matrix_explorer,
            "batch_size",
            batches[::4],
        ),
        (
            "environment_explorer: batch slider",
            widgets.environment_explorer,
            "batch_size",
            batches[::4],
        ),
        (
            "decision_flow_explorer: size menu",
            widgets.decision_flow_explorer,
            "size",
            list(widgets.MODEL_SIZES),
        ),
    ):
        other = make()
        lines.append(
            summary(
                name,
                timings(
                    lambda v, o=other, c=control: setattr(o.controls[c], "value", v), values, 1
                ),
            )
        )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
