"""Question 05.1 runs a student's function in a process of its own: each way a function once
escaped the checker (one long C call, code still running after check returned, files, a fake
torch left in sys.modules, the checker's tables rewritten) is a test here, with fork (Linux)
and with a fresh interpreter (what macOS and Windows get). The nbgrader case is in
test_nbgrader.py."""

from __future__ import annotations

import os
import re
import sys
import time
import types
from pathlib import Path

import pytest

from lessonkit.exercises import student_process
from lessonkit.exercises.checking import answer_key, check

METHODS = ["fork", "spawn"] if hasattr(os, "fork") else ["spawn"]
GIB = 2**30


@pytest.fixture(params=METHODS)
def method(request, monkeypatch) -> str:
    """Every test runs with each way of starting the function's process."""
    monkeypatch.setattr(student_process, "start_method", lambda: request.param)
    return request.param


def right():
    import torch

    def check_gpu_health():
        if not torch.cuda.is_available():
            print("No GPU detected.")
            return
        total = torch.cuda.get_device_properties(0).total_memory
        print(f"Total VRAM: {total / 1e9:.2f} GB")

    return check_gpu_health


# ----- what an honest function gets: the same feedback as before ----------------------------
def total_gib(torch) -> float:
    return torch.cuda.get_device_properties(0).total_memory / GIB


def uses_a_helper_and_a_constant():
    import torch

    if not torch.cuda.is_available():
        print("none")
        return
    print(f"{total_gib(torch):.2f} GiB")


def test_a_right_function_passes_with_its_helpers(method):
    assert check("05.1", right(), show=False).status == "correct"
    assert check("05.1", uses_a_helper_and_a_constant, show=False).status == "correct"


def test_honest_mistakes_keep_their_feedback(method):
    def labels_gib_as_gb():
        import torch

        if not torch.cuda.is_available():
            print("no GPU")
            return
        print(f"{torch.cuda.get_device_properties(0).total_memory / 1024**3:.2f} GB")

    def calls_the_guides_function():
        import torch

        print(torch.cuda.get_total_memory(0))

    def needs_a_gpu():
        import torch

        print(f"{torch.cuda.get_device_properties(0).total_memory / 1e9:.2f} GB")

    result = check("05.1", labels_gib_as_gb, show=False)
    assert result.status == "not yet" and any("label it GiB" in d for d in result.details)
    result = check("05.1", calls_the_guides_function, show=False)
    assert "AttributeError" in result.details[0] and "get_total_memory" in result.details[0]
    result = check("05.1", needs_a_gpu, show=False)
    assert result.details[:2] == [d.replace("✘", "✔").split(":")[0] for d in result.details[:2]]
    assert "without a GPU" in result.details[2] and "RuntimeError" in result.details[2]


def test_input_and_exit_are_feedback(method):
    def asks():
        input("GPU? ")

    def exits():
        os._exit(0)

    def crashes():
        import ctypes

        ctypes.string_at(0)

    assert (
        "EOFError: a check gives the function no input"
        in check("05.1", asks, show=False).details[0]
    )
    ended = check("05.1", exits, show=False).details
    assert "ended the Python running it with status 0 before it returned" in ended[0]
    assert "not run" in ended[1]
    assert (
        "crashed the Python running it (SIGSEGV)" in check("05.1", crashes, show=False).details[0]
    )


# ----- the escapes --------------------------------------------------------------------------
def holds_the_interpreter():
    re.fullmatch("(a+)+b", "a" * 28)  # one C call of 18 s to 3 min: no Python line to stop at


def test_one_long_c_call_is_stopped_at_the_limit(method):
    result = check("05.1", holds_the_interpreter, show=False)
    assert result.status == "not yet"
    assert result.details[0].endswith(
        "stopped after 0.6 s: it did not finish (an endless loop, a long computation, or "
        "waiting for something?)"
    ), result.details
    assert [d.split(": ", 1)[1] for d in result.details[1:]] == [
        "not run (the check stopped at the case above)"
    ] * 2


def _ended(pid: int) -> bool:
    """Gone, or a zombie waiting to be reaped: killed. Teardown after SIGKILL takes a moment,
    so this waits for it, up to a hang guard of 30 s (not a speed check)."""
    stat = Path(f"/proc/{pid}/stat")
    give_up = time.monotonic() + 30
    while time.monotonic() < give_up:
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.01)
    return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("returns", [True, False], ids=["returns", "loops"])
def test_nothing_keeps_running_after_check_returns(method, returns, tmp_path):
    """A thread and a helper process started by the function end with its process."""
    log = str(tmp_path / "pids")  # text: what a fresh interpreter can be given

    def leaves_work_behind():
        import subprocess
        import threading

        helper = subprocess.Popen(["sleep", "60"])
        with open(log, "a") as out:
            out.write(f"{os.getpid()} {helper.pid}\n")

        def keep_writing():
            while True:
                with open(log, "a") as out:
                    out.write("")

        threading.Thread(target=keep_writing).start()
        while not returns:
            pass

    result = check("05.1", leaves_work_behind, show=False)
    pids = [int(p) for p in Path(log).read_text().split()]
    assert len(pids) == (6 if returns else 2), pids  # every case ran, or the first was stopped
    assert [pid for pid in pids if not _ended(pid)] == []
    assert returns or "stopped after 0.6 s" in result.details[0]


