"""The ``lessonkit`` command line: ``vram``, ``check``, ``recommend`` and ``oom``.

Exit codes: 0 success (for ``vram --gpu``: it fits), 1 does not fit / no usable GPU with
``--require-gpu``, 2 bad input, 3 the output could not be written (e.g. a full disk, or standard
output closed). Every command ends with at most one line on standard error, never a traceback,
whatever its standard streams are: closed, a pipe whose reader left, or an encoding that cannot
write every character (those are written as escapes).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from ..errors import LessonkitError
from ..units import GiB

EXIT_OK, EXIT_NO, EXIT_USAGE, EXIT_WRITE = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse exits 2 too; keep its usage line short
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"lessonkit: error: {message}\n")

    def print_help(self, file: Any = None) -> None:
        # argparse drops write errors of --help silently; let main() report them
        (file or sys.stdout).write(self.format_help())


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lessonkit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    add_vram_arguments(sub.add_parser("vram", help="estimate the GPU memory of a fine-tuning run"))
    add_check_arguments(
        sub.add_parser("check", help="check this machine's GPU and what it can fine-tune")
    )
    add_recommend_arguments(
        sub.add_parser("recommend", help="rank GPUs and environments for a run")
    )
    from .oom import add_oom_arguments

    add_oom_arguments(
        sub.add_parser("oom", help="diagnose a PyTorch out-of-memory error"), add_vram_arguments
    )
    return parser


VRAM_EPILOG = """exit codes:
  0  estimated (with --gpu: it fits on that GPU)
  1  with --gpu: it does not fit
  2  bad input (an unknown name, a size out of range)
  3  the output could not be written (e.g. a full disk)

