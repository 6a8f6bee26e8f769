"""oneshotfl: one-shot federated learning methods on one shared, reproducible core.

The Python API (:mod:`oneshotfl.api`) is loaded on first use, so ``import oneshotfl`` stays
cheap: ``oneshotfl.run(...)``, ``oneshotfl.sweep(...)``, ``oneshotfl.Result``,
``oneshotfl.SweepResult`` and ``oneshotfl.ConfigError``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from oneshotfl._version import __version__

if TYPE_CHECKING:
    from oneshotfl.api import ConfigError, Result, SweepResult, run, sweep

__all__ = ["ConfigError", "Result", "SweepResult", "__version__", "run", "sweep"]

_API = frozenset({"ConfigError", "Result", "SweepResult", "run", "sweep"})


def __getattr__(name: str) -> Any:
    """Load the Python API on first use (it imports torch)."""
    if name in _API:
        value = getattr(importlib.import_module("oneshotfl.api"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'oneshotfl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