def test_files_written_to_relative_paths_land_in_a_folder_that_is_removed(method, tmp_path):
    where = str(tmp_path / "cwd")

    def writes_files():
        with open("notes.txt", "w") as out:
            out.write("x")
        with open(where, "w") as out:
            out.write(os.getcwd())

    assert not Path("notes.txt").exists()
    check("05.1", writes_files, show=False)
    assert not Path("notes.txt").exists()  # not in the notebook's folder
    folder = Path(Path(where).read_text())
    assert folder.name.startswith("lessonkit-check-") and not folder.exists()


def test_a_fake_torch_never_reaches_the_checkers_sys_modules(method):
    before = sys.modules.get("torch"), sys.modules.get("torch.cuda")

    def leaves_a_fake_torch():
        fake = types.ModuleType("torch")
        sys.modules["torch"] = sys.modules["torch.cuda"] = fake
        import builtins

        builtins.__import__ = lambda *args, **kwargs: fake

    check("05.1", leaves_a_fake_torch, show=False)
    assert (sys.modules.get("torch"), sys.modules.get("torch.cuda")) == before
    import math  # imports still work here

    assert math.pi > 3


def tampers_with_the_checker():
    """Every way to make the checker say correct, from inside the function it runs."""
    import lessonkit.exercises.answer_checks as answer_checks
    import lessonkit.exercises.check_result as check_result
    import lessonkit.exercises.checking as checking
    import lessonkit.exercises.expected as expected
    import lessonkit.exercises.student_code as student_code

    check_result.CheckResult.correct = property(lambda self: True)
    expected.EXPECTED["05.2"] = lambda: 123.0
    checking._CHECKERS["number"] = lambda qid, question, answer: check_result.CheckResult(
        qid, "", "correct", "correct"
    )
    answer_checks._check_number = checking._CHECKERS["number"]
    student_code._FUNCTION_TIME_LIMIT = 1e9
    print("Total VRAM: 15.84 GB")


def test_rewriting_the_checkers_tables_changes_nothing_here(method):
    expected = answer_key("05.2")
    result = check("05.1", tampers_with_the_checker, show=False)
    assert result.status == "not yet" and result.correct is False
    assert check("05.2", 123.0, show=False).correct is False
    assert answer_key("05.2") == expected
    assert check("05.2", expected, show=False).correct is True
    assert "stopped after 0.6 s" in check("05.1", holds_the_interpreter, show=False).details[0]


class LooksLikeAFunction:
    """Not a function: its attributes run code, which the checker must never call."""

    touched = False

    def __getattr__(self, name):
        type(self).touched = True
        return getattr(right(), name)

    def __call__(self):
        type(self).touched = True


def test_an_object_posing_as_a_function_is_not_run():
    result = check("05.1", LooksLikeAFunction(), show=False)
    assert result.status == "not yet" and "Pass your function itself" in result.message
    assert LooksLikeAFunction.touched is False


# ----- the reply: text only, bounded -------------------------------------------------------
def _reply_fd() -> int:
    """The child's end of its reply pipe, found as a student could: by walking the stack."""
    frame = sys._getframe()
    while frame is not None:
        for name in ("write_end", "reply", "fd"):
            value = frame.f_locals.get(name)
            if type(value) is int and value > 2:
                return value
        frame = frame.f_back
    raise AssertionError("no reply pipe on the stack")


def floods_the_reply():
    os.write(_reply_fd(), b"x" * (student_process.MAX_REPLY_BYTES * 4))


def forges_the_reply():
    os.write(_reply_fd(), b'{"printed": 5}\n' * 3)


def test_a_reply_too_long_or_not_text_is_refused(method):
    flooded = check("05.1", floods_the_reply, show=False)
    assert flooded.status == "not yet"
    assert flooded.details[0].endswith("it printed more than a check can read"), flooded.details
    forged = check("05.1", forges_the_reply, show=False)
    assert forged.status == "not yet"
    assert forged.details[0].endswith("its reply to the checker could not be read"), forged.details


def test_printed_text_is_cut_to_the_limit():
    def prints_a_lot():
        print("Total VRAM: 15.84 GB" + "!" * 100_000)

    run = student_process.run_cases(prints_a_lot, [student_process_torch()], 5.0, "fork")
    assert len(run.outcomes[0].printed) == student_process.MAX_PRINTED


def student_process_torch() -> types.ModuleType:
    from lessonkit.health.fake_torch import fake_torch

    return fake_torch(16 * 10**9)


def test_without_processes_the_thread_fallback_still_checks(monkeypatch):
    monkeypatch.setattr(student_process, "start_method", lambda: "thread")
    assert check("05.1", right(), show=False).status == "correct"
    looped = check("05.1", loops_forever, show=False)
    assert "stopped after 0.6 s" in looped.details[0]


def loops_forever():
    while True:
        pass


def test_the_instructor_guide_states_the_cages_limits():
    from lessonkit.exercises.student_code import _FUNCTION_TIME_LIMIT

    guide = " ".join(
        (Path(__file__).resolve().parents[2] / "docs" / "instructor-guide.md").read_text().split()
    )
    assert f"at most {student_process.MAX_PRINTED:,} characters per case" in guide
    assert f"{_FUNCTION_TIME_LIMIT} s after it began" in guide
    assert "not prevented: files written to absolute paths" in guide
