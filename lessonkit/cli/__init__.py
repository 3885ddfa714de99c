"""The ``lessonkit`` command: ``vram``, ``check``, ``recommend`` and ``oom``.

The top layer: imports whatever it needs from below; nothing imports it.
"""

from .main import main

__all__ = ["main"]
