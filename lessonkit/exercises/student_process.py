"""Running a student's function in a process of its own, under a hard wall-clock limit.

``run_cases(function, torches, time_limit)`` calls ``function()`` once per stand-in torch in a
child process and returns, per case, what it printed or how it failed. The checker keeps the
expected answers and does the grading; the child only ever sends back text.

What this prevents, and what it does not (a process cannot be sandboxed without the operating
system's help: containers, seccomp, separate users):

* the checker's state is out of reach: the child works on a copy of the process (``fork``) or
  in a fresh Python (elsewhere), so whatever it changes (the checker's tables, the expected
  answers, ``sys.modules``, a fake ``torch``) is gone when it ends;
* time: at the limit the child and its process group are killed (SIGKILL), even inside one long
  C call that never returns to Python; nothing of it keeps running after ``check`` returns,
  except a process that left the group on purpose (``os.setsid``) or was started through
  another service;
* output: printed text is kept up to ``MAX_PRINTED`` characters per case and the whole reply
  up to ``MAX_REPLY_BYTES``, read as JSON (never unpickled), so no object of the student's ever
  reaches the checker;
* files: the child runs in a temporary working directory, removed afterwards, so relative paths
  (``open("out.txt", "w")``) land there. Absolute paths are not prevented: the child has the
  notebook user's rights on the file system and the network. Memory is not limited either.

Where to run: ``fork`` on Linux (Colab, Kaggle, nbgrader on a Linux server); elsewhere
(macOS, Windows) a fresh interpreter, which receives the function's code and the plain values,
modules and functions of the notebook it names; where neither exists (Pyodide) the function runs
in a thread of this process with the old, softer limit.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import marshal
import os
import pickle
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..health.fake_torch import (
    MAX_PRINTED,
    StudentExit,
    TimeLimitExceeded,
    fake_torch_from_spec,
    run_with_fake_torch,
    torch_spec,
)
from ..safe_repr import describe_error, short_str

# The most the child may send back, all cases together (a case is at most MAX_PRINTED
# characters, up to 12 bytes each once escaped as JSON).
MAX_REPLY_BYTES = 256 * 1024
# Seconds a fresh interpreter may take to start and import lessonkit (not counted in the limit).
START_LIMIT = 30.0
_ERROR_CHARS = 300


@dataclass(frozen=True)
class CaseOutcome:
    """What one call of the function did: returned (``problem`` None) or failed."""

    printed: str = ""
    problem: str | None = None
    not_implemented: bool = False


@dataclass(frozen=True)
class CagedRun:
    """The cases that finished, in order, and why the others did not (None when all did)."""

    outcomes: list[CaseOutcome]
    stopped: str | None = None
    how: str = "fork"


def start_method() -> str:
    """'fork' on Linux, 'spawn' (a fresh interpreter) where subprocesses exist, else 'thread'."""
    if sys.platform.startswith("linux") and hasattr(os, "fork"):
        return "fork"
    if sys.platform in ("emscripten", "wasi"):
        return "thread"
    return "spawn"


def run_cases(
    function: types.FunctionType,
    torches: list[types.ModuleType],
    time_limit: float,
    method: str | None = None,
) -> CagedRun:
    """Call ``function()`` once with each stand-in torch, all calls within ``time_limit`` s."""
    how = method or start_method()
    specs = [torch_spec(torch) for torch in torches]
    if how == "thread":
        return _run_in_thread(function, torches, time_limit)
    folder = tempfile.mkdtemp(prefix="lessonkit-check-")
    try:
        if how == "fork":
            return _run_forked(function, specs, time_limit, folder)
        return _run_spawned(function, specs, time_limit, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ----- in the child -------------------------------------------------------------------------
def _no_input(*_args: object, **_kwargs: object) -> str:
    raise EOFError("a check gives the function no input")


class _Discard(io.TextIOBase):
    def write(self, text: str) -> int:
        return len(text)


def _cut_off_from_the_notebook() -> None:
    """No terminal, no kernel streams, no input: the child talks only through its pipe."""
    import faulthandler

    faulthandler.disable()  # a crash is reported by its exit status, not on the kernel's stderr
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    sys.stdin, sys.stderr = io.StringIO(""), _Discard()
    builtins.input = _no_input


def _case_line(function: types.FunctionType, spec: tuple[Any, ...]) -> bytes:
    try:
        printed = run_with_fake_torch(function, fake_torch_from_spec(spec))
        outcome: dict[str, Any] = {"printed": printed}
    except NotImplementedError:
        outcome = {"not_implemented": True}
    except StudentExit as err:
        outcome = {"problem": short_str(err, _ERROR_CHARS)}
    except KeyboardInterrupt as err:  # here it is the function's own: no Ctrl-C reaches a child
        outcome = {"problem": short_str(StudentExit(err), _ERROR_CHARS)}
    except Exception as err:  # the student's code failed: that is the feedback
        outcome = {"problem": f"raised {describe_error(err, _ERROR_CHARS)}"}
    return json.dumps(outcome).encode("ascii") + b"\n"


def _send(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _run_here(function: types.FunctionType, specs: list[tuple[Any, ...]], fd: int) -> None:
    """The child's work: one JSON line saying it is ready, then one per case."""
    _send(fd, b'{"ready": true}\n')
    for spec in specs:
        _send(fd, _case_line(function, spec))


