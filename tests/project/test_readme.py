"""Every example in the README runs as written, after a plain ``import lessonkit``: each ```python
block, each ``lessonkit ...`` command line (with the exit code it documents: 0), and each inline
``lessonkit.…`` call, run in fresh interpreters from an empty folder."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
HANG_GUARD = 600


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, re.M | re.S)


def command_lines() -> list[str]:
    return [
        line.strip()
        for block in blocks("text") + blocks("bash")
        for line in block.splitlines()
        if line.strip().startswith("lessonkit ")
    ]


def inline_calls() -> list[str]:
    """Inline code that uses the package: `lessonkit.x.y(...)`, `with lessonkit...: ...`."""
    prose = re.sub(r"^```.*?^```", "", README, flags=re.M | re.S)
    spans = re.findall(r"`([^`]+)`", prose)
    return sorted(
        {
            " ".join(span.split())
            for span in spans
            if re.match(r"(with )?lessonkit\.\w", " ".join(span.split()))
        }
    )


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        cwd=cwd,
        env={"MPLBACKEND": "Agg", "PATH": "/usr/bin:/bin", "HOME": str(cwd)},
    )


def test_the_readme_has_examples_of_each_kind():
    assert len(blocks("python")) >= 1
    assert {line.split()[1] for line in command_lines()} >= {"vram", "check", "recommend", "oom"}
    assert {
        "lessonkit.hardware.memory_units_note()",
        "lessonkit.charts.memory_timeline(report)",
        'lessonkit.exercises.check("02.1", "130 GiB")',
    } <= set(inline_calls())


@pytest.mark.parametrize("code", blocks("python"), ids=lambda code: code.splitlines()[0][:40])
def test_each_python_block_runs_as_written(code, tmp_path):
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written where it ran


@pytest.mark.parametrize("line", command_lines(), ids=lambda line: " ".join(line.split()[:2]))
def test_each_command_line_runs_as_written(line, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "lessonkit", *shlex.split(line)[1:]],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stderr == ""


# Names the inline examples use, as a reader would have them.
NAMESPACE = """
import lessonkit
report = lessonkit.estimate("7B")
error = RuntimeError(
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 14.75 GiB "
    "of which 1.00 GiB is free. Of the allocated memory 13.00 GiB is allocated by PyTorch, and "
    "100.00 MiB is reserved by PyTorch but unallocated."
)
answer = "130 GiB"
path = None

class Trainer:
    def train(self):
        raise error

trainer = Trainer()
"""


def test_each_inline_example_runs_after_a_plain_import(tmp_path):
    """The package loads its subpackages lazily: each name the README uses must be reachable
    from `import lessonkit` alone, and each call run."""
    script = NAMESPACE + textwrap.dedent(
        """
        import json, sys
        outcomes = {}
        for code in json.loads(sys.argv[1]):
            if "(...)" in code or code.endswith("(path)"):
                target = code.split("(")[0]
                value = eval(target)
                outcomes[code] = "callable" if callable(value) else "found"
            elif code.startswith("with "):
                try:
                    exec(code)
                except RuntimeError as raised:
                    outcomes[code] = "the same error" if raised is error else "another error"
            else:
                value = eval(code)
                outcomes[code] = type(value).__name__
        print(json.dumps(outcomes))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script, json.dumps(inline_calls())],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        cwd=tmp_path,
        env={"MPLBACKEND": "Agg", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    outcomes = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(outcomes) == set(inline_calls())
    assert outcomes["lessonkit.hardware.memory_units_note()"] == "str"
    assert outcomes["lessonkit.charts.memory_timeline(report)"] != "NoneType"
    assert outcomes["with lessonkit.oom_doctor.watch(trainer): trainer.train()"] == "the same error"


def test_the_exercise_examples_match_their_question_kinds():
    """Each `exercises.check("ID", answer)` example gives an answer of the question's kind: a
    number for a number question, option names for a choice."""
    import lessonkit

    examples = re.findall(r'exercises\.check\("([\d.]+)", ([^)`]+)\)', " ".join(README.split()))
    assert examples
    for question, answer in examples:
        result = lessonkit.exercises.check(question, eval(answer))
        assert not result.message.startswith(("Unknown option", "Could not read")), (
            question,
            answer,
            result.message,
        )
