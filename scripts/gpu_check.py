#!/usr/bin/env python3
"""GPU validation: lessonkit's estimates against real CUDA training steps, and the notebooks on a GPU.

Runs on one CUDA GPU with no network (models are built from configs with random weights):

1. the health check against torch and NVML readings of this machine;
2. ``lessonkit.measure(..., device="cuda")`` against ``lessonkit.estimate(..., device="cuda")`` for
   0.5B-1.5B-shaped models: peak allocated, peak reserved and the driver-level total, with margins;
3. every notebook executed with papermill (skipped, saying why, where papermill or ipykernel is
   missing).

Writes ``results.md`` and ``results.json`` to the output folder (default ``artifacts/gpu/``).
``--cpu`` runs the same code path with device="cpu" on tiny models (no GPU needed).
``--write-constants`` sets the CUDA constants data file from the measurement, citing it;
``--update-docs`` puts the results table into docs/gpu-validation.md.
Exit status: 0 all checks passed, 1 a check failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("lessonkit") is None:  # run from a checkout that is not installed
    sys.path.insert(0, str(ROOT))

import lessonkit  # noqa: E402  (cheap: no torch at import)
from lessonkit.models.presets import resolve_model  # noqa: E402
from lessonkit.models.spec import ModelSpec  # noqa: E402

CONSTANTS_FILE = ROOT / "lessonkit" / "data" / "cuda_constants.json"
DOCS_FILE = ROOT / "docs" / "gpu-validation.md"
DOCS_START, DOCS_END = "<!-- gpu-results:start -->", "<!-- gpu-results:end -->"
GB = 1e9

# Largest |estimate / measured - 1| accepted for each of the three readings.
TOLERANCE = {"allocated": 0.10, "reserved": 0.15, "driver": 0.15}
READINGS = ("allocated", "reserved", "driver")
# The results table: one row per configuration, in this column order (Markdown and JSON).
COLUMNS = (
    "config",
    "model",
    "method",
    "precision",
    "batch x seq",
    "checkpointing",
    "estimate allocated GB",
    "measured allocated GB",
    "allocated margin",
    "estimate reserved GB",
    "measured reserved GB",
    "reserved margin",
    "estimate total GB",
    "measured driver GB",
    "driver margin",
    "status",
)


@dataclass(frozen=True)
class Config:
    """One training-step configuration to measure and estimate."""

    name: str
    model: str
    method: str = "full"
    precision: str = "bf16"
    batch_size: int = 1
    seq_len: int = 512
    gradient_checkpointing: bool = False
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj")
    optimizer: str = "adamw"
    lora_dropout: float = 0.0
    needs: tuple[str, ...] = ()  # importable modules the configuration needs (e.g. bitsandbytes)

    def kwargs(self) -> dict[str, Any]:
        return dict(
            method=self.method,
            precision=self.precision,
            optimizer=self.optimizer,
            batch_size=self.batch_size,
            seq_len=self.seq_len,
            gradient_checkpointing=self.gradient_checkpointing,
            lora_rank=self.lora_rank,
            lora_targets=self.lora_targets,
            lora_dropout=self.lora_dropout,
        )


GPU_CONFIGS = (
    Config("qwen0.5b-full-bf16", "qwen2.5-0.5b", "full", "bf16"),
    Config("qwen0.5b-full-mixed", "qwen2.5-0.5b", "full", "bf16-mixed"),
    Config(
        "llama1b-full-bf16-ckpt",
        "llama-3.2-1b",
        "full",
        "bf16",
        batch_size=2,
        seq_len=1024,
        gradient_checkpointing=True,
    ),
    Config("llama1b-lora-bf16", "llama-3.2-1b", "lora", "bf16", batch_size=4),
    Config(
        "qwen1.5b-lora-mixed-ckpt",
        "qwen2.5-1.5b",
        "lora",
        "bf16-mixed",
        batch_size=2,
        seq_len=1024,
        gradient_checkpointing=True,
    ),
    Config(
        "qwen1.5b-full-mixed-ckpt",
        "qwen2.5-1.5b",
        "full",
        "bf16-mixed",
        seq_len=1024,
        gradient_checkpointing=True,
    ),
    Config("qwen0.5b-lora-bf16-long", "qwen2.5-0.5b", "lora", "bf16", seq_len=8192),
    Config(
        "qwen1.5b-qlora-long-ckpt",
        "qwen2.5-1.5b",
        "qlora",
        "bf16",
        seq_len=4096,
        gradient_checkpointing=True,
        needs=("bitsandbytes",),
    ),
    # real bitsandbytes on the GPU: autocast over 4-bit layers, LoRA dropout, 8-bit AdamW
    Config(
        "qwen0.5b-qlora-mixed-dropout",
        "qwen2.5-0.5b",
        "qlora",
        "bf16-mixed",
        batch_size=4,
        lora_dropout=0.05,
        needs=("bitsandbytes",),
    ),
    Config(
        "qwen0.5b-lora-dropout-adamw8bit",
        "qwen2.5-0.5b",
        "lora",
        "bf16",
        batch_size=4,
        lora_dropout=0.1,
        optimizer="adamw-8bit",
        needs=("bitsandbytes",),
    ),
)

# Tiny shapes of the same families for the CPU dry run.
TINY = {
    "llama": ModelSpec(
        name="tiny-llama",
        family="llama",
        n_layers=2,
        hidden_size=64,
        n_heads=4,
        n_kv_heads=2,
        intermediate_size=128,
        vocab_size=512,
        tie_embeddings=True,
    ),
    "qwen2": ModelSpec(
        name="tiny-qwen2",
        family="qwen2",
        n_layers=2,
        hidden_size=64,
        n_heads=4,
        n_kv_heads=2,
        intermediate_size=128,
        vocab_size=512,
        attention_bias="qkv",
        tie_embeddings=True,
    ),
}


def cpu_configs() -> list[Config]:
    """The GPU configurations on tiny models with short sequences; those that need a module
    (bitsandbytes) only where it is installed (0.50 runs on CPU)."""
    import importlib.util

    return [
        dataclasses.replace(c, name=f"tiny-{c.name}", seq_len=128 if c.seq_len >= 4096 else 64)
        for c in GPU_CONFIGS
        if all(importlib.util.find_spec(m) for m in c.needs)
    ]


def model_for(config: Config, device: str) -> ModelSpec:
    spec = resolve_model(config.model)
    return TINY.get(spec.family, TINY["llama"]) if device == "cpu" else spec


# ----- the machine ------------------------------------------------------------------------
def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _nvml() -> Any | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # not installed, or no driver
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def environment(device: str) -> dict[str, Any]:
    """GPU name, memory, versions and the date of this run."""
    import torch

    env: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d"),
        "device": device,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": None,
        **{
            name: _version(name)
            for name in (
                "transformers",
                "peft",
                "accelerate",
                "bitsandbytes",
                "papermill",
                "nvidia-ml-py",
            )
        },
        "lessonkit": lessonkit.__version__,
    }
    if device == "cpu":
        return env | {
            "gpu": "CPU (dry run, no GPU)",
            "gpu_memory_bytes": None,
            "compute_capability": None,
        }
    props = torch.cuda.get_device_properties(0)
    nvml = _nvml()
    if nvml is not None:
        env["driver"] = _text(nvml.nvmlSystemGetDriverVersion())
    return env | {
        "gpu": props.name,
        "gpu_memory_bytes": props.total_memory,
        "compute_capability": f"{props.major}.{props.minor}",
    }


# ----- health check against torch and NVML -----------------------------------------------
def health_rows() -> list[dict[str, Any]]:
    """Each fact the health check reports next to torch's and NVML's reading of it."""
    import torch

    report = lessonkit.check_gpu_health()
    gpu = report.gpus[0] if getattr(report, "gpus", None) else report
    props = torch.cuda.get_device_properties(0)
    expected: dict[str, tuple[Any, Any, str]] = {
        "name": (getattr(gpu, "name", None), props.name, "torch"),
        "total memory (bytes)": (
            getattr(gpu, "total_memory_bytes", None),
            props.total_memory,
            "torch",
        ),
        "compute capability": (
            _capability(getattr(gpu, "compute_capability", None)),
            f"{props.major}.{props.minor}",
            "torch",
        ),
        "native bf16": (
            getattr(gpu, "native_bf16", None),
            props.major >= 8,
            "torch (capability >= 8.0)",
        ),
        "smoke test": (getattr(gpu, "smoke_test", None), "passed", "a matmul on the GPU"),
    }
    nvml = _nvml()
    if nvml is not None:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        expected["name (NVML)"] = (
            getattr(gpu, "name", None),
            _text(nvml.nvmlDeviceGetName(handle)),
            "NVML",
        )
        expected["total memory (NVML, bytes)"] = (
            getattr(gpu, "total_memory_bytes", None),
            nvml.nvmlDeviceGetMemoryInfo(handle).total,
            "NVML",
        )
        expected["driver version"] = (
            getattr(report, "driver_version", None),
            _text(nvml.nvmlSystemGetDriverVersion()),
            "NVML",
        )
    rows = []
    for what, (got, want, source) in expected.items():
        ok = got == want
        if what.startswith("total memory") and isinstance(got, int):
            ok = (
                abs(got - want) <= 0.01 * want
            )  # torch and NVML count the same card a little differently
        rows.append(
            {"check": what, "lessonkit": got, "reference": want, "source": source, "ok": ok}
        )
    return rows


def _capability(value: Any) -> str | None:
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return f"{value[0]}.{value[1]}"
    return None if value is None else str(value)


# ----- measurement against estimate -------------------------------------------------------
def readings(report: Any) -> dict[str, int]:
    """Peak allocated, peak reserved and driver-level total of a measured (or estimated) step.

    A CUDA measurement carries torch's own counters (``settings["measured"]["cuda"]``); an
    estimate or a CPU measurement gives its tensor peak and the two CUDA lines of its breakdown.
    """
    tensors = int(report.tensor_bytes)
    reserved = tensors + int(report.breakdown.get("allocator_margin", 0))
    measured = report.settings.get("measured")
    cuda = measured.get("cuda") if isinstance(measured, dict) else None
    if cuda:
        return {
            "allocated": int(cuda["max_memory_allocated"]),
            "reserved": int(cuda["max_memory_reserved"]),
            "driver": int(report.total_bytes),
            "context": int(report.breakdown.get("cuda_context", 0)),
            "tracked": tensors,
        }
    return {
        "allocated": tensors,
        "reserved": reserved,
        "driver": int(report.total_bytes),
        "context": int(report.breakdown.get("cuda_context", 0)),
    }


def margin(estimate: int, measured: int) -> float | None:
    """estimate / measured - 1: positive when the calculator over-estimates."""
    return None if measured <= 0 else estimate / measured - 1


def _outer_cuda(fn: Callable[[], Any]) -> tuple[Any, dict[str, int]]:
    """Run ``fn`` and read torch's own counters around it (a cross-check of measure's readings)."""
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    free, total = torch.cuda.mem_get_info()
    result = fn()
    torch.cuda.synchronize()
    free_after, _ = torch.cuda.mem_get_info()
    outer = {
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "used_before": total - free,
        "used_after": total - free_after,
        "reserved_after": torch.cuda.memory_reserved(),
    }
    outer["outside_allocator_after"] = outer["used_after"] - outer["reserved_after"]
    return result, outer


def run_config(config: Config, device: str, skip: str = "") -> dict[str, Any]:
    """Estimate and measure one configuration (or skip it, saying why): a row of the results."""
    model = model_for(config, device)
    row: dict[str, Any] = {
        "config": config.name,
        "model": model.name,
        "n_params": model.n_params,
        "settings": config.kwargs() | {"device": device},
    }
    row["settings"]["lora_targets"] = list(config.lora_targets)
    missing = [m for m in config.needs if importlib.util.find_spec(m) is None]
    if missing or skip:
        return row | {"status": "skipped", "reason": skip or f"{', '.join(missing)} not installed"}
    estimate = lessonkit.estimate(model, **config.kwargs(), device=device)
    start = time.perf_counter()
    try:
        if device == "cuda":
            measured, row["outer"] = _outer_cuda(
                lambda: lessonkit.measure(model, **config.kwargs(), device=device)
            )
        else:
            measured = lessonkit.measure(model, **config.kwargs(), device=device)
    except Exception as err:  # an OOM or a bug in one configuration must not stop the others
        return row | {"status": "error", "reason": f"{type(err).__name__}: {err}"}
    row["seconds"] = round(time.perf_counter() - start, 2)
    row["estimate"], row["measured"] = readings(estimate), readings(measured)
    row["margins"] = {k: margin(row["estimate"][k], row["measured"][k]) for k in READINGS}
    row["estimate_report"], row["measured_report"] = estimate.to_dict(), measured.to_dict()
    bad = [
        k for k in READINGS if row["margins"][k] is None or abs(row["margins"][k]) > TOLERANCE[k]
    ]
    row["status"] = "fail" if bad else "ok"
    if bad:
        row["reason"] = "outside tolerance: " + ", ".join(bad)
    return row


def derive_constants(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """CUDA context (driver-level minus reserved) and allocator margin (reserved / allocated).

    The largest value seen across the configurations, so that estimates err on the safe side.
    """
    measured = [r["measured"] for r in rows if "measured" in r and r["measured"]["allocated"] > 0]
    if not measured:
        return None
    contexts = [m["driver"] - m["reserved"] for m in measured]
    ratios = [m["reserved"] / m["allocated"] for m in measured]
    return {
        "cuda_context_bytes": max(contexts),
        "allocator_margin_ratio": round(max(ratios), 4),
        "cuda_context_bytes_range": [min(contexts), max(contexts)],
        "allocator_margin_ratio_range": [round(min(ratios), 4), round(max(ratios), 4)],
        "n_configurations": len(measured),
    }


def write_constants(path: Path, derived: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    """Set the measured constants in the CUDA constants data file, citing the measurement."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(
        {
            "cuda_context_bytes": derived["cuda_context_bytes"],
            "allocator_margin_ratio": derived["allocator_margin_ratio"],
            "source": (
                f"measured by scripts/gpu_check.py on {env['gpu']} (driver {env['driver']}, CUDA "
                f"{env['cuda']}, torch {env['torch']}) on {env['date']}: the largest of "
                f"{derived['n_configurations']} configurations; see docs/gpu-validation.md"
            ),
            "as_of": env["date"],
            "measured": {
                k: derived[k]
                for k in (
                    "cuda_context_bytes_range",
                    "allocator_margin_ratio_range",
                    "n_configurations",
                )
            },
        }
    )
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data