# ----- fork ---------------------------------------------------------------------------------
def _run_forked(
    function: types.FunctionType, specs: list[tuple[Any, ...]], time_limit: float, folder: str
) -> CagedRun:
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():  # Python 3.12 warns about fork in a threaded process
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns
        _forked_child(function, specs, folder, read_end, write_end)
    os.close(write_end)
    with contextlib.suppress(OSError):  # the child may have done it first, or ended already
        os.setpgid(pid, pid)  # also here, so the group exists before any kill
    try:
        return _collect(read_end, pid, len(specs), time_limit, START_LIMIT, "fork")
    finally:
        os.close(read_end)
        _end(pid)


def _forked_child(
    function: types.FunctionType,
    specs: list[tuple[Any, ...]],
    folder: str,
    read_end: int,
    write_end: int,
) -> None:
    status = 70  # what went wrong has nobody to be told to but the exit status
    try:
        os.close(read_end)
        os.setpgid(0, 0)
        os.chdir(folder)
        _cut_off_from_the_notebook()
        _run_here(function, specs, write_end)
        status = 0
    finally:
        os._exit(status)


def _end(pid: int) -> None:
    """Kill the child's process group (the child and whatever it started) and reap it."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _exit_status(pid: int, wait_until: float) -> int | None:
    """The child's wait status once it has ended by itself before ``wait_until``, else None."""
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            # Reaped here: _end's kill of the group then only reaches what it started.
            return status
        if time.monotonic() >= wait_until:
            return None
        time.sleep(0.002)


# ----- a fresh interpreter ------------------------------------------------------------------
_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def _plain(value: Any, depth: int = 0) -> bool:
    """Data made of builtin values only (exact types: no method of the student's runs here)."""
    kind = type(value)
    if kind in _PLAIN:
        return True
    if depth > 6 or kind not in (list, tuple, dict, set, frozenset) or len(value) > 10_000:
        return False
    if kind is dict:
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    return all(_plain(item, depth + 1) for item in value)


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if type(const) is types.CodeType:
            names |= _names(const)
    return names