example: lessonkit vram --model llama-2-7b --method qlora --batch-size 4 --seq-len 1024 \\
  --gradient-checkpointing --gpu t4"""


def add_vram_arguments(parser: argparse.ArgumentParser) -> None:
    from ..options import ATTENTION, BNB_BEHAVIOURS, LORA_DTYPES, METHODS, OPTIMIZERS, PRECISIONS

    parser.description = (
        "Estimate the peak GPU memory of one fine-tuning step (per GPU), "
        "broken down into weights, gradients, optimizer states, activations "
        "and the rest."
    )
    parser.epilog = VRAM_EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--model",
        required=True,
        help="a preset (llama-2-7b, qwen2.5-7b, ...), a size (7B) or a config.json",
    )
    parser.add_argument(
        "--method", default="full", help=f"one of {', '.join(METHODS)} (default: full)"
    )
    parser.add_argument(
        "--precision",
        default=None,
        help=f"one of {', '.join(PRECISIONS)} (default: the method's usual "
        "precision, as in estimate(): bf16-mixed for full, bf16 for lora and qlora; "
        "fp16-mixed for full on a --gpu without native bf16, said in the output)",
    )
    parser.add_argument(
        "--optimizer", default="adamw", help=f"one of {', '.join(OPTIMIZERS)} (default: adamw)"
    )
    parser.add_argument("--batch-size", type=int, default=1, help="sequences per step (default: 1)")
    parser.add_argument(
        "--seq-len", type=int, default=512, help="tokens per sequence (default: 512)"
    )
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--gradient-accumulation", type=int, default=1, metavar="STEPS")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument(
        "--lora-targets",
        default=None,
        help="comma-separated module names, or all-linear (default: peft's "
        "default for the model: q_proj,v_proj; c_attn on GPT-2); lm_head and "
        "embed_tokens put LoRA on an untied output head and the token embeddings; "
        "on a mixture of experts, experts (or experts.gate_up_proj, experts.down_proj) "
        "puts it on the experts' weights",
    )
    parser.add_argument("--lora-dtype", default="fp32", help=f"one of {', '.join(LORA_DTYPES)}")
    parser.add_argument(
        "--lora-dropout",
        type=float,
        default=0.0,
        metavar="P",
        help="peft's lora_dropout (default: 0.0, peft's default; recipes often use 0.05-0.1)",
    )
    parser.add_argument(
        "--bitsandbytes",
        default="current",
        help=f"QLoRA's bitsandbytes behaviour: {', '.join(BNB_BEHAVIOURS)} "
        "(default: current, 0.43.2 and later)",
    )
    parser.add_argument(
        "--no-double-quant",
        action="store_true",
        help="QLoRA without double quantization of the NF4 constants",
    )
    parser.add_argument("--attention", default="sdpa", help=f"one of {', '.join(ATTENTION)}")
    parser.add_argument("--n-gpus", type=int, default=1)
    parser.add_argument("--zero-stage", type=int, default=0, help="ZeRO stage 0-3 (default: 0)")
    parser.add_argument(
        "--fsdp-version",
        type=int,
        default=2,
        help="with --zero-stage 3: 2 (FSDP2's per-parameter shards, default) or 1 (FSDP1's "
        "flat parameter per decoder layer, as torchtune until 2025, Lightning and "
        "Accelerate ran it)",
    )
    parser.add_argument(
        "--offload-optimizer",
        action="store_true",
        help="optimizer states in CPU RAM (needs --zero-stage 1-3)",
    )
    parser.add_argument(
        "--activation-offload",
        action="store_true",
        help="copy what the decoder saves for backward to CPU RAM, lm_head's saved tensors "
        "kept on the GPU (TRL's activation_offloading, torchtune's "
        "enable_activation_offloading); needs --gradient-checkpointing",
    )
    parser.add_argument(
        "--optimizer-in-backward",
        action="store_true",
        help="step each parameter as its gradient is made and free it (torchtune's "
        "optimizer_in_bwd); needs --gradient-accumulation 1 and one GPU",
    )
    parser.add_argument(
        "--no-sync",
        action="store_true",
        help="with several GPUs and --gradient-accumulation, reduce gradients "
        "only on the last micro-batch (FSDP's no_sync, the Trainer's "
        "default); under --zero-stage 3 each GPU then keeps full, "
        "unsharded gradients (no memory change for ZeRO-0/1)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile each decoder layer (as torchtune's compile=True): the layers "
        "save what AOTAutograd's partitioner keeps; llama, mistral, qwen2, qwen3, gemma, "
        "phi3, olmo2, smollm3, granite; full or LoRA, --precision bf16 or bf16-mixed; "
        "with --gradient-checkpointing, --optimizer-in-backward and --activation-offload too; "
        "one GPU, DDP, --zero-stage 1 or 3 (FSDP2); with --loss chunked each "
        "chunk's cross-entropy is compiled too (torchtune's compile_loss)",
    )
    parser.add_argument(
        "--loss",
        default="standard",
        help="standard (the full logits in fp32, default) or chunked (torchtune's "
        "CEWithChunkedOutputLoss)",
    )
    parser.add_argument(
        "--loss-chunks",
        type=int,
        default=8,
        metavar="N",
        help="chunks of the chunked loss (default: 8, as torchtune)",
    )
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--gpu", help="say whether it fits on this GPU (e.g. t4, 'A100 80GB')")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(handler=run_vram)


def run_vram(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from ..errors import choose
    from ..memory.estimating import estimate
    from ..memory.settings import usual_precision
    from ..options import METHODS
    from ..planning.fitting import vram_fixes

    targets = None if args.lora_targets is None else args.lora_targets.strip()
    if targets not in (None, "all-linear"):
        targets = tuple(t.strip() for t in targets.split(",") if t.strip())
    gpu = None
    if args.gpu is not None:
        from ..hardware.gpus import get_gpu

        gpu = get_gpu(args.gpu)  # an unknown name is bad input, before any arithmetic
    method = choose(args.method, METHODS, "method")
    precision = args.precision
    note = ""
    if precision is None:  # the method's usual precision, as estimate() takes it
        native = bool(gpu.native_bf16) if gpu is not None else True
        precision = usual_precision(method, native)
        if gpu is not None and not native:
            note = precision_note(gpu.name, method)
    settings = dict(
        method=method,
        precision=precision,
        optimizer=args.optimizer,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        gradient_checkpointing=args.gradient_checkpointing,
        lora_rank=args.lora_rank,
        lora_targets=targets,
        n_gpus=args.n_gpus,
        zero_stage=args.zero_stage,
        attention=args.attention,
        offload_optimizer=args.offload_optimizer,
        double_quant=not args.no_double_quant,
        lora_dtype=args.lora_dtype,
        gradient_accumulation=args.gradient_accumulation,
        device=args.device,
        lora_dropout=args.lora_dropout,
        bitsandbytes=args.bitsandbytes,
        activation_offload=args.activation_offload,
        optimizer_in_backward=args.optimizer_in_backward,
        loss=args.loss,
        loss_chunks=args.loss_chunks,
        no_sync=args.no_sync,
        fsdp_version=args.fsdp_version,
        compile=args.compile,
    )
    report = estimate(args.model, **settings)
    fits = None if gpu is None else report.fits(gpu.usable_bytes)
    fixes = (
        []
        if gpu is None or fits
        else vram_fixes(args.model, settings, gpu.usable_bytes, native_bf16=bool(gpu.native_bf16))
    )
    if args.json:
        data = report.to_dict()
        if gpu is not None:
            data["gpu"] = {
                "name": gpu.name,
                "memory_bytes": gpu.memory_bytes,
                "usable_bytes": gpu.usable_bytes,
                "fits": fits,
                "fixes": [{"flags": flags, "total_bytes": fix.total_bytes} for flags, fix in fixes],
            }
            data["gpu"]["precision_note"] = note
        print(json.dumps(data, indent=2, default=str))
        return EXIT_NO if fits is False else EXIT_OK
    print(dataclasses.replace(report, assumptions=[]))
    if note:
        print(f"\n{note}")
    if gpu is not None:
        need, have = report.total_bytes / GiB, gpu.usable_bytes / GiB
        verdict = "fits" if fits else "does NOT fit"
        # Memory in GiB, as cards are sized and as PyTorch reports it (units.MEMORY_UNITS).
        print(
            f"\n{gpu.name} ({gpu.memory_gb:g} GB card): {have:.2f} GiB usable; this run needs "
            f"{need:.2f} GiB per GPU: it {verdict}"
            + (
                f" ({have - need:.2f} GiB to spare)"
                if fits
                else f" (short by {need - have:.2f} GiB)"
            )
            + "."
        )
        for flags, fix in fixes:
            print(
                f"  It fits {'' if flags.startswith('without ') else 'with '}{flags}: "
                f"{fix.total_bytes / GiB:.2f} GiB per GPU "
                f"({(gpu.usable_bytes - fix.total_bytes) / GiB:.2f} GiB to spare)."
            )
        if not fits and not fixes:
            print(
                "  No single change tried here makes it fit (checkpointing, a smaller batch, "
                "an 8-bit optimizer, LoRA/QLoRA, ZeRO-3 on up to 8 GPUs); "
                "`lessonkit recommend` ranks the setups that do."
            )
    if report.assumptions:
        print("\nAssumptions:")
        print("\n".join(f"  - {note}" for note in report.assumptions))
    return EXIT_NO if fits is False else EXIT_OK


def precision_note(gpu_name: str, method: str) -> str:
    """What the default precision becomes on a GPU without native bf16, in one sentence."""
    if method == "full":
        return (
            f"Precision fp16-mixed: the {gpu_name} has no native bf16, so full fine-tuning runs "
            "under fp16 autocast (the same memory as the usual bf16-mixed; --precision sets "
            "another)."
        )
    return (
        f"Precision bf16 stands for 16-bit base weights: the {gpu_name} has no native bf16, so "
        "load the model in fp16 (torch_dtype=torch.float16), the same memory."
    )


CHECK_EPILOG = """exit codes:
  0  the check ran (with --require-gpu: a GPU passed the one-kernel test)
  1  --require-gpu was given and there is no usable GPU
  2  bad input (e.g. an unknown --model)
  3  the output could not be written (e.g. a full disk)

