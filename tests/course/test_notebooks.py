"""The course notebooks: committed clean, and run top to bottom by nbval and by papermill.

nbval (``--nbval-lax``) compares only the cells tagged ``nbval-check-output``: those print the
numbers the course teaches, so a change to lessonkit that moves one fails here until the notebook
is refreshed on purpose (``python tools/strip_notebooks.py --execute``, then review the diff).
papermill runs every notebook with two more parameter sets and fails on any error output.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import tomllib

import lessonkit

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"
sys.path.insert(0, str(ROOT / "tools"))
import strip_notebooks  # noqa: E402

NAMES = (
    "01_vram_equation.ipynb",
    "02_gpu_selection_matrix.ipynb",
    "03_choosing_your_environment.ipynb",
    "04_hardware_decision_flow.ipynb",
    "05_checking_your_environment.ipynb",
    "06_summary_and_reflection.ipynb",
)
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
    "lessonkit"
]
REPO, REF = f"github.com/{PYPROJECT['repository']}", PYPROJECT["release"]  # tools/set_repository.py
# Two parameter sets per notebook, away from the defaults nbval runs with. The second set also
# runs the explorers in static mode (PNG only), as nbconvert or GitHub's viewer would see them.
PARAMETER_SETS = {
    "01_vram_equation.ipynb": [
        {"MODEL": "llama-3.1-8b", "METHOD": "lora", "BATCH_SIZE": 4, "SEQ_LEN": 1024},
        {
            "MODEL": "70B",
            "METHOD": "qlora",
            "BATCH_SIZE": 64,
            "SEQ_LEN": 32768,
            "SMALL_MODEL": "qwen2.5-0.5b",
        },
    ],
    "02_gpu_selection_matrix.ipynb": [
        {"MODEL": "13B", "METHOD": "qlora", "BATCH_SIZE": 8, "SEQ_LEN": 1024, "GPU": "RTX 4090"},
        {
            "MODEL": "llama-3.1-70b",
            "METHOD": "full",
            "BATCH_SIZE": 1,
            "SEQ_LEN": 2048,
            "GPU": "H100",
        },
    ],
    "03_choosing_your_environment.ipynb": [
        {"MODEL": "13B", "METHOD": "qlora", "TOKENS": 100_000_000},
        {"MODEL": "llama-3.1-70b", "METHOD": "full", "TOKENS": 1_000_000},
    ],
    "04_hardware_decision_flow.ipynb": [
        {"MODEL_SIZE": "70B", "BUDGET": "high"},
        {"MODEL_SIZE": "13B", "BUDGET": "low"},
    ],
    "05_checking_your_environment.ipynb": [
        {"MODEL": "70B", "SMOKE_TEST": False},
        {"MODEL": "qwen2.5-0.5b"},
    ],
    "06_summary_and_reflection.ipynb": [
        {"MODEL": "llama-3.1-8b", "CONSUMER_GPU": "RTX 3090", "SMALL_GPU": "V100 16GB"},
        {"MODEL": "13B", "CONSUMER_GPU": "RTX 5090", "SMALL_GPU": "L4"},
    ],
}
INLINE = "module://matplotlib_inline.backend_inline"


def read(name: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOK_DIR / name, as_version=4)


def code_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code"]


def parameters_cell(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, f"expected one cell tagged 'parameters', found {len(cells)}"
    return cells[0]


def parameter_names(nb: nbformat.NotebookNode) -> set[str]:
    tree = ast.parse(parameters_cell(nb).source)
    names = set()
    for node in tree.body:
        assert isinstance(node, ast.Assign), (
            f"parameters cell: only assignments, got {ast.dump(node)[:60]}"
        )
        names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


# ----- the committed files ------------------------------------------------------------------
def test_the_six_notebooks_and_nothing_else() -> None:
    assert sorted(p.name for p in NOTEBOOK_DIR.glob("*.ipynb")) == list(NAMES)
    assert set(PARAMETER_SETS) == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_committed_without_stray_outputs_or_widget_state(name: str) -> None:
    nb = read(name)
    assert strip_notebooks.problems(nb) == []
    text = (NOTEBOOK_DIR / name).read_text(encoding="utf-8")
    assert nbformat.writes(strip_notebooks.strip(nb)) + "\n" == text, (
        f"{name} is not stripped: run python tools/strip_notebooks.py"
    )
    assert "application/vnd.jupyter.widget-state+json" not in text
    assert "application/vnd.jupyter.widget-view+json" not in text


@pytest.mark.parametrize("name", NAMES)
def test_taught_numbers_are_output_checked(name: str) -> None:
    checked = [c for c in code_cells(read(name)) if strip_notebooks.is_checked(c)]
    assert checked, f"{name} has no cell tagged 'nbval-check-output'"
    for cell in checked:
        assert cell.outputs and cell.execution_count, (
            f"checked cell without a stored output (nbval would not compare it):\n{cell.source[:200]}"
        )
    shown = "".join(o.get("text", "") for cell in checked for o in cell.outputs)
    assert re.search(r"\d+(\.\d+)? (GB|GiB)", shown), f"{name} checks no memory figure"


@pytest.mark.parametrize("name", NAMES)
def test_opens_with_badges_and_an_install_cell(name: str) -> None:
    nb = read(name)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# ")
    assert (
        f"colab.research.google.com/github/{REPO[11:]}/blob/{REF}/notebooks/{name}" in first.source
    )
    assert (
        f"kaggle.com/kernels/welcome?src=https://{REPO}/blob/{REF}/notebooks/{name}" in first.source
    )
    install = code_cells(nb)[0].source
    assert re.search(r"try:\s*\n\s*import lessonkit\s*\nexcept ImportError:", install), install
    # The release from the package index (pinned), its git tag only where the index has not it.
    assert f'VERSION = "{REF[1:]}"' in install and f'REPOSITORY = "{REPO[11:]}"' in install
    requirements = re.search(r"requirements = \[(.*?)\n    \]", install, re.S).group(1)
    assert re.findall(r'f"([^"]+)"', requirements) == [
        "lessonkit[measure]=={VERSION}",
        "lessonkit[measure] @ git+https://github.com/{REPOSITORY}@v{VERSION}",
    ]
    # Colab and Kaggle ship their own torch, numpy and matplotlib: never re-pin or upgrade them.
    pip = re.search(r"\[sys.executable, \"-m\", \"pip\", \"install\",[^\]]*\]", install).group(0)
    assert not re.search(r"torch|numpy|matplotlib|--upgrade|-U\b", pip + requirements), pip


@pytest.mark.parametrize("name", NAMES)
def test_parameters_cell_and_parameter_sets(name: str) -> None:
    nb = read(name)
    names = parameter_names(nb)
    assert names and all(n.isupper() for n in names), names
    cell = parameters_cell(nb)
    assert nb.cells.index(cell) < nb.cells.index(code_cells(nb)[2]), "parameters come early"
    for params in PARAMETER_SETS[name]:
        assert set(params) <= names, f"unknown parameters {set(params) - names}"


def test_reflections_leave_a_placeholder_for_the_students_answer() -> None:
    """A course notebook never answers its own questions: every check(...) gets the placeholder,
    so the self-check says "not answered" until the student writes; model answers live in
    solutions/."""
    from lessonkit.exercises.answer_parsing import PLACEHOLDER_TEXT

    checks = 0
    for name in NAMES:
        for cell in code_cells(read(name)):
            called = re.findall(r"^check\(\"[\d.]+\", (\w+)\)", cell.source, re.M)
            for variable in called:
                checks += 1
                assigned = re.search(rf'^{variable} = f?"""(.*?)"""', cell.source, re.S | re.M)
                assert assigned, f"{name}: {variable} is not written in its check cell"
                assert assigned.group(1).strip().rstrip(".") == PLACEHOLDER_TEXT, (name, variable)
    assert checks >= 2  # the guide's two reflection questions in notebook 6


def test_what_the_text_says_about_the_default_numbers_holds() -> None:
    """Prose cannot be output-checked: the claims it makes about the default settings are here."""
    from lessonkit.planning.fitting import method_settings
    from lessonkit.units import GB

    guide_low, guide_high = 120 * GB, 160 * GB  # the guide's "~120 to 160 GB"
    full = dict(method="full", precision="bf16-mixed")
    # notebook 1: a plain PyTorch loop (foreach AdamW) lands inside the range
    usual = lessonkit.estimate("7B", optimizer="adamw", **full)
    assert guide_low <= usual.total_bytes <= guide_high and usual.peak_phase == "optimizer"
    assert usual.breakdown["activations"] < 0.001 * usual.total_bytes  # freed by then
    # Trainer(bf16=True)'s fused AdamW: below, peaking in the backward, "just below" (within 10%)
    fused = lessonkit.estimate("7B", optimizer="adamw-fused", **full)
    assert 0.9 * guide_low < fused.total_bytes < guide_low and fused.peak_phase == "backward"
    for optimizer in ("adamw", "adamw-fused"):  # long batches above, activations set the peak
        long = lessonkit.estimate("7B", optimizer=optimizer, batch_size=4, seq_len=2048)
        assert long.total_bytes > guide_high and long.peak_phase == "backward"
    # Trainer(bf16=True) with transformers 5's defaults (usual_recipe, at the notebook's batch):
    # pure bf16 halves weights, gradients and states; below the range even at batch 4 x 2048;
    # fits one 80 GB card and no 48 GB one. Its recipe loaded in fp32 is the fused case above.
    from lessonkit.models.recipes import usual_recipe

    trainer = usual_recipe("trainer")
    assert trainer["precision"] == "bf16" and trainer["optimizer"] == "adamw-fused"
    bf16 = lessonkit.estimate("7B", method="full", **{**trainer, "batch_size": 1, "seq_len": 512})
    for part in ("weights", "gradients", "optimizer"):
        assert bf16.breakdown[part] == pytest.approx(usual.breakdown[part] / 2, rel=1e-6)
    assert bf16.fits(lessonkit.get_gpu("A100 80GB").usable_bytes)
    assert bf16.fits(lessonkit.get_gpu("H100").usable_bytes)
    assert not bf16.fits(lessonkit.get_gpu("RTX A6000").usable_bytes)
    long = lessonkit.estimate("7B", method="full", **{**trainer, "batch_size": 4, "seq_len": 2048})
    assert long.total_bytes < guide_low
    mixed = {**trainer, "precision": "bf16-mixed", "batch_size": 1, "seq_len": 512}
    assert lessonkit.estimate("7B", method="full", **mixed).total_bytes == fused.total_bytes
    # notebook 5: a 16 GB T4 fails `< 16`, yet holds a small model's full fine-tune; a 24 GB
    # card passes and cannot hold a 7B one; LoRA of 7B on a T4 is tight
    from lessonkit.planning.fitting import find_fit

    t4, rtx4090 = lessonkit.get_gpu("T4"), lessonkit.get_gpu("RTX 4090")
    assert t4.usable_bytes / 2**30 < 16 <= rtx4090.memory_gb
    assert find_fit(lessonkit.resolve_model("0.5B"), "full", t4.usable_bytes).fits
    assert not find_fit(lessonkit.resolve_model("7B"), "full", rtx4090.usable_bytes).fits
    lora_t4 = find_fit(lessonkit.resolve_model("7B"), "lora", t4.usable_bytes, native_bf16=False)
    assert lora_t4.tight and lora_t4.verdict == "fits, tight"
    # notebook 2: LoRA of 7B at batch 4 x 512 is short on an RTX 4090 without checkpointing and
    # fits with it; the A6000 holds it as it is
    lora = dict(method_settings("lora"), batch_size=4, seq_len=512)
    assert not lessonkit.estimate("7B", **lora).fits(rtx4090.usable_bytes)
    assert lessonkit.estimate("7B", **lora, gradient_checkpointing=True).fits(rtx4090.usable_bytes)
    assert lessonkit.estimate("7B", **lora).fits(lessonkit.get_gpu("RTX A6000").usable_bytes)
    # notebook 2: checkpointing leaves a peak in the optimizer step unchanged
    checkpointed = lessonkit.estimate("7B", optimizer="adamw", gradient_checkpointing=True, **full)
    assert checkpointed.total_bytes == usual.total_bytes and checkpointed.peak_phase == "optimizer"
    # notebook 6: at the same settings QLoRA needs less than LoRA
    same = dict(batch_size=4, seq_len=512, gradient_checkpointing=True)
    lora, qlora = (
        lessonkit.estimate("7B", **method_settings(m), **same) for m in ("lora", "qlora")
    )
    assert qlora.total_bytes < lora.total_bytes


def test_notebook_1s_explorer_tips_name_its_controls_and_hold() -> None:
    """The 'Try it' list of notebook 1 names the VRAM explorer's controls by their labels, and
    what it says the memory savers do holds at the settings it names."""
    from lessonkit.widgets.controls import CONTROL_NAMES
    from lessonkit.widgets.explorers import VRAM_CONTROLS

    nb = nbformat.read(NOTEBOOK_DIR / NAMES[0], as_version=4)
    tips = "\n".join(  # the core tips and the Going deeper part on the other controls
        c.source
        for c in nb.cells
        if c.source.startswith(("## Try it: the VRAM explorer", "## Going deeper: the explorer"))
    )
    named = set(re.findall(r"\*\*(.+?)\*\*", tips.replace("\n  ", " ")))
    labels = {CONTROL_NAMES[n][1] for n in VRAM_CONTROLS}
    assert named <= labels, named - labels
    assert {"Activation offload", "Optimizer step in backward", "Loss"} <= named
    # offload lowers a checkpointed run; the step in backward lowers a full fine-tune; the
    # chunked loss saves more, in share of the peak, on a 128k vocabulary than on a 32k one
    lora = dict(method="lora", precision="bf16", batch_size=8, gradient_checkpointing=True)
    assert (
        lessonkit.estimate("7B", activation_offload=True, **lora).total_bytes
        < lessonkit.estimate("7B", **lora).total_bytes
    )
    assert (
        lessonkit.estimate("7B", optimizer_in_backward=True).total_bytes
        < lessonkit.estimate("7B").total_bytes
    )
    saved = {}
    for model in ("7B", "llama-3.1-8b"):
        assert lessonkit.resolve_model(model).vocab_size == {"7B": 32000}.get(model, 128256)
        standard = lessonkit.estimate(model, **{**lora, "gradient_checkpointing": False})
        chunked = lessonkit.estimate(
            model, **{**lora, "gradient_checkpointing": False}, loss="chunked"
        )
        saved[model] = 1 - chunked.total_bytes / standard.total_bytes
    assert 0 < saved["7B"] < saved["llama-3.1-8b"]
    # docs/instructor-guide.md's demo: the step in backward leaves almost no gradients at the
    # peak of a full fine-tune; the chunked loss shrinks the logits of llama-3.1-8b
    full, oib = (lessonkit.estimate("7B", optimizer_in_backward=o) for o in (False, True))
    assert oib.breakdown["gradients"] < 0.05 * full.breakdown["gradients"]
    guide = (ROOT / "docs" / "instructor-guide.md").read_text(encoding="utf-8")
    assert "the gradients slice all but vanishes" in guide.replace("\n   ", " ")
    eight = dict(method="lora", precision="bf16", batch_size=8)
    assert (
        lessonkit.estimate("llama-3.1-8b", loss="chunked", **eight).breakdown["logits"]
        < lessonkit.estimate("llama-3.1-8b", **eight).breakdown["logits"]
    )


def test_the_trainer_uses_fused_adamw_as_notebook_1_says(tmp_path) -> None:
    """Notebook 1: `Trainer(bf16=True)` picks fused AdamW with the pinned transformers and torch
    (that from_pretrained loads the checkpoint's dtype is checked by tests/models/test_recipes.py)."""
    transformers = pytest.importorskip("transformers")
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[])
    assert str(getattr(args.optim, "value", args.optim)) == "adamw_torch_fused"
    text = " ".join(c.source for c in read("01_vram_equation.ipynb").cells)
    assert "adamw_torch_fused" in text and "foreach" in text
    # ... and computes the Trainer's line from the recipe data, not from typed settings
    assert 'usual_recipe("trainer")' in text and "dtype=torch.float32" in text


