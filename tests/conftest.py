"""Shared fixtures: tiny federations on scikit-learn's digits (fast on 2 cores)."""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import TINY, run_config
from oneshotfl import plugins
from oneshotfl.encoders.base import ENCODERS
from oneshotfl.methods import METHODS
from oneshotfl.models import MODELS
from oneshotfl.runner.config import ExperimentConfig, make_config


def tiny(cache: Path, **overrides: Any) -> ExperimentConfig:
    """A small digits config (3 clients, 1 epoch, the seed methods) caching in ``cache``;
    ``overrides`` on top."""
    values: dict[str, Any] = {
        **TINY,
        "cache_dir": str(cache),
        "methods": ["local", "fedavg", "ensemble", "centralized"],
    }
    values.update(overrides)
    return make_config(values)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--dist loadgroup`` (pyproject.toml) on pytest 9.2: an xdist worker marks a test of
    ``xdist_group(NAME)`` by appending ``@NAME`` to ``item._nodeid``, which pytest 9.2's
    structured ids no longer read, so no test was grouped (pytest-dev/pytest-xdist#1386, to
    3.8 at least). Append it where the id is read now; nothing where xdist's own suffix took
    or without loadgroup (no ``-n``)."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        marks = list(item.iter_markers("xdist_group"))
        nodeid = item.nodeid
        parse = getattr(type(getattr(item, "_id", None)), "parse", None)
        if not marks or nodeid.rfind("@") > nodeid.rfind("]") or parse is None:
            continue
        names = sorted(
            {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in marks}
        )
        item._id = parse(f"{nodeid}@{'_'.join(names)}")  # type: ignore[attr-defined]  # NodeId


@pytest.fixture
def tiny_config(tmp_path: Path) -> Any:
    """A factory of small digits configs (3 clients, 1 epoch, cache in tmp_path)."""
    return functools.partial(tiny, tmp_path / "cache")


@pytest.fixture(scope="session")
def _open_set_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any]]:
    from test_fedeov import open_set_config

    cfg = open_set_config(functools.partial(tiny, tmp_path_factory.mktemp("open-set") / "cache"))
    return cfg, run_config(cfg)


@pytest.fixture
def open_set_run(_open_set_run: tuple[Any, dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
    """The open-set methods' tiny run (``test_fedeov.open_set_config``), run locally once a
    session: its config and a copy of its result document. Its tests are marked
    ``xdist_group("open-set")``, so that one worker runs them all and the run once."""
    cfg, doc = _open_set_run
    return cfg, copy.deepcopy(doc)


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