# ----- notebooks -----------------------------------------------------------------------------
NOTEBOOK_DIRS = ("notebooks", "solutions", "exercises")


def find_notebooks(root: Path = ROOT) -> list[Path]:
    """The course notebooks, the solutions and the exercises (all run without an error)."""
    return [nb for folder in NOTEBOOK_DIRS for nb in sorted((root / folder).glob("*.ipynb"))]


def notebook_runner() -> tuple[Callable[[Path, Path], None] | None, str]:
    """A function executing one notebook with papermill, or None and why it cannot run here."""
    missing = [m for m in ("papermill", "ipykernel") if importlib.util.find_spec(m) is None]
    if missing:
        return None, (
            f"{' and '.join(missing)} not installed: see docs/gpu-validation.md for an "
            "offline install from wheels"
        )

    def run(notebook: Path, output: Path) -> None:
        # A process per notebook (they run side by side); its kernel finds this checkout's
        # lessonkit through PYTHONPATH and draws headless.
        env = dict(
            os.environ,
            MPLBACKEND=os.environ.get("MPLBACKEND", "Agg"),
            PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        )
        output.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "papermill",
                str(notebook),
                str(output),
                "--cwd",
                str(notebook.parent),
                "-k",
                "python3",
                "--no-progress-bar",
                "--execution-timeout",
                "600",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
        )
        if proc.returncode:
            raise RuntimeError(proc.stderr.strip()[-400:] or f"papermill exited {proc.returncode}")

    return run, ""