# ----- running them -------------------------------------------------------------------------
def kernel_env(static: bool = False) -> dict[str, str]:
    """The kernel's environment: matplotlib's inline backend, as in Jupyter; explorers live or static."""
    env = dict(os.environ, MPLBACKEND=INLINE)
    env.pop("LESSONKIT_STATIC", None)
    if static:
        env["LESSONKIT_STATIC"] = "1"
    return env


def run_nbval(paths: list[Path], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--nbval-lax",
            "--nbval-current-env",
            f"--nbval-sanitize-with={SANITIZE}",
            "--nbval-cell-timeout=300",
            *map(str, paths),
        ],
        cwd=ROOT,
        env=kernel_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.notebooks
@pytest.mark.parametrize("name", NAMES)
def test_nbval(name: str) -> None:
    result = run_nbval([NOTEBOOK_DIR / name])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert re.search(r"\d+ passed", result.stdout)


@pytest.mark.notebooks
def test_nbval_catches_a_moved_number(tmp_path: Path) -> None:
    """The harness really compares: a stored number that lessonkit no longer prints fails."""
    cell = nbformat.v4.new_code_cell(  # the tag the course notebooks carry
        "import lessonkit as lk\nprint(f\"{lk.resolve_model('7B').n_params:,}\")",
        metadata={"tags": ["nbval-check-output"]},
    )
    right = f"{lessonkit.resolve_model('7B').n_params:,}\n"
    for label, stored in (("right", right), ("moved", right.replace("6", "5", 1))):
        nb = nbformat.v4.new_notebook(cells=[cell.copy()])
        nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text=stored)]
        nb.cells[0].execution_count = 1
        nb.cells.append(
            nbformat.v4.new_code_cell(
                "# NBVAL_CHECK_OUTPUT\nfrom matplotlib.figure import Figure\nFigure(figsize=(3, 2))",
                outputs=[
                    nbformat.v4.new_output(
                        "execute_result",
                        data={"text/plain": "<Figure size 640x480 with 0 Axes>"},
                        execution_count=2,
                    )
                ],
                execution_count=2,
            )
        )
        nbformat.write(nb, tmp_path / f"{label}.ipynb")
    result = run_nbval([tmp_path / "right.ipynb", tmp_path / "moved.ipynb"])
    assert re.search(r"\b1 failed, 3 passed\b", result.stdout), result.stdout[-3000:]
    assert "moved.ipynb::Cell 0" in result.stdout


