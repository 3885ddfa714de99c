"""A model path that is a FIFO, a device or a socket is never read: opening a FIFO waits for a
writer, reading /dev/zero never ends. Each call runs in a subprocess with a timeout that only
guards against a hang."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD = 120
pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD, cwd=ROOT
    )


def estimate_of(path: Path) -> subprocess.CompletedProcess:
    return python(
        "import lessonkit\n"
        "try:\n"
        f"    lessonkit.estimate({str(path)!r})\n"
        "except lessonkit.LessonkitError as err:\n"
        "    print(err)\n"
        "else:\n"
        "    print('read')\n"
    )


def special_files(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    folder = tmp_path / "model"
    folder.mkdir()
    os.mkfifo(folder / "config.json")
    sock_path = tmp_path / "s.json"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    return {
        "a FIFO": fifo,
        "a folder whose config.json is a FIFO": folder,
        "a link to a FIFO": _link(tmp_path / "link.json", fifo),
        "a socket": sock_path,
        "/dev/zero": Path("/dev/zero"),
        "/dev/null": Path("/dev/null"),
    }


def _link(link: Path, target: Path) -> Path:
    link.symlink_to(target)
    return link


@pytest.mark.parametrize(
    "kind",
    [
        "a FIFO",
        "a folder whose config.json is a FIFO",
        "a link to a FIFO",
        "a socket",
        "/dev/zero",
        "/dev/null",
    ],
)
def test_estimate_never_reads_a_file_that_is_not_a_regular_file(tmp_path, kind):
    path = special_files(tmp_path)[kind]
    if not path.exists() and not path.is_symlink():
        pytest.skip(f"{path} is not on this system")
    result = estimate_of(path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "not a regular file" in result.stdout, result.stdout


@pytest.mark.parametrize("command", [["check"], ["vram"], ["recommend"], ["oom", "x"]])
def test_the_cli_never_reads_a_fifo_as_the_model(tmp_path, command):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    result = subprocess.run(
        [sys.executable, "-m", "lessonkit", *command, "--model", str(fifo)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        cwd=ROOT,
    )
    assert result.returncode in (1, 2), result.stderr[-2000:]
    if command[0] != "oom":  # the doctor reads the message first: not an OOM message, exit 1
        assert "not a regular file" in result.stderr and "Traceback" not in result.stderr
