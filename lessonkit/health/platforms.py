"""Where this Python process runs: Colab, Kaggle, SageMaker, another cloud, or a local machine.

The signals are listed per environment in ``data/environments.json`` ("detect"):
- Colab: module ``google.colab`` imported, env ``COLAB_RELEASE_TAG`` / ``COLAB_GPU``, dir ``/content``;
- Kaggle: env ``KAGGLE_KERNEL_RUN_TYPE`` / ``KAGGLE_URL_BASE``, dir ``/kaggle/working``, module
  ``kaggle_secrets``;
- SageMaker: env ``SM_CURRENT_HOST`` / ``TRAINING_JOB_NAME`` (training jobs) or any ``SAGEMAKER_*``
  variable, or the files ``/opt/ml/input/config/resourceconfig.json`` (training jobs) and
  ``/opt/ml/metadata/resource-metadata.json`` (notebook instances and Studio);
- Vertex AI: env ``AIP_MODEL_DIR`` / ``CLOUD_ML_JOB_ID``; Azure ML: env ``AZUREML_*``;
  RunPod: env ``RUNPOD_POD_ID``.
Anything else is reported as a local machine.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Platform:
    """Where the check ran, with the signals that said so."""

    key: str  # "colab", "kaggle", "sagemaker", ... or "local"
    name: str  # "Google Colab"
    signals: tuple[str, ...] = ()  # e.g. ("env COLAB_RELEASE_TAG", "module google.colab")
    environments: tuple[str, ...] = field(default=())  # keys in environments.json

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "name": self.name,
            "signals": list(self.signals),
            "environments": list(self.environments),
        }

    def __str__(self) -> str:
        if not self.signals:
            return f"{self.name} (no Colab, Kaggle or cloud signals found)"
        return f"{self.name} ({', '.join(self.signals)})"


LOCAL = Platform("local", "local machine")


def _signals(
    detect: Mapping[str, Any],
    environ: Mapping[str, str],
    modules: Iterable[str],
    exists: Callable[[str], bool],
) -> list[str]:
    found = [f"module {m}" for m in detect.get("modules", ()) if m in modules]
    found += [f"env {v}" for v in detect.get("env", ()) if v in environ]
    for prefix in detect.get("env_prefixes", ()):
        names = sorted(v for v in environ if v.startswith(prefix) and f"env {v}" not in found)
        found += [f"env {names[0]}"] if names else []
    found += [f"path {p}" for p in detect.get("paths", ()) if _safe_exists(exists, p)]
    return found


def _safe_exists(exists: Callable[[str], bool], path: str) -> bool:
    try:
        return bool(exists(path))
    except (OSError, ValueError):
        return False


def detect_platform(
    environ: Mapping[str, str] | None = None,
    modules: Iterable[str] | None = None,
    exists: Callable[[str], bool] | None = None,
) -> Platform:
    """The platform this process runs on (arguments default to the real environment)."""
    from ..hardware.environments import list_environments

    environ = os.environ if environ is None else environ
    modules = set(sys.modules if modules is None else modules)
    exists = os.path.exists if exists is None else exists
    groups: dict[str, list[Any]] = {}
    for env in list_environments():
        if env.detect:
            groups.setdefault(env.detect.get("platform", env.key), []).append(env)
    best: Platform | None = None
    best_strength = 0
    for key, envs in groups.items():
        detect = envs[0].detect
        signals = _signals(detect, environ, modules, exists)
        # A lone directory is a weaker signal than an environment variable or a module.
        strength = sum(1 if s.startswith("path ") else 2 for s in signals)
        if signals and (best is None or strength > best_strength):
            best, best_strength = (
                Platform(
                    key,
                    detect.get("platform_name", envs[0].name),
                    tuple(signals),
                    tuple(e.key for e in envs),
                ),
                strength,
            )
    return best or LOCAL
