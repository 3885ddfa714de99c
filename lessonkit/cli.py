"""The ``lessonkit`` command line: ``vram``, ``check`` and ``recommend``.

Exit codes: 0 success (for ``vram --gpu``: it fits), 1 does not fit / no usable GPU with
``--require-gpu``, 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .errors import LessonkitError

EXIT_OK, EXIT_NO, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 too; keep its usage line short
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"lessonkit: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lessonkit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    add_vram_arguments(sub.add_parser("vram", help="estimate the GPU memory of a fine-tuning run"))
    add_check_arguments(sub.add_parser("check", help="check this machine's GPU and what it can fine-tune"))
    add_recommend_arguments(sub.add_parser("recommend", help="rank GPUs and environments for a run"))
    return parser


VRAM_EPILOG = """exit codes:
  0  estimated (with --gpu: it fits on that GPU)
  1  with --gpu: it does not fit
  2  bad input (an unknown name, a size out of range)

example: lessonkit vram --model llama-2-7b --method qlora --batch-size 4 --seq-len 1024 --gpu t4"""


def add_vram_arguments(parser: argparse.ArgumentParser) -> None:
    from .options import ATTENTION, LORA_DTYPES, METHODS, OPTIMIZERS, PRECISIONS

    parser.description = ("Estimate the peak GPU memory of one fine-tuning step (per GPU), "
                          "broken down into weights, gradients, optimizer states, activations "
                          "and the rest.")
    parser.epilog = VRAM_EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--model", required=True,
                        help="a preset (llama-2-7b, qwen2.5-7b, ...), a size (7B) or a config.json")
    parser.add_argument("--method", default="full", help=f"one of {', '.join(METHODS)} (default: full)")
    parser.add_argument("--precision", default="bf16-mixed",
                        help=f"one of {', '.join(PRECISIONS)} (default: bf16-mixed)")
    parser.add_argument("--optimizer", default="adamw",
                        help=f"one of {', '.join(OPTIMIZERS)} (default: adamw)")
    parser.add_argument("--batch-size", type=int, default=1, help="sequences per step (default: 1)")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per sequence (default: 512)")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--gradient-accumulation", type=int, default=1, metavar="STEPS")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--lora-targets", default="q_proj,v_proj",
                        help="comma-separated module names, or all-linear (default: q_proj,v_proj)")
    parser.add_argument("--lora-dtype", default="fp32", help=f"one of {', '.join(LORA_DTYPES)}")
    parser.add_argument("--no-double-quant", action="store_true",
                        help="QLoRA without double quantization of the NF4 constants")
    parser.add_argument("--attention", default="sdpa", help=f"one of {', '.join(ATTENTION)}")
    parser.add_argument("--n-gpus", type=int, default=1)
    parser.add_argument("--zero-stage", type=int, default=0, help="ZeRO stage 0-3 (default: 0)")
    parser.add_argument("--offload-optimizer", action="store_true",
                        help="optimizer states in CPU RAM (needs --zero-stage 1-3)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--gpu", help="say whether it fits on this GPU (e.g. t4, 'A100 80GB')")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(handler=run_vram)


def run_vram(args: argparse.Namespace) -> int:
    import json

    from .vram import estimate

    targets = args.lora_targets.strip()
    if targets != "all-linear":
        targets = tuple(t.strip() for t in targets.split(",") if t.strip())
    gpu = None
    if args.gpu is not None:
        from .gpus import get_gpu

        gpu = get_gpu(args.gpu)  # an unknown name is bad input, before any arithmetic
    report = estimate(
        args.model, method=args.method, precision=args.precision, optimizer=args.optimizer,
        batch_size=args.batch_size, seq_len=args.seq_len,
        gradient_checkpointing=args.gradient_checkpointing, lora_rank=args.lora_rank,
        lora_targets=targets, n_gpus=args.n_gpus, zero_stage=args.zero_stage,
        attention=args.attention, offload_optimizer=args.offload_optimizer,
        double_quant=not args.no_double_quant, lora_dtype=args.lora_dtype,
        gradient_accumulation=args.gradient_accumulation, device=args.device)
    fits = None if gpu is None else report.fits(gpu.usable_bytes)
    if args.json:
        data = report.to_dict()
        if gpu is not None:
            data["gpu"] = {"name": gpu.name, "memory_bytes": gpu.memory_bytes,
                           "usable_bytes": gpu.usable_bytes, "fits": fits}
        print(json.dumps(data, indent=2, default=str))
    else:
        print(report)
        if gpu is not None:
            need, have = report.total_bytes / 1e9, gpu.usable_bytes / 1e9
            verdict = "fits" if fits else "does NOT fit"
            print(f"\n{gpu.name}: {have:.1f} GB usable of {gpu.memory_gb:g} GB; this run needs "
                  f"{need:.1f} GB per GPU: it {verdict}"
                  + ("" if fits else f" (short by {need - have:.1f} GB)") + ".")
    return EXIT_NO if fits is False else EXIT_OK


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(handler=run_check)


def run_check(args: argparse.Namespace) -> int:
    raise LessonkitError("lessonkit check is not built yet")


def add_recommend_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(handler=run_recommend)


def run_recommend(args: argparse.Namespace) -> int:
    raise LessonkitError("lessonkit recommend is not built yet")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except LessonkitError as err:
        print(f"lessonkit {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
