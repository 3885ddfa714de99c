"""The OOM doctor on real logs: any length, read as a stream (the last error wins), in time linear
in the log's length, every figure read or said to be unreadable, a fallback that always prints,
``watch()`` that re-raises the very same exception, and an MPS error never sent to more GPUs.

No test here times anything: work is bounded by sizes that a quadratic reading could not get
through for hours, with a subprocess timeout only as a guard against a hang.
"""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import pytest

from lessonkit import oom_doctor
from lessonkit.planning import oom as oom_module
from lessonkit.planning.oom import gib
from lessonkit.planning.oom_messages import parse_oom

ROOT = Path(__file__).resolve().parents[2]
GiB, MiB = 2**30, 2**20
HANG_GUARD = 300  # seconds: far beyond what the linear reading takes, far below a quadratic one

T4_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1002.00 MiB. GPU 0 has a total "
    "capacity of 14.74 GiB of which 382.12 MiB is free. Process 2571 has 14.36 GiB memory in use. "
    "Of the allocated memory 13.97 GiB is allocated by PyTorch, and 262.21 MiB is reserved by "
    "PyTorch but unallocated."
)
A100_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 25.96 GiB. GPU 4 has a total "
    "capacity of 79.18 GiB of which 23.04 GiB is free. Including non-PyTorch memory, this process "
    "has 52.02 GiB memory in use. Of the allocated memory 45.89 GiB is allocated by PyTorch, and "
    "3.01 GiB is reserved by PyTorch but unallocated."
)
MPS_OOM = (
    "RuntimeError: MPS backend out of memory (MPS allocated: 60.00 GB, other allocations: 3.00 GB, "
    "max allowed: 72.50 GB). Tried to allocate 3.00 GB on private pool."
)
FILLER_LINE = "step 1234/100000 | loss 1.2345 | lr 2.0e-05 | grad_norm 0.98 | tokens/s 5321\n"