def run_notebooks(
    notebooks: list[Path], out: Path, deadline: float, workers: int = 4
) -> list[dict[str, Any]]:
    """Execute each notebook (``workers`` at a time); a row per notebook, in the given order."""
    runner, reason = notebook_runner()

    def one(nb: Path) -> dict[str, Any]:
        name = str(nb.relative_to(ROOT)) if nb.is_relative_to(ROOT) else nb.name
        row: dict[str, Any] = {"notebook": name}
        if runner is None:
            return row | {"status": "skipped", "reason": reason}
        if time.monotonic() > deadline:
            return row | {"status": "skipped", "reason": "time budget spent"}
        start = time.perf_counter()
        try:
            runner(nb, out / "notebooks" / nb.parent.name / nb.name)
            row["status"] = "ok"
        except Exception as err:
            row |= {"status": "fail", "reason": f"{type(err).__name__}: {err}"}
        row["seconds"] = round(time.perf_counter() - start, 1)
        return row

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(one, notebooks))


# ----- the results table -------------------------------------------------------------------
def gb(n: int) -> float:
    """Bytes as GB with four significant figures (tiny dry-run models stay readable)."""
    return float(f"{n / GB:.4g}")


def table_row(row: dict[str, Any]) -> dict[str, Any]:
    s = row["settings"]
    cells: dict[str, Any] = {
        "config": row["config"],
        "model": row["model"],
        "method": s["method"],
        "precision": s["precision"],
        "batch x seq": f"{s['batch_size']} x {s['seq_len']}",
        "checkpointing": "on" if s["gradient_checkpointing"] else "off",
    }
    est, meas, mar = row.get("estimate", {}), row.get("measured", {}), row.get("margins", {})
    for key, est_label, meas_label in (
        ("allocated", "estimate allocated GB", "measured allocated GB"),
        ("reserved", "estimate reserved GB", "measured reserved GB"),
        ("driver", "estimate total GB", "measured driver GB"),
    ):
        cells[est_label] = gb(est[key]) if key in est else None
        cells[meas_label] = gb(meas[key]) if key in meas else None
        cells[f"{key} margin"] = None if mar.get(key) is None else round(100 * mar[key], 1)
    cells["status"] = row["status"] + (f" ({row['reason']})" if row.get("reason") else "")
    return cells


