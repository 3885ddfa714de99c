"""Fuzzing `lessonkit oom` as a user runs it, in real subprocesses: generated messages and logs
as the argument or on standard input (bytes that are not UTF-8 included, under a strict UTF-8
locale), right and wrong flags, standard input or output closed. Every run ends with a
documented exit code (0-3), at most one line on standard error and never a traceback.

Cases run (derandomized): 40, each a fresh interpreter.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oom_strategies import log, message  # tests/oom_strategies.py

ROOT = Path(__file__).resolve().parents[2]
CASES = 40
pytestmark = pytest.mark.skipif(os.name != "posix", reason="closes descriptors with sh")

flag_values = {
    "--model": ["7B", "gpt2", "llama-3-8b", "nosuch-model", "", "1e400", "x" * 5000],
    "--method": ["full", "lora", "qlora", "sideways"],
    "--batch-size": ["4", "1", "0", "-3", "lots", "9" * 5000],
    "--seq-len": ["512", "2048", "0", "1e9"],
    "--precision": ["bf16", "bf16-mixed", "fp8"],
    "--gpu": ["t4", "A100 80GB", "t5"],
    "--n-gpus": ["1", "8", "0"],
}
flags = st.lists(
    st.one_of(
        st.sampled_from(sorted(flag_values)).flatmap(
            lambda flag: st.sampled_from(flag_values[flag]).map(lambda value: [flag, value])
        ),
        st.sampled_from([["--json"], ["--gradient-checkpointing"], ["--no-such-flag"]]),
    ),
    max_size=4,
).map(lambda groups: [part for group in groups for part in group])


def _argv_safe(text: str) -> str:
    return text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")[:100_000]


stdin_bytes = st.one_of(
    log().map(lambda text: text.encode("utf-8", "replace")),
    st.binary(max_size=3000),
    st.tuples(st.binary(max_size=100), message(), st.binary(max_size=100)).map(
        lambda parts: parts[0] + parts[1].encode("utf-8", "replace") + parts[2]
    ),
)
cases = st.one_of(
    st.tuples(st.just("argument"), message().map(_argv_safe), flags),
    st.tuples(st.just("stdin"), stdin_bytes, flags),
    st.tuples(st.just("stdin closed"), st.just(b""), flags),
    st.tuples(st.just("stdout closed"), message().map(_argv_safe), flags),
)


@settings(
    max_examples=CASES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(cases)
def test_every_run_ends_with_a_documented_code_and_no_traceback(case):
    how, data, argv = case
    command = [sys.executable, "-m", "lessonkit", "oom", *argv]
    stdin = None
    if how in ("argument", "stdout closed"):
        command.append(data)
    else:
        stdin = data
    redirect = {"stdin closed": "<&-", "stdout closed": ">&-"}.get(how, "")
    line = " ".join(shlex.quote(part) for part in command)
    result = subprocess.run(
        ["sh", "-c", f"exec {line} {redirect}"],
        input=stdin,
        capture_output=True,
        timeout=300,
        cwd=ROOT,
        env=os.environ | {"PYTHONIOENCODING": "utf-8:strict", "LC_ALL": "C.UTF-8"},
    )
    err = result.stderr.decode("utf-8", "replace")
    assert result.returncode in (0, 1, 2, 3), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    if result.returncode != 2:  # argparse's usage line comes with its error line
        assert len(err.strip().splitlines()) <= 1, err[-3000:]
    if how == "stdout closed":
        assert result.returncode in (2, 3)
    if how == "stdin closed" and "--no-such-flag" not in argv:
        assert result.returncode == 2