The check never crashes: a missing torch, a CPU-only wheel, an old driver, a GPU without
kernels in the wheel and the like are reported with a fix-it hint."""


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Check this machine's GPUs (memory, compute capability, native bf16, "
        "drivers, a one-kernel smoke test) and say what the model can be "
        "fine-tuned with here, or where to go instead."
    )
    parser.epilog = CHECK_EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--model",
        default="7B",
        help="model for the verdict: a preset name or a size such as 7B (default: 7B)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--require-gpu",
        action="store_true",
        help="exit with 1 when no GPU is usable (for scripts and CI)",
    )
    parser.set_defaults(handler=run_check)


def run_check(args: argparse.Namespace) -> int:
    from ..health.check import check_gpu_health
    from ..models.presets import resolve_model

    resolve_model(args.model)  # an unknown model is bad input (exit 2), not a report
    report = check_gpu_health(args.model)
    print(report.to_json() if args.json else report)
    return EXIT_NO if args.require_gpu and not report.has_usable_gpu else EXIT_OK


RECOMMEND_EPILOG = """budget: dollars per hour for the whole setup (2.5 or '$2.5/h'), or free, low
(at most $2/h) or high (no limit). With no budget or high, buying a workstation is compared
(its price spread over its working hours); a cost per hour leaves it out, and says so.
platform: an environment (colab, kaggle, lambda, runpod, vast.ai, sagemaker, vertex, azure,
local) or a tier (hobbyist, engineer, enterprise).

