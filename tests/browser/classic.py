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
import time
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


# What ipywidgets 7.7.1's widget manager logs when the fresh kernel (no ipywidgets imported
# yet) closes its control comm: it then asks the kernel for the widgets' comms one by one.
RESTORE_FALLBACK = 'Failed to fetch ipywidgets through the "jupyter.widget.control" comm'


def open_notebook(page, server: lab.LabServer, name: str, timeout_ms: int = 90_000) -> None:
    """Open ``name`` and wait until its kernel is idle and the widget manager has finished
    restoring widgets from the kernel (see ``wait_for_widget_restore``)."""
    fallbacks: list[str] = []
    page.on("console", lambda m: fallbacks.append(m.text) if RESTORE_FALLBACK in m.text else None)
    page.goto(f"{server.url}/notebooks/{name}?token={server.token}")
    page.wait_for_selector(".cell.code_cell", timeout=timeout_ms)
    page.wait_for_function(
        "() => window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel "
        "&& Jupyter.notebook.kernel.is_connected() && Jupyter.notebook.kernel.widget_manager",
        timeout=timeout_ms,
        polling=250,
    )
    page.wait_for_selector(KERNEL_IDLE, state="attached", timeout=timeout_ms)
    wait_for_widget_restore(page, fallbacks, timeout_ms)


def wait_for_widget_restore(page, fallbacks: list[str], timeout_ms: int) -> None:
    """The widget manager of ipywidgets 7 restores the kernel's widgets when it starts: its
    control comm fails on a fresh kernel, then it lists the kernel's widget comms and, when
    the answer comes, renders again every output holding a widget. Cells run before that
    answer can make widgets the listing also sees, as comms with no model yet (the comms'
    openings come on another channel); their outputs are then rendered again from a second
    model whose state never arrives, and stay empty. So wait for the fallback's message and
    then for the answer to a listing of our own, which the kernel sends after the manager's
    (one shell channel, answered in order), and let the manager's promises settle."""
    deadline = time.monotonic() + timeout_ms / 1000
    while not fallbacks:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the widget manager never logged {RESTORE_FALLBACK!r}")
        page.wait_for_timeout(100)
    page.evaluate(
        """() => new Promise(resolve => {
            Jupyter.notebook.kernel.send_shell_message(
                'comm_info_request', {target_name: 'jupyter.widget'},
                {shell: {reply: () => setTimeout(() => resolve(true), 200)}});
        })"""
    )


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


def output_texts(page, limit: int = 200) -> list[str]:
    """The start of each output's text, for a failure's message."""
    return page.evaluate(
        "limit => [...document.querySelectorAll('.output_area')]"
        ".map(n => n.innerText.slice(0, limit))",
        limit,
    )


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