def _portable(function: types.FunctionType) -> dict[str, Any]:
    """What a fresh interpreter needs to rebuild ``function``: its code, and the modules,
    functions and plain values of its module that it names (other names stay undefined)."""
    namespace = function.__globals__
    entries: dict[str, tuple[str, Any]] = {}
    todo = [function.__code__]
    while todo:
        code = todo.pop()
        for name in sorted(_names(code)):
            if name in entries or name not in namespace:
                continue
            value = namespace[name]
            if type(value) is types.ModuleType and type(value.__dict__.get("__name__")) is str:
                entries[name] = ("module", value.__dict__["__name__"])
            elif type(value) is types.FunctionType and value.__globals__ is namespace:
                entries[name] = ("function", _function_parts(value))
                todo.append(value.__code__)
            elif _plain(value):
                entries[name] = ("value", value)
    return {"main": _function_parts(function), "globals": entries}


def _function_parts(function: types.FunctionType) -> dict[str, Any]:
    defaults = function.__defaults__
    cells: list[tuple[bool, Any]] = []  # (copied, value); a cell not copied stays empty
    for cell in function.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            cells.append((False, None))
            continue
        cells.append((True, value) if _plain(value) else (False, None))
    return {
        "code": marshal.dumps(function.__code__),
        "name": function.__code__.co_name,
        "defaults": defaults if defaults is None or _plain(defaults) else None,
        "closure": cells,
    }


def _rebuild(payload: dict[str, Any]) -> types.FunctionType:
    """The function again, in this interpreter, with a namespace of what was sent."""
    import importlib

    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}

    def function(parts: dict[str, Any]) -> types.FunctionType:
        cells = [
            types.CellType(value) if copied else types.CellType()
            for copied, value in parts["closure"]
        ]
        return types.FunctionType(
            marshal.loads(parts["code"]),
            namespace,
            parts["name"],
            parts["defaults"],
            tuple(cells) or None,
        )

    for name, (kind, value) in payload["globals"].items():
        if kind == "module":
            try:
                namespace[name] = importlib.import_module(value)
            except Exception:  # not importable there: the name stays undefined
                continue
        else:
            namespace[name] = function(value) if kind == "function" else value
    return function(payload["main"])


def spawned_child() -> None:
    """The fresh interpreter's work: read the function and cases on stdin, reply on stdout."""
    reply = os.dup(1)
    payload = pickle.loads(sys.stdin.buffer.read())  # from the checker, not from the student
    _cut_off_from_the_notebook()
    _run_here(_rebuild(payload["function"]), payload["specs"], reply)


def _run_spawned(
    function: types.FunctionType, specs: list[tuple[Any, ...]], time_limit: float, folder: str
) -> CagedRun:
    payload = pickle.dumps({"function": _portable(function), "specs": specs})
    package_root = str(Path(__file__).resolve().parents[2])
    code = (
        f"import sys; sys.path.insert(0, {package_root!r}); "
        "from lessonkit.exercises.student_process import spawned_child; spawned_child()"
    )
    posix = os.name == "posix"
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=folder,
        start_new_session=posix,
    )
    try:
        assert child.stdin is not None and child.stdout is not None
        try:
            child.stdin.write(payload)
            child.stdin.close()
        except OSError:
            pass  # it ended at once: what it sent (nothing) says so
        if not posix:
            reply = _read_in_thread(child.stdout, START_LIMIT + time_limit)
            if reply is None:
                return CagedRun([], _stopped_after(time_limit), "spawn")
            return _interpret(reply, len(specs), None, "spawn")
        return _collect(
            child.stdout.fileno(), child.pid, len(specs), time_limit, START_LIMIT, "spawn"
        )
    finally:
        if posix:
            _end(child.pid)
        else:
            child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def _read_in_thread(stream: Any, timeout: float) -> bytes | None:
    """At most MAX_REPLY_BYTES of ``stream`` (where pipes cannot be polled); None on time-out."""
    import threading

    reply: list[bytes] = []
    reader = threading.Thread(target=lambda: reply.append(stream.read(MAX_REPLY_BYTES)))
    reader.daemon = True
    reader.start()
    reader.join(timeout)
    return reply[0] if reply else None


