"""The hardware that exists: the GPU catalog (memory, bandwidth, prices) and the environments
that rent it (free notebooks, GPU clouds, enterprise clouds), each figure with its source.

Layer 3 of lessonkit: imports the basics, ``lessonkit.models`` and ``lessonkit.memory``.
"""

from .environments import Environment, Offer, get_environment, list_environments
from .gpus import GPU, find_gpu, get_gpu, gpu_names, list_gpus, memory_units_note

__all__ = [
    "GPU",
    "Environment",
    "Offer",
    "find_gpu",
    "get_environment",
    "get_gpu",
    "gpu_names",
    "list_environments",
    "list_gpus",
    "memory_units_note",
]
