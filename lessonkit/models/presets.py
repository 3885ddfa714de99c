"""The presets shipped with lessonkit (lessonkit/data/models.json), bare sizes, and
resolve_model: what a model given as a name, a size, a config or a ModelSpec is."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import LessonkitError, normalise_name, real_number, unknown_name_message
from ..safe_repr import short_repr
from ..units import parse_count
from .spec import ModelSpec

# The longest name a model (preset, size or config path) may have.
_MAX_NAME = 4096


@lru_cache(maxsize=1)
def _preset_data() -> dict[str, dict[str, Any]]:
    text = resources.files("lessonkit").joinpath("data/models.json").read_text()
    return {entry["name"]: entry for entry in json.loads(text)["models"]}


# How a model menu names each family's group of presets.
FAMILY_LABELS = {
    "llama": "Llama",
    "mistral": "Mistral",
    "qwen2": "Qwen2.5",
    "qwen3": "Qwen3",
    "qwen3_moe": "Qwen3-MoE",
    "mixtral": "Mixtral",
    "gpt_oss": "gpt-oss",
    "gemma": "Gemma",
    "gemma2": "Gemma 2",
    "gemma3_text": "Gemma 3",
    "phi3": "Phi",
    "olmo2": "OLMo 2",
    "smollm3": "SmolLM",
    "granite": "Granite",
    "gpt2": "GPT-2",
}


def preset_groups() -> dict[str, list[str]]:
    """The presets by family, for a model menu: {"Llama": ["llama-2-7b", ...], "Qwen3": [...]},
    the families in the order their first preset appears, each family's presets in file order."""
    groups: dict[str, list[str]] = {}
    for name, entry in _preset_data().items():
        family = entry["shape"]["family"]
        groups.setdefault(FAMILY_LABELS.get(family, family), []).append(name)
    return groups


def preset_names() -> list[str]:
    """Names of the model presets shipped with lessonkit, grouped by family (preset_groups)."""
    return [name for names in preset_groups().values() for name in names]


@cache
def _preset_keys() -> dict[str, str]:
    """Each preset's name and aliases, normalised, to the preset's name."""
    by_key: dict[str, str] = {}
    for preset, entry in _preset_data().items():
        for alias in [preset, *entry.get("aliases", [])]:
            by_key[normalise_name(alias)] = preset
    return by_key


@cache
def get_preset(name: str) -> ModelSpec:
    """A preset by name, forgiving case and separators ('Llama-2-7B', 'llama2 7b')."""
    key = _preset_keys().get(normalise_name(name))
    if key is None:
        raise LessonkitError(unknown_name_message(name, preset_names(), "model"))
    entry = _preset_data()[key]
    note = f"{entry['source']} (as of {entry['as_of']})"
    if entry.get("notes"):  # what the figures assume of the checkpoint (gpt-oss's MXFP4)
        note = f"{note}. {entry['notes']}"
    if normalise_name(name) != normalise_name(key):  # another name, not a spelling of this one
        note = f"{short_repr(name.strip())} is read as the preset {key}. {note}"
    return ModelSpec(name=key, note=note, **entry["shape"])


_ALIAS_NOTE = re.compile(r"'[^']*' is read as the preset \S+\.")


def alias_note(spec: ModelSpec) -> str:
    """ "'llama-3-8b' is read as the preset llama-3.1-8b." when ``spec`` came from a name that
    stands for another preset; "" otherwise."""
    match = _ALIAS_NOTE.match(spec.note)
    return match.group(0) if match else ""


def spec_for_size(n_params: float) -> ModelSpec:
    """A representative Llama-style shape for a bare parameter count, saying which one it is."""
    if math.isnan(n_params):
        raise LessonkitError("A model size must be a number of parameters, got nan.")
    if n_params < 1e6:
        raise LessonkitError(f"A model size must be at least 1M parameters, got {n_params:g}.")
    if n_params > 2e12:
        raise LessonkitError(f"A model size must be at most 2T parameters, got {n_params:g}.")
    size = _format_count(n_params)
    for name in _preset_data():
        entry = _preset_data()[name]
        if entry.get("represents_size"):
            spec = get_preset(name)
            if abs(spec.n_params - n_params) <= 0.15 * n_params:
                return replace(
                    spec,
                    name=f"{size} ({name} shape)",
                    note=f"A bare size of {size} is shown as {name} "
                    f"({spec.n_params / 1e9:.2f}B parameters).",
                )
    return _synthetic_llama(n_params, size)


