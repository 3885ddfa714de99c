"""What today's usual fine-tuning recipes do by default (lessonkit/data/recipes.json).

Each default names its source and the ``estimate`` setting it corresponds to, so that "the usual
recipe" is a checked statement: ``usual_recipe("trainer")`` gives the estimate() keywords of
transformers' Trainer(bf16=True) with the pinned versions, ``usual_recipe("sft")`` those of TRL's
SFTTrainer; ``recipe_defaults`` lists the defaults with their sources, including those the
calculator does not model.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from ..errors import choose


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        resources.files("lessonkit").joinpath("data/recipes.json").read_text()
    )
    return data


def recipe_names() -> tuple[str, ...]:
    return tuple(_data()["recipes"])


def recipe_defaults(recipe: str) -> list[dict[str, Any]]:
    """The recipe's defaults: setting, value, ``estimate`` keywords (None: not modelled),
    source and as-of date."""
    key = choose(recipe, recipe_names(), "recipe")
    return [dict(d) for d in _data()["recipes"][key]["defaults"]]


def usual_recipe(recipe: str = "trainer") -> dict[str, Any]:
    """The estimate() keywords for the defaults of ``recipe`` that the calculator models."""
    out: dict[str, Any] = {}
    for default in recipe_defaults(recipe):
        out.update(default["estimate"] or {})
    return out


def not_modelled(recipe: str) -> list[str]:
    """The recipe's defaults the estimate does not model, with why (their sources say)."""
    return [
        f"{d['setting']}={d['value']!r}: {d['source']}"
        for d in recipe_defaults(recipe)
        if d["estimate"] is None
    ]
