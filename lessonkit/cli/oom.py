"""``lessonkit oom``: the OOM doctor on the command line (planning/oom.py).

The message is the argument, or is read from standard input (paste it, or pipe a log:
``python train.py 2>&1 | lessonkit oom --model 7B``). The run's settings take the same flags as
``lessonkit vram``. Exit codes: 0 an out-of-memory message was read and diagnosed, 1 the text is
not an out-of-memory message it knows, 2 bad input (the run's settings could not be estimated).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

OOM_EPILOG = """exit codes:
  0  an out-of-memory message was read (and the run's fixes found where settings were given)
  1  the text is not an out-of-memory message lessonkit knows
  2  bad input (an unknown model, GPU or setting)

examples:
  lessonkit oom "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of
    14.74 GiB of which 1.04 GiB is free. ..." --model llama-2-7b --method qlora --batch-size 8
  python train.py 2>&1 | lessonkit oom --model 7B --batch-size 4 --seq-len 2048"""
MAX_STDIN = 4_000_000  # characters read from standard input


def add_oom_arguments(
    parser: argparse.ArgumentParser, add_run_arguments: Callable[[argparse.ArgumentParser], None]
) -> None:
    """The run's settings are ``lessonkit vram``'s flags (``add_run_arguments`` adds them),
    with --model optional, and the message."""
    add_run_arguments(parser)
    parser.description = (
        "Read a PyTorch out-of-memory error and say what it shows and the "
        "cheapest changes that make the run fit on that GPU, each with its "
        "estimated peak."
    )
    parser.epilog = OOM_EPILOG
    for action in parser._actions:
        if action.dest == "model":
            action.required = False
            action.help = "the model that ran out of memory: a preset, a size (7B) or a config.json"
        elif action.dest == "gpu":
            action.help = "the GPU it ran on, when the message does not give its size (e.g. t4)"
        elif action.dest == "json":
            action.help = "print the diagnosis as JSON"
    parser.add_argument(
        "message", nargs="?", help="the error message or log (default: read from standard input)"
    )
    parser.set_defaults(handler=run_oom)


def run_oom(args: argparse.Namespace) -> int:
    from ..planning.oom import oom_doctor

    message = args.message
    if message is None:
        message = sys.stdin.read(MAX_STDIN)
    settings = {}
    if args.model is not None:
        targets = None if args.lora_targets is None else args.lora_targets.strip()
        if targets not in (None, "all-linear"):
            targets = tuple(t.strip() for t in targets.split(",") if t.strip())
        settings = dict(
            model=args.model,
            method=args.method,
            optimizer=args.optimizer,
            batch_size=args.batch_size,
            seq_len=args.seq_len,
            gradient_checkpointing=args.gradient_checkpointing,
            lora_rank=args.lora_rank,
            n_gpus=args.n_gpus,
            zero_stage=args.zero_stage,
            attention=args.attention,
            offload_optimizer=args.offload_optimizer,
            double_quant=not args.no_double_quant,
            lora_dtype=args.lora_dtype,
            gradient_accumulation=args.gradient_accumulation,
            device=args.device,
        )
        if targets is not None:
            settings["lora_targets"] = targets
        if args.precision is not None:
            settings["precision"] = args.precision
        else:  # the method's usual precision, as `lessonkit vram` takes it
            from ..options import METHODS
            from ..planning.fitting import usual_precision

            if args.method in METHODS:
                settings["precision"] = usual_precision(args.method)
    diagnosis = oom_doctor(message, gpu=args.gpu, **settings)
    print(json.dumps(diagnosis.to_dict(), indent=2) if args.json else diagnosis)
    if not diagnosis.recognized:
        return 1
    return (
        2
        if diagnosis.problems
        and any(p.startswith(("Could not estimate", "Unknown")) for p in diagnosis.problems)
        else 0
    )
