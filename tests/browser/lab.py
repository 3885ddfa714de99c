"""Drive JupyterLab in headless Chromium: start a server, open a notebook, run it, read it back.

Used by tests/course/test_browser.py. Chromium is Debian's (``/usr/bin/chromium``), driven by Playwright
through ``executable_path``; Playwright's own browser downloads are not needed.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = os.environ.get("LESSONKIT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
# User settings for the test server: every cell stays in the DOM (JupyterLab >= 4.2 otherwise
# renders only the visible ones), no news pop-up, no autosave racing the test.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
}
KERNEL_IDLE = '.jp-Notebook-ExecutionIndicator[data-status="idle"]'


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LabServer:
    url: str
    token: str
    root: Path

    def notebook_url(self, name: str) -> str:
        return f"{self.url}/lab/tree/{name}?token={self.token}&reset"


def _write_settings(settings_dir: Path) -> None:
    for rel, values in LAB_SETTINGS.items():
        path = settings_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values), encoding="utf-8")


@contextlib.contextmanager
def lab_server(root: Path, home: Path, timeout: float = 90) -> Iterator[LabServer]:
    """Run JupyterLab on a free local port serving ``root``; all its state lives under ``home``."""
    port, token = free_port(), secrets.token_hex(16)
    settings = home / "lab-settings"
    _write_settings(settings)
    env = dict(
        os.environ,
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(home / "lab-workspaces"),
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        IPYTHONDIR=str(home / "ipython"),
    )
    env.pop("MPLBACKEND", None)  # the kernel must keep its inline backend to show charts
    argv = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.open_browser=False",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.news_url=",
        "--LabApp.extension_manager=readonly",
    ] + (["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])
    url = f"http://127.0.0.1:{port}"
    with _serving(
        "JupyterLab",
        argv,
        env,
        root,
        home / "jupyterlab.log",
        f"{url}/api/status?token={token}",
        timeout,
    ):
        yield LabServer(url, token, root)


@contextlib.contextmanager
def _serving(
    name: str,
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    log_path: Path,
    status_url: str,
    timeout: float,
) -> Iterator[None]:
    """Run a server process until the block ends, once ``status_url`` answers (any HTTP status
    counts as an answer); its output goes to ``log_path``."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited early; see {log_path}")
                try:
                    with urllib.request.urlopen(status_url, timeout=2):
                        break
                except urllib.error.HTTPError:
                    break  # it answers
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{name} did not answer in {timeout:.0f} s") from None
                    time.sleep(0.5)
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def copy_notebooks(src: Path, dest: Path, names: list[str]) -> None:
    """Copy the notebooks under test, so running them in the browser never touches the repository."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(src / name, dest / name)


def open_notebook(page, server: LabServer, name: str, timeout_ms: int = 90_000) -> None:
    page.goto(server.notebook_url(name))
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=timeout_ms)
    wait_kernel_idle(page, timeout_ms)


def wait_kernel_idle(page, timeout_ms: int) -> None:
    """Wait until the notebook's kernel is started and idle (the indicator says idle before that)."""
    page.wait_for_function(
        """() => {{
            const name = document.querySelector('.jp-NotebookPanel .jp-KernelName');
            const idle = document.querySelector('{}');
            return name && idle && !/No Kernel/.test(name.textContent);
        }}""".format(KERNEL_IDLE.replace("'", "\\'")),
        timeout=timeout_ms,
        polling=250,
    )


# An output is an error when it shows a Python traceback (IPython's or the plain one).
_IS_ERROR_JS = """text => /Traceback \\(most recent call last\\)/.test(text)
                        || /^-{20,}\\s*\\n\\s*\\w+(Error|Exception|Interrupt)\\b/.test(text)"""
_ERRORS_JS = f"""() => [...document.querySelectorAll(
        '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
    .map(node => node.innerText).filter({_IS_ERROR_JS})"""


def prompts(page) -> list[str]:
    """The input prompts of all code cells, such as '[3]:', '[*]:' or '[ ]:'."""
    return page.evaluate(
        "() => [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')]"
        ".map(p => p.textContent.trim())"
    )


def run_all_cells(page, timeout_ms: int = 240_000) -> None:
    """Run > Run All Cells, then wait until every code cell ran or one stopped the run with an error."""
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    page.wait_for_function(
        f"""() => {{
            const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')]
                .map(p => p.textContent);
            if (prompts.length === 0 || prompts.some(p => p.includes('*'))) return false;
            return prompts.every(p => /\\[\\d+\\]/.test(p)) || ({_ERRORS_JS})().length > 0;
        }}""",
        timeout=timeout_ms,
        polling=500,
    )
    wait_kernel_idle(page, timeout_ms)


def error_outputs(page) -> list[str]:
    """Texts of the error outputs (tracebacks) the notebook shows; warnings do not count."""
    return page.evaluate(_ERRORS_JS)


def save_notebook(page, path: Path, timeout: float = 30) -> dict:
    """Save the notebook from the browser and return the saved file as JSON."""
    before = path.stat().st_mtime_ns
    page.locator(".jp-NotebookPanel .jp-Notebook").first.click(position={"x": 5, "y": 5})
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + timeout
    while path.stat().st_mtime_ns == before:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path.name} was not saved")
        time.sleep(0.2)
    time.sleep(0.5)
    return json.loads(path.read_text(encoding="utf-8"))


def saved_errors(nb: dict) -> list[str]:
    """'ename: evalue' of every error output in a saved notebook."""
    return [
        f"{out.get('ename')}: {out.get('evalue')}"
        for cell in nb["cells"]
        for out in cell.get("outputs", [])
        if out.get("output_type") == "error"
    ]


@contextlib.contextmanager
def voila_server(notebook: Path, home: Path, timeout: float = 90) -> Iterator[str]:
    """Serve one notebook with Voilà on a free local port; yields its URL."""
    port = free_port()
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        IPYTHONDIR=str(home / "ipython"),
    )
    env.pop("MPLBACKEND", None)
    argv = [
        sys.executable,
        "-m",
        "voila",
        str(notebook),
        "--no-browser",
        f"--port={port}",
        "--Voila.ip=127.0.0.1",
    ]
    url = f"http://127.0.0.1:{port}/"
    with _serving(
        "Voila", argv, env, notebook.parent, home / "voila.log", f"{url}api/status", timeout
    ):
        yield url