def _synthetic_llama(n_params: float, size: str) -> ModelSpec:
    vocab = 32000
    # Llama-like proportions: 128 hidden units per layer, MLP 8/3 of hidden, untied head.
    hidden = 256
    while True:
        layers = max(1, round(hidden / 128))
        if 12 * layers * hidden**2 + 2 * vocab * hidden >= n_params or hidden > 32768:
            break
        hidden += 256
    heads = max(1, hidden // 128)
    inter = int(math.ceil(hidden * 8 / 3 / 256) * 256)
    per_layer = 4 * hidden * hidden + 3 * hidden * inter + 2 * hidden
    layers = max(1, round((n_params - 2 * vocab * hidden - hidden) / per_layer))
    spec = ModelSpec(
        name=f"{size} (Llama-style shape)",
        family="llama",
        n_layers=layers,
        hidden_size=hidden,
        n_heads=heads,
        n_kv_heads=heads,
        intermediate_size=inter,
        vocab_size=vocab,
    )
    return replace(
        spec,
        note=f"A bare size of {size} is shown as a Llama-style shape: "
        f"{layers} layers of width {hidden} "
        f"({spec.n_params / 1e9:.2f}B parameters).",
    )


def _format_count(n: float) -> str:
    return f"{n / 1e9:g}B" if n >= 1e9 else f"{n / 1e6:g}M"


def resolve_model(model: object) -> ModelSpec:
    """Turn a ModelSpec, preset name, size ('7B', 7e9) or HF config dict into a ModelSpec."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, Mapping):
        return ModelSpec.from_hf_config(model)
    if isinstance(model, Path):
        return ModelSpec.from_hf_config(model)
    size = real_number(model)  # a size: Python's or numpy's numbers
    if size is not None:
        try:
            return spec_for_size(float(size))
        except OverflowError:  # an integer beyond any float
            return spec_for_size(math.inf)
    if isinstance(model, str):
        if not model.strip():
            raise LessonkitError(
                "The model name is empty: give a preset name (e.g. 'llama-2-7b'), "
                "a size in parameters ('7B') or a config.json path."
            )
        if len(model) > _MAX_NAME:
            raise LessonkitError(
                f"A model name or path of {len(model):,} characters is too long "
                f"(at most {_MAX_NAME:,}): {short_repr(model)}."
            )
        if normalise_name(model) in _preset_keys():
            return get_preset(model)
        try:
            size = parse_count(model)
        except LessonkitError:
            size = None
        if size is not None:  # a size: out of range says so
            try:
                return spec_for_size(size)
            except LessonkitError as out_of_range:
                raise LessonkitError(
                    f"{out_of_range} A size counts parameters: '7B', '1.5B', '350M' (not GB)."
                ) from None
        if model.endswith(".json") or _is_path(model):
            return ModelSpec.from_hf_config(model)
        nowhere = " Nor is it a file or folder here." if "/" in model or "\\" in model else ""
        not_a_preset = unknown_name_message(model, preset_names(), "model")
        raise LessonkitError(
            f"{not_a_preset} Or a size in parameters: '7B', '1.5B', '350M' (not GB).{nowhere}"
        )
    try:
        shown = repr(model)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
    except Exception:  # an object that cannot print itself
        shown = "(unprintable)"
    raise LessonkitError(
        f"A model is a preset name (e.g. 'llama-2-7b'), a size ('7B' or 7e9), a ModelSpec or a "
        f"config dict; got {type(model).__name__} {shown}."
    )


def _is_path(path: str) -> bool:
    """A folder, or a file or link that exists (a loop of links too): read as a config."""
    try:
        return Path(path).is_dir() or os.path.lexists(path)
    except (OSError, ValueError):  # a name too long, a NUL byte: not a path
        return False
