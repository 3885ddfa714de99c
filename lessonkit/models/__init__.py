"""What a model is: its shapes (``ModelSpec``), the presets, reading a Hugging Face
``config.json``, and what today's usual fine-tuning recipes do by default.

Layer 1 of lessonkit: imports only the basics at the package's top (errors, units, options,
safe_repr), never the layers above it.
"""

from .presets import get_preset, preset_groups, preset_names, resolve_model
from .recipes import not_modelled, recipe_defaults, recipe_names, usual_recipe
from .spec import ModelSpec

__all__ = [
    "ModelSpec",
    "get_preset",
    "not_modelled",
    "preset_groups",
    "preset_names",
    "recipe_defaults",
    "recipe_names",
    "resolve_model",
    "usual_recipe",
]