# ----- reading the reply --------------------------------------------------------------------
def _collect(
    fd: int, pid: int, cases: int, time_limit: float, start_limit: float, how: str
) -> CagedRun:
    """Read the child's reply until it ends, its time is up or it sends too much."""
    data = b""
    start = time.monotonic()
    deadline = start + start_limit
    started = None
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while len(data) <= MAX_REPLY_BYTES:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                return _timed_out(data, cases, how, time.monotonic() - (started or start))
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
            if started is None and b"\n" in data:
                started = time.monotonic()
                deadline = started + time_limit
        else:
            run = _interpret(data[:MAX_REPLY_BYTES], cases, None, how)
            return CagedRun(run.outcomes, "it printed more than a check can read", how)
    status = _exit_status(pid, deadline)
    run = _interpret(data, cases, status, how)
    if status is None and run.stopped is not None:  # it closed its reply and went on running
        return CagedRun(run.outcomes, _stopped_after(time.monotonic() - (started or start)), how)
    return run


def _stopped_after(seconds: float) -> str:
    return (
        f"stopped after {seconds:.1f} s: it did not finish (an endless loop, a long "
        "computation, or waiting for something?)"
    )


def _timed_out(data: bytes, cases: int, how: str, seconds: float) -> CagedRun:
    run = _interpret(data, cases, None, how)
    return CagedRun(run.outcomes, _stopped_after(seconds), how)


def _interpret(data: bytes, cases: int, status: int | None, how: str) -> CagedRun:
    """Outcomes from the complete JSON lines of a reply (the first line says 'ready')."""
    lines = data.split(b"\n")
    complete = lines[1:-1] if len(lines) > 1 else []
    outcomes: list[CaseOutcome] = []
    for line in complete[:cases]:
        outcome = _outcome(line)
        if outcome is None:
            return CagedRun(outcomes, "its reply to the checker could not be read", how)
        outcomes.append(outcome)
    if len(outcomes) == cases:
        return CagedRun(outcomes, None, how)
    return CagedRun(outcomes, _ended_early(status), how)


def _outcome(line: bytes) -> CaseOutcome | None:
    try:
        fields = json.loads(line.decode("ascii"))
    except (ValueError, RecursionError):
        return None
    if type(fields) is not dict:
        return None
    printed, problem = fields.get("printed", ""), fields.get("problem")
    if type(printed) is not str or not (problem is None or type(problem) is str):
        return None
    return CaseOutcome(
        printed[:MAX_PRINTED],
        None if problem is None else problem[:_ERROR_CHARS],
        fields.get("not_implemented") is True,
    )


def _ended_early(status: int | None) -> str:
    if os.name != "posix":
        status = None  # only POSIX wait statuses are read here
    if status is not None and os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"it crashed the Python running it ({name})"
    code = os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else None
    said = f" with status {code}" if code is not None else ""
    return (
        f"it ended the Python running it{said} before it returned (os._exit, or a crash?): "
        "a check should print what it finds and return"
    )


# ----- no processes (Pyodide) ---------------------------------------------------------------
def _run_in_thread(
    function: types.FunctionType, torches: list[types.ModuleType], time_limit: float
) -> CagedRun:
    outcomes: list[CaseOutcome] = []
    deadline = time.monotonic() + time_limit
    for torch in torches:
        left = deadline - time.monotonic()
        if left <= 0:
            return CagedRun(outcomes, _stopped_after(time_limit), "thread")
        try:
            outcomes.append(CaseOutcome(run_with_fake_torch(function, torch, time_limit=left)))
        except NotImplementedError:
            outcomes.append(CaseOutcome(not_implemented=True))
        except TimeLimitExceeded:
            return CagedRun(outcomes, _stopped_after(time_limit), "thread")
        except StudentExit as err:
            outcomes.append(CaseOutcome(problem=short_str(err, _ERROR_CHARS)))
        except Exception as err:
            outcomes.append(CaseOutcome(problem=f"raised {describe_error(err, _ERROR_CHARS)}"))
    return CagedRun(outcomes, None, "thread")
