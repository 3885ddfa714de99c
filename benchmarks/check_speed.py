"""Slowest exercises.check() over every question id, per kind of odd answer (target: under 1 s).

The answers that once raised or hung: a 5000-digit integer, 10 MB strings (digits, spaces,
separators), a number padded with 10,000 spaces, a million-item list, an object whose methods
raise, and student functions that loop forever, hold the interpreter in one long C call (a
regex that takes 39 s), call sys.exit or print 10 MB. Question 05.1 runs a function in a
process of its own: the honest function's time is mostly that process's start (a fork).

Usage: python benchmarks/check_speed.py
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lessonkit.exercises.checking import check, question_ids


class Raises:
    def __repr__(self):
        raise RuntimeError

    def __float__(self):
        raise RuntimeError

    def __getattr__(self, name):
        raise RuntimeError

    def __iter__(self):
        raise RuntimeError


def loops_forever():
    while True:
        pass


def calls_exit():
    sys.exit(1)


def prints_ten_megabytes():
    print("1" * 10_000_000)


def holds_the_interpreter():
    re.fullmatch("(a+)+b", "a" * 26)


def checks_the_gpu():
    import torch

    if not torch.cuda.is_available():
        print("No GPU")
        return
    print(f"Total VRAM: {torch.cuda.get_device_properties(0).total_memory / 1e9:.2f} GB")


ANSWERS = {
    "a right answer (13.48 GB)": "13.48 GB",
    "5000-digit integer": 10**5000,
    "'1' + 10,000 spaces + 'x'": "1" + " " * 10_000 + "x",
    "10 MB of digits": "1" * 10_000_000,
    "10 MB of '1-'": "1-" * 5_000_000,
    "10 MB of spaces, then 5": " " * 10_000_000 + "5",
    "a million-item list": [1] * 1_000_000,
    "an object whose methods raise": Raises(),
    "a function that loops forever": loops_forever,
    "a function that calls sys.exit": calls_exit,
    "a function that prints 10 MB": prints_ten_megabytes,
    "a function in one 39 s regex": holds_the_interpreter,
    "a right function (05.1)": checks_the_gpu,
}


def main() -> None:
    print(f"{'answer':<36}{'slowest':>10}  question")
    worst = 0.0
    for label, answer in ANSWERS.items():
        slowest, where = 0.0, ""
        for qid in question_ids():
            start = time.perf_counter()
            check(qid, answer, show=False)
            took = time.perf_counter() - start
            if took > slowest:
                slowest, where = took, qid
        worst = max(worst, slowest)
        print(f"{label:<36}{slowest * 1e3:>8.1f}ms  {where}")
    print(f"slowest check of any answer: {worst * 1e3:.0f} ms (target < 1000 ms)")
    from lessonkit.exercises.student_process import start_method

    print(f"(student functions run in a process of their own: {start_method()})")


if __name__ == "__main__":
    main()