exit codes:
  0  at least one setup fits
  1  nothing in the catalog fits within the constraints
  2  bad input (unknown model, method, GPU or platform; negative budget; zero tokens)
  3  the output could not be written (e.g. a full disk)"""


def add_recommend_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Rank environments, GPUs and methods for fine-tuning a model: setups "
        "that fit first, then the cheapest, each explained."
    )
    parser.epilog = RECOMMEND_EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--model", default="7B", help="a preset name or a size such as 7B (default: 7B)"
    )
    parser.add_argument("--method", help="full, lora or qlora (default: all three)")
    parser.add_argument("--budget", help="dollars per hour, or free / low / high")
    parser.add_argument("--platform", help="an environment or a tier")
    parser.add_argument(
        "--tokens", help="training tokens (e.g. 50M) for the time and cost of the run"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=4,
        help="sequences per step to try first (default: 4; halved until it fits)",
    )
    parser.add_argument(
        "--seq-len", type=int, default=512, help="tokens per sequence (default: 512)"
    )
    parser.add_argument(
        "--mfu",
        type=float,
        default=0.35,
        help="model-FLOPs utilisation assumed for the time (default: 0.35)",
    )
    parser.add_argument("--limit", type=int, default=10, help="options to print (default: 10)")
    parser.add_argument("--json", action="store_true", help="print every option as JSON")
    parser.set_defaults(handler=run_recommend)


def run_recommend(args: argparse.Namespace) -> int:
    from ..planning.recommender import recommend

    rec = recommend(
        args.model,
        method=args.method,
        budget=args.budget,
        platform=args.platform,
        tokens=args.tokens,
        mfu=args.mfu,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
    )
    print(rec.to_json() if args.json else rec.text(max(args.limit, 0)))
    return EXIT_OK if rec.options else EXIT_NO


class _ClosedOutput:
    """Standard output when the command was started with it closed (``>&-``): every write
    fails as writing to a closed file descriptor does, and is reported once (exit 3)."""

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed")

    def flush(self) -> None:  # nothing is ever buffered
        pass


def _standard_streams() -> None:
    """Closed standard streams (started with ``<&-``, ``>&-``, ``2>&-``) get /dev/null on their
    file descriptor, so that no file opened later takes it; standard output then fails on
    write (``_ClosedOutput``). Output that the encoding cannot write is escaped."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        if getattr(sys, name) is None:
            try:
                os.fstat(fd)
            except OSError:
                try:
                    null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
                    if null != fd:
                        os.dup2(null, fd)
                        os.close(null)
                except OSError:
                    pass
    if sys.stdout is None:
        sys.stdout = _ClosedOutput()  # type: ignore[assignment,unused-ignore]
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]


def _error(text: str) -> None:
    """One line on standard error, when there is one to write to."""
    if sys.stderr is not None:
        with contextlib.suppress(OSError, ValueError):
            print(text, file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    _standard_streams()
    try:
        args = build_parser().parse_args(argv)
    except BrokenPipeError:
        return _reader_gone()
    except OSError as err:  # --help into a full disk
        return _write_failed("lessonkit", err)
    except SystemExit:  # --help or a usage error: argparse has written what it had to say
        code = _flush("lessonkit")
        if code is not None:
            return code
        raise
    try:
        code = args.handler(args)
    except LessonkitError as err:
        _error(f"lessonkit {args.command}: error: {err}")
        return EXIT_USAGE
    except BrokenPipeError:
        return _reader_gone()
    except OSError as err:  # the output cannot be written (`> /dev/full`)
        return _write_failed(f"lessonkit {args.command}", err)
    flushed = _flush(f"lessonkit {args.command}")
    return code if flushed is None else flushed


def _flush(command: str) -> int | None:
    """Write out what is buffered now, so that a write error is reported here, once, rather
    than as a traceback at exit; None when all went well, else the exit code."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return _reader_gone()
    except OSError as err:
        return _write_failed(command, err)
    return None


def _discard_output() -> None:
    """What is still buffered would fail again at exit: send it nowhere."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no file descriptor under it
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (kept open until exit)


def _reader_gone() -> int:
    # The reader went away (e.g. `lessonkit recommend ... | head`): stop quietly.
    _discard_output()
    return EXIT_OK


def _write_failed(command: str, err: OSError) -> int:
    _discard_output()
    _error(f"{command}: error: cannot write the output: {err.strerror or err}.")
    return EXIT_WRITE


if __name__ == "__main__":
    sys.exit(main())