@pytest.mark.notebooks
@pytest.mark.parametrize(
    ("name", "index"),
    [(n, i) for n in NAMES for i in range(2)],
    ids=[f"{n[:2]}-set{i + 1}" for n in NAMES for i in range(2)],
)
def test_papermill(name: str, index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import papermill

    params = PARAMETER_SETS[name][index]
    for key, value in kernel_env(static=index == 1).items():
        monkeypatch.setenv(key, value)
    if index == 0:
        monkeypatch.delenv("LESSONKIT_STATIC", raising=False)
    out = tmp_path / name
    papermill.execute_notebook(
        str(NOTEBOOK_DIR / name),
        str(out),
        parameters=params,
        kernel_name="python3",
        cwd=str(NOTEBOOK_DIR),
        progress_bar=False,
        log_output=False,
        execution_timeout=300,
    )
    nb = nbformat.read(out, as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and all(k in injected[0].source for k in params)
    assert not [o for c in code_cells(nb) for o in c.outputs if o.output_type == "error"]
    statuses = re.findall(
        r"data-status='([^']+)'",
        "".join(o.get("data", {}).get("text/html", "") for c in code_cells(nb) for o in c.outputs),
    )
    assert set(statuses) <= {"not answered"}, statuses  # the placeholders do not stop Run All
    # The parameters reached the taught numbers: the checked cells name the chosen model.
    shown = "".join(
        o.get("text", "")
        for c in code_cells(nb)
        if strip_notebooks.is_checked(c)
        for o in c.outputs
    )
    model = lessonkit.resolve_model(params.get("MODEL", params.get("MODEL_SIZE")))
    assert model.name in shown
