"""Shared fixtures: tiny federations on scikit-learn's digits (fast on 2 cores)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers import TINY
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
