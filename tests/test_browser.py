"""The notebooks in a real browser: JupyterLab 4 in headless Chromium, driven by Playwright.

For notebook 1 (the VRAM explorer) and notebook 4 (the decision flow): run all cells, change a
control as a student would, and check that the readout and the chart changed and that no cell
shows an error. Screenshots go to artifacts/screenshots/.

    MPLBACKEND=Agg .venv/bin/python -m pytest -m browser     # or: make test (runs everything)

Needs Debian's Chromium (``apt-get install chromium``; ``make browser-deps``); Playwright's own
browser downloads are not used.
"""

from __future__ import annotations

import os
import re
import statistics
from pathlib import Path
from typing import Iterator

import pytest

from browser import lab  # tests/browser/lab.py

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
NOTEBOOKS = ("01_vram_equation.ipynb", "04_hardware_decision_flow.ipynb")
VIEWPORT = {"width": 1400, "height": 1000}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lab.LabServer]:
    if not Path(lab.CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"no Chromium at {lab.CHROMIUM}: CI must run the browser test "
                        "('make browser-deps' installs it)")
        pytest.skip(f"no Chromium at {lab.CHROMIUM}: run 'make browser-deps' "
                    "(or apt-get install chromium)")
    home = tmp_path_factory.mktemp("jupyterlab")
    root = home / "notebooks"
    lab.copy_notebooks(ROOT / "notebooks", root, list(NOTEBOOKS))
    with lab.lab_server(root, home) as running:
        yield running


@pytest.fixture(scope="module")
def browser(server: lab.LabServer) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=lab.CHROMIUM, args=lab.CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: object, request: pytest.FixtureRequest) -> Iterator[object]:
    failed_before = request.session.testsfailed
    page = browser.new_page(viewport=VIEWPORT)
    yield page
    if request.session.testsfailed > failed_before:  # keep a picture of what went wrong
        shot(page, f"{request.node.name}-FAILED")
    page.close()


def shot(page: object, name: str, element: object | None = None) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.png"
    if element is not None:
        element.scroll_into_view_if_needed()
        element.screenshot(path=str(path))
    else:
        page.screenshot(path=str(path))
    return path


def run_notebook(page: object, server: lab.LabServer, name: str) -> None:
    """Open a notebook, run all its cells, and check that every cell ran without an error."""
    lab.open_notebook(page, server, name)
    lab.run_all_cells(page)
    assert lab.error_outputs(page) == []
    prompts = lab.prompts(page)
    assert prompts and all(re.fullmatch(r"\[\d+\]:", p) for p in prompts), prompts


def state(explorer: object) -> tuple[str, str]:
    """The explorer's readout text and the source of its chart image."""
    readout = explorer.locator(".lessonkit-readout").inner_text()
    image = explorer.locator(".lessonkit-chart img").first.get_attribute("src") or ""
    return readout, image


def wait_for_change(page: object, explorer: object, before: tuple[str, str],
                    timeout_ms: int = 30_000) -> tuple[str, str]:
    """Wait until both the readout and the chart differ from ``before``; return the new state."""
    page.wait_for_function(
        """([node, readout, image]) => {
            const r = node.querySelector('.lessonkit-readout');
            const img = node.querySelector('.lessonkit-chart img');
            return r && img && r.innerText !== readout && img.getAttribute('src') !== image;
        }""",
        arg=[explorer.element_handle(), *before], timeout=timeout_ms, polling=200)
    return state(explorer)


def chart_latency_ms(page: object, explorer: object, handle: object, key: str) -> float:
    """Milliseconds from a key press on a control to a new chart picture in the page."""
    page.evaluate(
        """(node) => {
            const chart = node.querySelector('.lessonkit-chart');
            const before = chart.querySelector('img') && chart.querySelector('img').getAttribute('src');
            window.__lessonkit = {t0: null, t1: null};
            document.addEventListener('keydown', () => { window.__lessonkit.t0 = performance.now(); },
                                      {capture: true, once: true});
            const observer = new MutationObserver(() => {
                const img = chart.querySelector('img');
                if (img && img.getAttribute('src') !== before && window.__lessonkit.t1 === null) {
                    window.__lessonkit.t1 = performance.now();
                    observer.disconnect();
                }
            });
            observer.observe(chart, {childList: true, subtree: true, attributes: true});
        }""", explorer.element_handle())
    handle.focus()
    page.keyboard.press(key)
    page.wait_for_function("() => window.__lessonkit.t1 !== null", timeout=30_000, polling=20)
    return page.evaluate("() => window.__lessonkit.t1 - window.__lessonkit.t0")


