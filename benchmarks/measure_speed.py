"""How long measure() takes on CPU (FakeTensorMode), in seconds, and what it found.

A small model should take a second or two and a 7B shape well under a minute; nothing is
allocated, so the resident memory stays small whatever the model.

    python benchmarks/measure_speed.py [--repeats N] [--skip-7b]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-7b", action="store_true", help="only the small models")
    args = parser.parse_args()

    start = time.perf_counter()
    from lessonkit.memory.measuring import measure

    measure("gpt2", seq_len=16, lora_targets=("c_attn",))  # imports torch, transformers, peft
    print(f"first call (imports included): {time.perf_counter() - start:.1f} s")

    cases = [
        ("gpt2, full, bf16-mixed, batch 1 x 512", "gpt2", dict(lora_targets=("c_attn",))),
        ("qwen2.5-0.5b, full, bf16, batch 1 x 512", "qwen2.5-0.5b", dict(precision="bf16")),
        (
            "qwen2.5-0.5b, qlora, batch 4 x 1024, checkpointing",
            "qwen2.5-0.5b",
            dict(method="qlora", batch_size=4, seq_len=1024, gradient_checkpointing=True),
        ),
        (
            "qwen2.5-0.5b, ZeRO-3 over 8 GPUs",
            "qwen2.5-0.5b",
            dict(precision="bf16", n_gpus=8, zero_stage=3),
        ),
    ]
    if not args.skip_7b:
        cases += [
            (
                "llama-2-7b, full, bf16, AdamW foreach, batch 1 x 512",
                "llama-2-7b",
                dict(precision="bf16"),
            )
        ]
    print(f"{'case':<55}{'median s':>10}{'peak GiB':>10}")
    for name, model, kwargs in cases:
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            report = measure(model, **kwargs)
            times.append(time.perf_counter() - t0)
        print(f"{name:<55}{statistics.median(times):>10.2f}{report.total_bytes / 2**30:>10.2f}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"max resident memory of this process: {rss:.2f} GiB")


if __name__ == "__main__":
    main()
