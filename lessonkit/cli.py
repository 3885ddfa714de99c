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


def add_vram_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(handler=run_vram)


def run_vram(args: argparse.Namespace) -> int:
    raise LessonkitError("lessonkit vram is not built yet")


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