def assert_no_errors(page: object, server: lab.LabServer, name: str, explorer: object) -> None:
    assert lab.error_outputs(page) == []
    assert "Cannot show this combination" not in explorer.locator(".lessonkit-readout").inner_text()
    saved = lab.save_notebook(page, server.root / name)
    assert lab.saved_errors(saved) == []


def test_vram_explorer_in_jupyterlab(page: object, server: lab.LabServer) -> None:
    name = NOTEBOOKS[0]
    run_notebook(page, server, name)
    explorer = page.locator(".lessonkit-vram-explorer")
    explorer.wait_for(state="visible")
    first = state(explorer)
    assert "Peak per GPU" in first[0] and first[1].startswith("data:image/png")
    shot(page, "01_vram_explorer-1-after-run-all", explorer)

    # At batch 1 a full fine-tune peaks in the optimizer step, whatever the batch: switch to
    # LoRA, where the activations (and so the batch) set the peak.
    explorer.locator(".lessonkit-toggle-method").get_by_role("button", name="lora", exact=True).click()
    lora = wait_for_change(page, explorer, first)
    # The method brings its usual precision, as notebook 1 tells the student.
    assert explorer.locator(".lessonkit-dropdown-precision select").input_value() == "bf16"
    assert "precision bf16 (bf16 base weights" in lora[0]
    shot(page, "01_vram_explorer-2-lora", explorer)

    handle = explorer.locator(".lessonkit-slider-batch .noUi-handle")
    slider_value = explorer.locator(".lessonkit-slider-batch .widget-readout")
    assert slider_value.inner_text().strip() == "1"
    handle.focus()
    page.keyboard.press("ArrowRight")
    moved = wait_for_change(page, explorer, lora)
    assert slider_value.inner_text().strip() == "2"
    peaks = [float(re.search(r"Peak per GPU: ([\d,.]+) GiB", r).group(1).replace(",", ""))
             for r, _ in (lora, moved)]
    assert peaks[1] > peaks[0], peaks
    shot(page, "01_vram_explorer-3-batch-2", explorer)
    # Control change to new chart, as the student sees it (target: 150 ms median on 2 CPUs;
    # printed, not asserted: speed is measured, not timed in tests).
    times = [chart_latency_ms(page, explorer, handle, key)
             for key in ["ArrowRight", "ArrowLeft"] * 5]
    assert all(t > 0 for t in times)
    print(f"\nvram explorer in the browser: control change to new chart, median "
          f"{statistics.median(times):.0f} ms (min {min(times):.0f}, max {max(times):.0f}, "
          f"n={len(times)})")
    shot(page, "01_vram_equation-page")
    assert_no_errors(page, server, name, explorer)


def test_decision_flow_explorer_in_jupyterlab(page: object, server: lab.LabServer) -> None:
    name = NOTEBOOKS[1]
    run_notebook(page, server, name)
    explorer = page.locator(".lessonkit-decision-flow-explorer")
    explorer.wait_for(state="visible")
    first = state(explorer)
    assert "Google Colab (A100) or Lambda Labs" in first[0]
    shot(page, "04_decision_flow-1-after-run-all", explorer)

    explorer.locator(".lessonkit-toggle-budget").get_by_role("button", name="High", exact=True).click()
    high = wait_for_change(page, explorer, first)
    assert "RTX 4090" in high[0]
    shot(page, "04_decision_flow-2-high-budget", explorer)

    explorer.locator(".lessonkit-dropdown-size select").select_option("70B")
    big = wait_for_change(page, explorer, high)
    assert "multi-GPU cluster" in big[0]
    shot(page, "04_decision_flow-3-70B", explorer)
    shot(page, "04_hardware_decision_flow-page")
    assert_no_errors(page, server, name, explorer)