def _cell(value: Any, column: str) -> str:
    if value is None:
        return "-"
    if column.endswith("margin"):
        return f"{value:+.1f}%"
    if column.endswith("GB"):
        return f"{value:g}"
    return str(value).replace("|", "/")


def markdown(results: dict[str, Any]) -> str:
    env = results["environment"]
    lines = [
        f"### GPU validation run of {env['date']} on {env['gpu']}",
        "",
        "| | |",
        "| --- | --- |",
    ]
    if env.get("gpu_memory_bytes"):
        env = env | {"gpu memory": f"{env['gpu_memory_bytes'] / 2**30:.1f} GiB"}
    for key in (
        "gpu",
        "gpu memory",
        "compute_capability",
        "driver",
        "cuda",
        "torch",
        "transformers",
        "peft",
        "accelerate",
        "bitsandbytes",
        "python",
        "date",
    ):
        lines.append(f"| {key} | {env.get(key) or '-'} |")
    tol = ", ".join(f"{k} {100 * v:.0f}%" for k, v in TOLERANCE.items())
    lines += [
        "",
        f"Margins are estimate / measured - 1 (positive: the calculator over-estimates); "
        f"accepted: {tol}.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + " --- |" * len(COLUMNS),
    ]
    for row in results["table"]:
        lines.append("| " + " | ".join(_cell(row[c], c) for c in COLUMNS) + " |")
    if results.get("health"):
        lines += [
            "",
            "| health check | lessonkit | reference | source | ok |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {h['check']} | {h['lessonkit']} | {h['reference']} | {h['source']} | "
            f"{'yes' if h['ok'] else 'NO'} |"
            for h in results["health"]
        ]
    if results.get("notebooks"):
        lines += ["", "| notebook | status | seconds |", "| --- | --- | --- |"]
        lines += [
            f"| {n['notebook']} | {n['status']}{' (' + n['reason'] + ')' if n.get('reason') else ''}"
            f" | {n.get('seconds', '-')} |"
            for n in results["notebooks"]
        ]
    if results.get("derived_constants"):
        d = results["derived_constants"]
        lines += [
            "",
            f"Derived CUDA constants: context {d['cuda_context_bytes'] / 2**20:.0f} MiB "
            f"(range {d['cuda_context_bytes_range'][0] / 2**20:.0f}-"
            f"{d['cuda_context_bytes_range'][1] / 2**20:.0f} MiB), allocator margin "
            f"x{d['allocator_margin_ratio']} (range {d['allocator_margin_ratio_range'][0]}-"
            f"{d['allocator_margin_ratio_range'][1]}).",
        ]
    return "\n".join(lines) + "\n"


