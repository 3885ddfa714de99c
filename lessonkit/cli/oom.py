"""``lessonkit oom``: the OOM doctor on the command line (planning/oom.py).

The message is the argument, or is read from standard input (paste it, or pipe a log:
``python train.py 2>&1 | lessonkit oom --model 7B``): all of it, however long, as a stream (the
last error wins), so that the program writing the log never finds the pipe closed. Bytes that
are not text in the locale's encoding are read as U+FFFD. The run's settings take the same
flags as ``lessonkit vram``. Exit codes: see OOM_EPILOG.
"""

from __future__ import annotations

import argparse
import codecs
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import LessonkitError

OOM_EPILOG = """exit codes:
  0  an out-of-memory message was read (and the run's fixes found where settings were given)
  1  the text is not an out-of-memory message lessonkit knows
  2  bad input (an unknown model, GPU or setting; no message: standard input closed)
  3  the output could not be written (e.g. a full disk)

examples:
  lessonkit oom "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of
    14.75 GiB of which 1.04 GiB is free. ..." --model llama-2-7b --method qlora --batch-size 8
  python train.py 2>&1 | lessonkit oom --model 7B --batch-size 4 --seq-len 2048"""
CHUNK_BYTES = 2**20  # bytes of standard input read at a time


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


def read_standard_input() -> Any:
    """The last out-of-memory error of everything on standard input (an OOMMessage, or None),
    read to its end in pieces."""
    from ..planning.oom_messages import read_log

    stream = sys.stdin
    if stream is None:
        raise LessonkitError(
            "no message to read: standard input is closed. Give the message as the argument, "
            "or pipe a log in (python train.py 2>&1 | lessonkit oom)."
        )
    if _is_terminal(stream):
        print(
            "Paste the error message or log, then press Ctrl-D (Ctrl-Z and Enter on Windows):",
            file=sys.stderr,
        )
    try:
        return read_log(_pieces(stream))
    except OSError as err:
        raise LessonkitError(
            f"cannot read standard input: {err.strerror or err}. Give the message as the "
            "argument instead."
        ) from None


def _pieces(stream: Any) -> Iterator[str]:
    """Standard input to its end, in pieces of text; bytes that are not text in its encoding
    become U+FFFD."""
    source = getattr(stream, "buffer", None)
    if source is None:  # a text stream without bytes under it
        while piece := stream.read(CHUNK_BYTES):
            yield piece
        return
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
    except LookupError:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while chunk := source.read(CHUNK_BYTES):
        yield decoder.decode(chunk)
    yield decoder.decode(b"", final=True)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (OSError, ValueError, AttributeError):
        return False


def run_oom(args: argparse.Namespace) -> int:
    from ..planning.oom import oom_doctor

    message = args.message
    if message is None:
        message = read_standard_input()
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
        if args.precision is not None:  # else the method's usual one, as estimate() takes it
            settings["precision"] = args.precision
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