def filler(chars: int) -> str:
    return FILLER_LINE * (chars // len(FILLER_LINE) + 1)


def run_python(code: str, **kwargs: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        cwd=ROOT,
        **kwargs,
    )


def oom_cli(
    *args: str, stdin: bytes | None = None, **kwargs: object
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lessonkit", "oom", *args],
        input=stdin,
        capture_output=True,
        timeout=HANG_GUARD,
        cwd=ROOT,
        **kwargs,
    )


# ----- any length, the last error wins ------------------------------------------------------
def test_the_last_error_of_a_long_log_wins_wherever_it_is():
    log = T4_OOM + "\n" + filler(3_000_000) + A100_OOM + "\n" + filler(3_000_000)
    message = parse_oom(log)
    assert message is not None and message.device == 4
    assert message.total_bytes == round(79.18 * GiB)


def test_a_bare_out_of_memory_error_counts_only_when_no_error_names_its_kind():
    log = "OutOfMemoryError\n" + filler(100_000) + T4_OOM + "\n" + filler(10) + "OutOfMemoryError"
    assert parse_oom(log).tried_bytes == round(1002 * MiB)
    assert parse_oom("x\nOutOfMemoryError: no details\n").wording == "bare"


def test_wrappers_and_the_batch_search_are_read_from_the_whole_log():
    log = (
        '  File "transformers/trainer.py", line 2560, in _inner_training_loop\n'
        + filler(3_000_000)
        + "Decreasing batch size to: 4\n"
        + filler(3_000_000)
        + "Decreasing batch size to: 2\n"
        + "RuntimeError: No executable batch size found, reached zero.\n"
    )
    message = parse_oom(log)
    assert message.wording == "batch-search" and message.last_batch_size == 2
    assert message.wrapped_by == ["Trainer", "auto_find_batch_size"]


def test_an_error_split_across_reads_is_read_whole():
    from lessonkit.planning.oom_messages import read_log

    text = filler(5000) + "[rank0]: " + A100_OOM + "\n" + filler(5000)
    whole = parse_oom(text)
    assert whole.wrapped_by == ["torchrun"] and whole.device == 4
    for size in (1, 7, 64, 4096):
        message = read_log(text[start : start + size] for start in range(0, len(text), size))
        assert message is not None and message.to_dict() == whole.to_dict(), size


def test_the_cli_reads_a_log_of_any_length_from_standard_input():
    log = (filler(5_000_000) + T4_OOM + "\n").encode()
    result = oom_cli("--model", "llama-3.2-3b", "--method", "lora", stdin=log)
    assert result.returncode == 0, result.stdout[-500:] + result.stderr[-2000:]
    assert b"tried to allocate 1,002 MiB" in result.stdout and not result.stderr


def test_the_writer_of_a_piped_log_never_sees_a_broken_pipe():
    """`python train.py 2>&1 | lessonkit oom`: the doctor reads to the end, so the training
    script writing more than 5 MB after its error exits normally."""
    writer_code = (
        "import sys\n"
        f"sys.stdout.write({T4_OOM!r} + '\\n')\n"
        "line = 'epoch 1 | step 10 | loss 2.0 | ' + 'x' * 60 + '\\n'\n"
        "for _ in range(100_000): sys.stdout.write(line)\n"
        "sys.stdout.flush()\n"
        "print('done', file=sys.stderr)\n"
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", writer_code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    reader = subprocess.Popen(
        [sys.executable, "-m", "lessonkit", "oom"],
        stdin=writer.stdout,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    writer.stdout.close()  # the reader holds the pipe's only reading end
    out, err = reader.communicate(timeout=HANG_GUARD)
    writer_err = writer.communicate(timeout=HANG_GUARD)[1]
    assert writer.returncode == 0 and writer_err == b"done\n", writer_err[-2000:]
    assert reader.returncode == 0 and b"Out of memory on GPU 0" in out, err[-2000:]


# ----- linear time --------------------------------------------------------------------------
SHAPES = {
    "blank lines": "'\\n' * 2_000_000",
    "spaces then newlines": "(' ' * 50 + '\\n') * 200_000",
    "rank prefixes": "'[rank0]: ' * 500_000 + '\\n'",
    "rank prefixes on blank lines": "'[rank0]:\\n' * 500_000",
    "unclosed rank prefixes": "('[rank' + '0' * 100 + '\\n') * 50_000",
    "one long digit run": "'7' * 3_000_000",
    "errors without figures": "'CUDA out of memory. ' * 200_000",
    "sizes without units": "'Tried to allocate 1.5 ' * 200_000",
}


def test_the_reading_is_linear_in_the_length_of_the_log():
    """Each shape took quadratic time (40,000 blank lines: 4 s; these sizes would take hours);
    read in a subprocess, so that a hang fails the test instead of holding the suite."""
    code = "from lessonkit.planning.oom_messages import parse_oom\nOOM = " + repr(T4_OOM) + "\n"
    for name, expression in SHAPES.items():
        code += (
            f"text = {expression}\n"
            "assert parse_oom(text + OOM).tried_bytes == round(1002 * 2**20), "
            f"{name!r}\n"
            "parse_oom(OOM + text)\n"
        )
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_cli_and_watch_read_a_long_run_of_blank_lines():
    blank = b"\n" * 2_000_000
    result = oom_cli(stdin=blank + T4_OOM.encode())
    assert result.returncode == 0 and not result.stderr, result.stderr[-2000:]
    result = run_python(
        f"""
        import io
        from lessonkit import oom_doctor
        out = io.StringIO()
        error = RuntimeError("\\n" * 2_000_000 + {T4_OOM!r})
        try:
            with oom_doctor.watch(file=out):
                raise error
        except RuntimeError as raised:
            assert raised is error
        assert "tried to allocate 1,002 MiB" in out.getvalue()
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]


# ----- figures of any size ------------------------------------------------------------------
HUGE = "9" * 400
HUGE_FIGURES = {
    "tried": f"CUDA out of memory. Tried to allocate {HUGE} GiB. GPU 0 has a total capacity of "
    "14.75 GiB of which 1.00 GiB is free.",
    "total": f"CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    f"{HUGE}.5 GiB of which 1.00 GiB is free.",
    "device": f"CUDA out of memory. Tried to allocate 2.00 GiB. GPU {'1' * 5000} has a total "
    "capacity of 14.75 GiB of which 1.00 GiB is free.",
    "process": f"CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    f"14.75 GiB of which 1.00 GiB is free. Process {'4' * 5000} has 13.00 GiB memory in use.",
    "old wording": f"CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; {HUGE} GiB total "
    f"capacity; {HUGE} GiB already allocated; 3.12 MiB free; {HUGE} GiB reserved in total by "
    "PyTorch)",
    "mps": f"MPS backend out of memory (MPS allocated: {HUGE} GB, other allocations: 1.00 GB, "
    f"max allowed: 18.13 GB). Tried to allocate {HUGE} GB on private pool.",
    "cpu": f"DefaultCPUAllocator: can't allocate memory: you tried to allocate {'8' * 5000} bytes.",
    "batch search": f"Decreasing batch size to: {'9' * 5000}\nNo executable batch size found, "
    "reached zero.",
    "a tiny size": "CUDA out of memory. Tried to allocate 0.000000000000000000001 bytes. GPU 0 "
    "has a total capacity of 14.75 GiB of which 1.00 GiB is free.",
}


@pytest.mark.parametrize("text", HUGE_FIGURES.values(), ids=HUGE_FIGURES.keys())
def test_every_figure_is_read_or_said_to_be_unreadable(text):
    message = parse_oom(text)
    assert message is not None
    data = message.to_dict()
    for name, value in data.items():
        if isinstance(value, int) and not isinstance(value, bool):
            assert 0 <= value < 2**80 or name == "device", (name, value)
    diagnosis = oom_doctor(text, model="7B", batch_size=2, seq_len=512)
    shown = str(diagnosis)
    if message.unreadable:
        assert "could not be read" in shown
        assert all(len(line) < 1000 for line in shown.splitlines())
    assert diagnosis.recognized and diagnosis.to_dict()["message"]["unreadable"] == list(
        message.unreadable
    )


def test_a_huge_figure_is_named_among_the_unreadable_ones():
    message = parse_oom(HUGE_FIGURES["tried"])
    assert message.tried_bytes is None and message.unreadable == ["tried_bytes"]
    assert message.total_bytes == round(14.75 * GiB)
    assert parse_oom(HUGE_FIGURES["batch search"]).unreadable == ["last_batch_size"]


@pytest.mark.parametrize("text", HUGE_FIGURES.values(), ids=HUGE_FIGURES.keys())
def test_the_cli_reads_huge_figures_without_a_traceback(text):
    result = oom_cli(text, "--model", "7B")
    assert result.returncode in (0, 2) and b"Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("size", "shown"),
    [
        (512 * 2**10, "512 KiB"),
        (300, "300 bytes"),
        (1002 * MiB, "1,002 MiB"),
        (3 * GiB, "3.00 GiB"),
    ],
)
def test_small_sizes_are_not_shown_as_zero(size, shown):
    assert gib(size) == shown


def test_a_request_of_half_a_mebibyte_is_shown_in_kib():
    text = (
        "CUDA out of memory. Tried to allocate 512.00 KiB. GPU 0 has a total capacity of 14.75 "
        "GiB of which 0 bytes is free."
    )
    assert "it tried to allocate 512 KiB" in str(oom_doctor(text))


# ----- the fallback -------------------------------------------------------------------------
def test_the_fallback_diagnosis_is_always_printable():
    """Settings that are a MagicMock made the doctor fail, and its fallback's str() raised."""
    diagnosis = oom_doctor(T4_OOM, mock.MagicMock())
    text = str(diagnosis)
    assert text.startswith("Out of memory on GPU 0") and diagnosis.to_dict()["recognized"]
    assert isinstance(repr(diagnosis), str)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("cannot print")


@pytest.mark.parametrize("failure", [RuntimeError("a bug"), Unprintable(), KeyError("x" * 10**6)])
def test_a_failing_doctor_still_shows_what_the_message_says(monkeypatch, failure):
    def broken(*args: object, **kwargs: object) -> None:
        raise failure

    monkeypatch.setattr(oom_module, "_diagnose", broken)
    diagnosis = oom_doctor(T4_OOM, model="7B")
    text = str(diagnosis)
    assert "Out of memory on GPU 0" in text and "The doctor failed" in text
    assert len(text) < 2000 and diagnosis.to_dict()["problems"]


# ----- watch() re-raises the very same exception --------------------------------------------
class RaisingFile:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def write(self, text: str) -> int:
        raise self.error

    def flush(self) -> None:
        raise self.error


def closed_file() -> io.StringIO:
    file = io.StringIO()
    file.close()
    return file


def huge_oom() -> RuntimeError:
    return RuntimeError(filler(3_000_000) + T4_OOM)


WATCH_CASES = {
    "an OOM": (lambda: RuntimeError(T4_OOM), {}),
    "not an OOM": (lambda: KeyError("input_ids"), {}),
    "a closed file": (lambda: RuntimeError(T4_OOM), {"file": closed_file()}),
    "a write that raises OSError": (
        lambda: RuntimeError(T4_OOM),
        {"file": RaisingFile(OSError(28, "No space left on device"))},
    ),
    "a write that raises ValueError": (
        lambda: RuntimeError(T4_OOM),
        {"file": RaisingFile(ValueError("I/O operation on closed file"))},
    ),
    "a file that is not a file": (lambda: RuntimeError(T4_OOM), {"file": 42}),
    "settings that are a mock": (lambda: RuntimeError(T4_OOM), {"objects": (mock.MagicMock(),)}),
    "an unprintable OOM": (lambda: Unprintable(), {}),
    "a huge OOM": (huge_oom, {"model": "7B"}),
    "bad settings": (lambda: RuntimeError(T4_OOM), {"model": "7B", "batch_size": "lots"}),
    "an MPS OOM": (lambda: RuntimeError(MPS_OOM), {"model": "13B", "batch_size": 4}),
}


@pytest.mark.parametrize("case", WATCH_CASES.values(), ids=WATCH_CASES.keys())
def test_watch_reraises_the_very_same_exception_in_every_case(case):
    make, options = case
    options = dict(options)
    objects = options.pop("objects", ())
    error = make()
    context = error.__context__
    with pytest.raises(BaseException) as raised, oom_doctor.watch(*objects, **options):
        raise error
    assert raised.value is error
    assert error.__context__ is context and error.__cause__ is None
    assert raised.traceback[-1].name == "test_watch_reraises_the_very_same_exception_in_every_case"


def test_watch_reraises_when_the_reading_itself_fails(monkeypatch):
    def broken(error: object) -> None:
        raise MemoryError("the parser failed")

    monkeypatch.setattr(oom_module, "parse_oom", broken)
    error = RuntimeError(T4_OOM)
    with pytest.raises(RuntimeError) as raised, oom_doctor.watch(file=io.StringIO()):
        raise error
    assert raised.value is error and error.__context__ is None


def test_watch_prints_the_diagnosis_once_and_passes_non_errors_untouched(capsys):
    error = RuntimeError(T4_OOM)
    run = dict(model="llama-3.2-3b", method="lora", batch_size=8, seq_len=2048)
    with pytest.raises(RuntimeError), oom_doctor.watch(**run):
        raise error
    out = capsys.readouterr().out
    assert out.count("lessonkit.oom_doctor:") == 1 and "Out of memory on GPU 0" in out
    with oom_doctor.watch():
        pass
    with pytest.raises(KeyboardInterrupt), oom_doctor.watch():
        raise KeyboardInterrupt
    assert capsys.readouterr().out == ""


# ----- Apple MPS ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("model", "method"),
    [("13B", "full"), ("13B", "lora"), ("30B", "lora"), ("7B", "full"), ("3B", "lora")],
)
def test_an_mps_error_is_never_offered_more_gpus_or_deepspeed(model, method):
    """A Mac has one GPU, and neither NCCL nor DeepSpeed runs on MPS."""
    for total in ("27.20", "72.50", "120.00"):
        text = MPS_OOM.replace("72.50", total)
        diagnosis = oom_doctor(text, model=model, method=method, batch_size=4, seq_len=1024)
        keys = {fix.key for fix in diagnosis.fixes}
        assert not keys & {"more_gpus", "offload_optimizer"}, (total, keys)
        shown = str(diagnosis)
        assert "FSDP" not in shown and "ZeRO" not in shown and "GPUs" not in shown


def test_the_same_run_on_cuda_is_still_offered_more_gpus():
    text = A100_OOM
    diagnosis = oom_doctor(text, model="13B", method="full", batch_size=4, seq_len=1024)
    assert "more_gpus" in {fix.key for fix in diagnosis.fixes}
