"""Drive classic Jupyter Notebook 6.5 with ipywidgets 7.7.1 in headless Chromium.

That environment (``widgetsnbextension`` 3.6.10, as pip installs it with ipywidgets 7.7.1 today,
whose Output widget stays blank) is built apart from .venv, by ``make classic-env`` (and ``make
test``), in ``LESSONKIT_CLASSIC_ENV`` (default .venv-classic/ at the repository root). Used by
tests/course/test_browser.py.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

from browser import lab

ROOT = Path(__file__).resolve().parents[2]
ENV = Path(os.environ.get("LESSONKIT_CLASSIC_ENV", ROOT / ".venv-classic"))
PYTHON = ENV / "bin" / "python"
VERSIONS = {"notebook": "6.5.", "ipywidgets": "7.7.1", "widgetsnbextension": "3.6.10"}
KERNEL_IDLE = "#kernel_indicator_icon.kernel_idle_icon"


def missing() -> str | None:
    """Why the classic environment cannot be used, or None when it is there as expected."""
    if not PYTHON.exists():
        return f"no classic Notebook environment at {ENV}: run 'make classic-env' to build it"
    script = (
        f"import importlib.metadata as m; print(' '.join(m.version(n) for n in {list(VERSIONS)!r}))"
    )
    try:
        found = subprocess.run(
            [str(PYTHON), "-c", script], capture_output=True, text=True, timeout=60, check=True
        ).stdout.split()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the classic environment at {ENV} does not answer ({exc}): 'make classic-env'"
    for (name, wanted), version in zip(VERSIONS.items(), found, strict=True):
        if not version.startswith(wanted):
            return f"{ENV} has {name} {version}, not {wanted}*: rebuild it with 'make classic-env'"
    return None


@contextlib.contextmanager
def notebook_server(
    root: Path, home: Path, repo: Path, timeout: float = 90
) -> Iterator[lab.LabServer]:
    """Run classic Notebook from the classic environment on a free local port serving
    ``root``; the kernel imports lessonkit from ``repo``."""
    port, token = lab.free_port(), secrets.token_hex(16)
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        IPYTHONDIR=str(home / "ipython"),
        PYTHONPATH=str(repo),
    )
    env.pop("MPLBACKEND", None)
    argv = [
        str(PYTHON),
        "-m",
        "notebook",
        "--no-browser",
        "--NotebookApp.ip=127.0.0.1",
        f"--NotebookApp.port={port}",
        "--NotebookApp.port_retries=0",
        f"--NotebookApp.token={token}",
        f"--NotebookApp.notebook_dir={root}",
    ] + (["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])
    url = f"http://127.0.0.1:{port}"
    with lab._serving(
        "Notebook",
        argv,
        env,
        root,
        home / "notebook.log",
        f"{url}/api/status?token={token}",
        timeout,
    ):
        yield lab.LabServer(url, token, root)


def open_notebook(page, server: lab.LabServer, name: str, timeout_ms: int = 90_000) -> None:
    page.goto(f"{server.url}/notebooks/{name}?token={server.token}")
    page.wait_for_selector(".cell.code_cell", timeout=timeout_ms)
    page.wait_for_function(
        "() => window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel "
        "&& Jupyter.notebook.kernel.is_connected()",
        timeout=timeout_ms,
        polling=250,
    )
    page.wait_for_selector(KERNEL_IDLE, state="attached", timeout=timeout_ms)


def run_all_cells(page, timeout_ms: int = 240_000) -> None:
    """Run every cell and wait until each has its number, or an error stopped the run."""
    page.evaluate("() => Jupyter.notebook.execute_all_cells()")
    page.wait_for_function(
        """() => {
            const prompts = [...document.querySelectorAll('.code_cell .input_prompt')]
                .map(p => p.textContent);
            if (document.querySelector('.output_error')) return true;
            return prompts.length > 0 && prompts.every(p => /In\\s*\\[\\d+\\]/.test(p));
        }""",
        timeout=timeout_ms,
        polling=500,
    )
    page.wait_for_selector(KERNEL_IDLE, state="attached", timeout=timeout_ms)


def error_outputs(page) -> list[str]:
    """Texts of the tracebacks shown, and of widgets that could not be drawn."""
    return page.evaluate(
        """() => [...document.querySelectorAll('.output_error, .output_stderr')]
            .map(n => n.innerText).filter(t => /Traceback|Error/.test(t))"""
    )


def save_notebook(page, path: Path, timeout: float = 30) -> dict:
    """Save the notebook from the browser and return the saved file as JSON."""
    import json
    import time

    before = path.stat().st_mtime_ns
    page.evaluate("() => Jupyter.notebook.save_checkpoint()")
    deadline = time.monotonic() + timeout
    while path.stat().st_mtime_ns == before:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path.name} was not saved")
        time.sleep(0.2)
    time.sleep(0.5)
    return json.loads(path.read_text(encoding="utf-8"))