def update_docs(path: Path, text: str) -> None:
    """Replace the results section of the validation document (between its markers)."""
    doc = path.read_text()
    if DOCS_START not in doc or DOCS_END not in doc:
        raise SystemExit(f"{path} lacks the markers {DOCS_START} and {DOCS_END}.")
    head, rest = doc.split(DOCS_START, 1)
    path.write_text(head + DOCS_START + "\n" + text + DOCS_END + rest.split(DOCS_END, 1)[1])


# ----- main ----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "out",
        nargs="?",
        type=Path,
        default=ROOT / "artifacts" / "gpu",
        help="folder for results.md and results.json (default: artifacts/gpu/)",
    )
    parser.add_argument(
        "--cpu",
        "--dry-run",
        dest="cpu",
        action="store_true",
        help="run the same code path on the CPU with tiny models",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this configuration (repeatable)",
    )
    parser.add_argument("--no-notebooks", action="store_true", help="skip the notebooks")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=270.0,
        help="skip what has not started after this many seconds (default 270)",
    )
    parser.add_argument(
        "--write-constants",
        action="store_true",
        help="set the CUDA constants data file from this measurement",
    )
    parser.add_argument(
        "--constants",
        type=Path,
        default=CONSTANTS_FILE,
        help="the CUDA constants data file (default: lessonkit/data/cuda_constants.json)",
    )
    parser.add_argument(
        "--update-docs",
        nargs="?",
        type=Path,
        const=DOCS_FILE,
        default=None,
        metavar="FILE",
        help="put the results table into docs/gpu-validation.md",
    )
    args = parser.parse_args(argv)
    if args.cpu and args.write_constants:
        parser.error(
            "--write-constants needs a GPU measurement; a --cpu run has no CUDA context "
            "or allocator to measure"
        )
    names = {c.name for c in GPU_CONFIGS} | {c.name for c in cpu_configs()}
    unknown = [n for n in args.only if n not in names]
    if unknown:
        parser.error(
            f"unknown configuration {', '.join(unknown)}; choose from "
            f"{', '.join(c.name for c in (cpu_configs() if args.cpu else GPU_CONFIGS))}"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    deadline = started + args.budget_s
    import torch

    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA GPU here (torch.cuda.is_available() is False); "
            "use --cpu for a dry run.",
            file=sys.stderr,
        )
        return 2
    env = environment(device)
    print(
        f"gpu_check: {env['gpu']}, torch {env['torch']}, CUDA {env['cuda']}, "
        f"driver {env['driver']}",
        flush=True,
    )
    results: dict[str, Any] = {"environment": env, "tolerance": TOLERANCE, "columns": list(COLUMNS)}

    if device == "cuda":
        results["health"] = health_rows()
        bad = [h["check"] for h in results["health"] if not h["ok"]]
        print(f"health check: {'ok' if not bad else 'MISMATCH in ' + ', '.join(bad)}", flush=True)

    configs = cpu_configs() if args.cpu else list(GPU_CONFIGS)
    if args.only:
        configs = [c for c in configs if c.name in args.only]
    rows = []
    for config in configs:
        row = run_config(
            config, device, skip="time budget spent" if time.monotonic() > deadline else ""
        )
        rows.append(row)
        margins = ", ".join(
            f"{k} {100 * v:+.1f}%" for k, v in row.get("margins", {}).items() if v is not None
        )
        print(
            f"  {config.name:<28} {row['status']:<8} {margins} {row.get('reason', '')}", flush=True
        )
    results["configurations"] = rows
    results["table"] = [table_row(r) for r in rows]
    results["derived_constants"] = derive_constants(rows) if device == "cuda" else None

    notebooks = find_notebooks()
    if args.no_notebooks:
        results["notebooks"] = [
            {"notebook": str(nb.relative_to(ROOT)), "status": "skipped", "reason": "--no-notebooks"}
            for nb in notebooks
        ]
    else:
        print(f"notebooks: {len(notebooks)} in {', '.join(NOTEBOOK_DIRS)}", flush=True)
        results["notebooks"] = run_notebooks(
            notebooks, args.out, deadline, workers=min(6, os.cpu_count() or 1)
        )
        for nb in results["notebooks"]:
            print(f"  {nb['notebook']:<40} {nb['status']} {nb.get('reason', '')}", flush=True)

    failed = (
        [r["config"] for r in rows if r["status"] in ("fail", "error")]
        + [h["check"] for h in results.get("health", []) if not h["ok"]]
        + [n["notebook"] for n in results["notebooks"] if n["status"] == "fail"]
    )
    results["passed"] = not failed
    results["seconds"] = round(time.monotonic() - started, 1)

    args.out.mkdir(parents=True, exist_ok=True)
    text = markdown(results)
    (args.out / "results.md").write_text(text)
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    if args.write_constants:
        if results["derived_constants"] is None:
            print(
                "gpu_check: no configuration was measured; constants left as they are.",
                file=sys.stderr,
            )
        else:
            write_constants(args.constants, results["derived_constants"], env)
            print(f"wrote {args.constants}; run again to check the estimates with them", flush=True)
    if args.update_docs:
        update_docs(args.update_docs, text)
        print(f"updated {args.update_docs}", flush=True)
    print(
        f"gpu_check: {'passed' if not failed else 'FAILED: ' + ', '.join(failed)} in "
        f"{results['seconds']} s; results in {args.out}",
        flush=True,
    )
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
