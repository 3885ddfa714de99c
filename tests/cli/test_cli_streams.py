"""Every command ends with at most one line and its documented exit code, whatever its standard
streams are: closed (``<&-``, ``>&-``, ``2>&-``), undecodable bytes on standard input under a
strict UTF-8 locale, or an output encoding that cannot write every character."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OOM = (
    "CUDA out of memory. Tried to allocate 1002.00 MiB. GPU 0 has a total capacity of 14.74 GiB "
    "of which 382.12 MiB is free. Of the allocated memory 13.97 GiB is allocated by PyTorch, and "
    "262.21 MiB is reserved by PyTorch but unallocated."
)
COMMANDS = {
    "vram": ["vram", "--model", "7B", "--gpu", "t4"],
    "check": ["check"],
    "recommend": ["recommend", "--model", "7B", "--platform", "colab"],
    "oom": ["oom", OOM],
    "help": ["--help"],
    "vram help": ["vram", "--help"],
}
pytestmark = pytest.mark.skipif(os.name != "posix", reason="closes descriptors with sh")


def shell(command: list[str], redirect: str, stdin: bytes | None = None, **env: str):
    """Run ``python -m lessonkit COMMAND`` under sh with ``redirect`` (e.g. '>&-')."""
    line = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "lessonkit", *command])
    return subprocess.run(
        ["sh", "-c", f"exec {line} {redirect}"],
        input=stdin,
        capture_output=True,
        timeout=300,
        cwd=ROOT,
        env=os.environ | env,
    )


def one_line(text: bytes) -> str:
    lines = text.decode("utf-8", "replace").strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], text.decode()[-3000:]
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_standard_output_closed_is_a_write_error_in_one_line(command):
    result = shell(command, ">&-")
    assert result.returncode == 3, result.stderr.decode()[-3000:]
    assert "cannot write the output: standard output is closed" in one_line(result.stderr)


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_standard_output_and_error_closed_still_give_the_exit_code(command):
    result = shell(command, ">&- 2>&-")
    assert result.returncode == 3


def test_standard_error_closed_keeps_the_output_and_the_code():
    result = shell(["vram", "--model", "nosuch-model"], "2>&-")
    assert result.returncode == 2 and result.stdout == b""
    result = shell(["vram", "--model", "7B"], "2>&-")
    assert result.returncode == 0 and b"Peak per GPU" in result.stdout


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_standard_input_closed_changes_nothing_for_commands_that_do_not_read_it(command):
    result = shell(command, "<&-")
    assert result.returncode in (0, 1), result.stderr.decode()[-3000:]
    assert b"Traceback" not in result.stderr


def test_oom_with_standard_input_closed_says_so_in_one_line():
    result = shell(["oom"], "<&-")
    assert result.returncode == 2 and result.stdout == b""
    line = one_line(result.stderr)
    assert line.startswith("lessonkit oom: error: no message to read: standard input is closed")


class FailingInput:
    """Standard input whose reading fails (a device error, a descriptor gone bad)."""

    encoding = "utf-8"

    def isatty(self) -> bool:
        return False

    def read(self, size: int = -1) -> str:
        raise OSError(5, "Input/output error")


def test_oom_when_standard_input_cannot_be_read_says_so_in_one_line(monkeypatch, capsys):
    from lessonkit.cli.main import main

    monkeypatch.setattr(sys, "stdin", FailingInput())
    assert main(["oom"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == (
        "lessonkit oom: error: cannot read standard input: Input/output error. Give the "
        "message as the argument instead."
    )


def test_undecodable_bytes_on_standard_input_are_read_around():
    log = b"step 1 \xff\xfe\x80 loss\n" + OOM.encode() + b"\n\xc3\x28 done\n"
    result = shell(["oom"], "", stdin=log, PYTHONIOENCODING="utf-8:strict", LC_ALL="C.UTF-8")
    assert result.returncode == 0 and not result.stderr, result.stderr.decode()[-3000:]
    assert b"it tried to allocate 1,002 MiB" in result.stdout


def test_an_output_encoding_that_cannot_write_a_character_escapes_it():
    result = shell(["vram", "--model", "ÿ-7b"], "", PYTHONIOENCODING="ascii:strict")
    assert result.returncode == 2
    assert "Unknown model" in one_line(result.stderr)
    result = shell(["oom", "CUDA out of memory. ÿ"], "", PYTHONIOENCODING="ascii:strict")
    assert result.returncode == 0 and b"Traceback" not in result.stderr


def test_a_usage_error_with_standard_output_closed_is_still_a_usage_error():
    result = shell(["vram"], ">&-")
    assert result.returncode == 2 and b"Traceback" not in result.stderr
