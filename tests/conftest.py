"""Shared fixtures: tiny federations on scikit-learn's digits (fast on 2 cores)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import TINY
from oneshotfl import plugins
from oneshotfl.encoders.base import ENCODERS
from oneshotfl.methods import METHODS
from oneshotfl.models import MODELS
from oneshotfl.runner.config import ExperimentConfig, make_config


@pytest.fixture
def tiny_config(tmp_path: Path) -> Any:
    """A factory of small digits configs (3 clients, 1 epoch, cache in tmp_path)."""

    def make(**overrides: Any) -> ExperimentConfig:
        values: dict[str, Any] = {
            **TINY,
            "cache_dir": str(tmp_path / "cache"),
            "methods": ["local", "fedavg", "ensemble", "centralized"],
        }
        values.update(overrides)
        return make_config(values)

    return make


@pytest.fixture
def forget() -> Iterator[list[str]]:
    """Names the test registers and modules it loads, removed again afterwards."""
    names: list[str] = []
    before = set(sys.modules)
    yield names
    for name in names:
        for registry in (METHODS, MODELS, ENCODERS):
            registry._entries.pop(name, None)  # tests only: the registry has no removal
    for module in set(sys.modules) - before:
        if "oneshotfl_plugin" in module or module.startswith("my_plugin"):
            del sys.modules[module]
    plugins._loaded.clear()
    plugins._scanned.clear()
