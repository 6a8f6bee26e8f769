"""Helpers shared by test modules (pytest puts this folder on ``sys.path``)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from oneshotfl.data.types import TaskInfo
from oneshotfl.methods import METHODS
from oneshotfl.methods.base import register_method
from oneshotfl.protocol.contract import Method, ServerContext
from oneshotfl.runner import engine
from oneshotfl.runner.checks import image_problems, requirement_problems
from oneshotfl.runner.config import ExperimentConfig
from oneshotfl.runner.errors import refuse
from oneshotfl.runner.experiment import run_experiment
from oneshotfl.runner.federation import Federation
from oneshotfl.runner.ledger import Ledger
from oneshotfl.runner.plan import build_run_graph, federation_plan, preflight
from oneshotfl.runner.results import MethodResult
from oneshotfl.runner.transport import LocalTransport, Transport
from oneshotfl.training.loop import TrainConfig

TINY: dict[str, Any] = {
    "dataset": "digits",
    "clients": 3,
    "model": "mlp",
    "local_epochs": 1,
    "local_steps": 0,
    "server_steps": 0,
    "batch_size": 32,
    "lr": 0.05,
    "partition": "dirichlet",
    "alpha": 1.0,
    "min_samples": 5,
    "device": "cpu",
    "workers": 1,
}
"""The tiny digits federation of the tests: 3 clients, an MLP, one epoch and no step floors
(fast on 2 cores)."""


def make_server_context(task: TaskInfo, **overrides: Any) -> ServerContext:
    """A CPU server context for ``task`` with one mlp client and no public pool by default."""
    values: dict[str, Any] = dict(
        task=task,
        public=None,
        server_arch=None,
        client_archs=("mlp",),
        train_config=TrainConfig(epochs=1),
        client_train_config=TrainConfig(),
        device=torch.device("cpu"),
        seed=0,
    )
    values.update(overrides)
    return ServerContext(**values)


def prepare(cfg: ExperimentConfig) -> Federation:
    """The prepared federation of ``cfg`` (data carved, encoder and graph built; its methods
    unchecked)."""
    fed = Federation.prepare(federation_plan(cfg))
    return dataclasses.replace(fed, graph=build_run_graph(cfg))


def run_method(key: str, method: Method[Any], fed: Federation) -> dict[str, Any]:
    """One method over the in-process transport, as its result.json entry."""
    return run_over(key, method, fed, LocalTransport(fed)).to_dict()


def run_over(key: str, method: Method[Any], fed: Federation, transport: Transport) -> MethodResult:
    """One method over ``transport`` with a fresh ledger, as the engine returns it."""
    ledger = Ledger(fed.cfg.clients, fed.data.task.num_classes)
    return engine.run_method(key, method, fed.server_view(), transport, ledger)


def check(fed: Federation, methods: Sequence[tuple[str, Method[Any]]]) -> None:
    """What a run checks of ``methods`` on ``fed``: their requirements (as
    :func:`~oneshotfl.runner.plan.preflight` does), the images they need and the attacks
    dealt out (as :meth:`Federation.prepare` does)."""
    cfg = fed.cfg
    problems = requirement_problems(cfg, methods, fed.archs, cfg.public_size > 0, bool(cfg.encoder))
    refuse(problems + image_problems(methods, fed.data.task))
    fed.check_attacks(methods)


def run_config(cfg: ExperimentConfig, **kwargs: Any) -> dict[str, Any]:
    """Check ``cfg`` and run it in process, as ``oneshotfl run`` does; its result document."""
    return run_experiment(preflight(cfg), **kwargs)


@contextlib.contextmanager
def registered(name: str, cls: type[Method[Any]]) -> Iterator[None]:
    """Register a test's own method under ``name`` for the ``with`` block only."""
    register_method(name, cls.__doc__ or name)(cls)
    try:
        yield
    finally:
        del METHODS._entries[name]  # the registry has no public removal: tests only


DEMO_AT_A_TINY_BUDGET = [
    "fedavg", "ensemble", "centralized", "fedol:iterations=1:epochs_per_iteration=1",
    "fedage:block_epochs=1:ensemble_epochs=1", "fedeov:fgsm_steps=1",
    "intactofl:rounds=1:generator_steps=1", "fol:rounds=1:kd_epochs=1",
]  # fmt: skip
"""The demo's methods (``configs/demo.yaml``) at budgets of a few seconds."""


def tiny_demo(cache: Path, **overrides: Any) -> ExperimentConfig:
    """``make demo``'s config with :data:`DEMO_AT_A_TINY_BUDGET`, one epoch, a one-epoch
    SimCLR encoder and its cache at ``cache``; ``overrides`` on top."""
    from oneshotfl.api import resolve_config

    demo = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"
    values: dict[str, Any] = {
        "local_epochs": 1, "encoder": "simclr:epochs=1", "cache_dir": str(cache),
        "methods": DEMO_AT_A_TINY_BUDGET, **overrides,
    }  # fmt: skip
    return resolve_config(demo, **values)


def table_npz(folder: Path) -> str:
    """A small separable table (450 rows, 6 features, 3 classes) saved as an npz in
    ``folder``; its dataset spec."""
    import numpy as np

    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 450)
    x = (rng.normal(0, 1, (450, 6)) + np.eye(3, 6)[y] * 2.5).astype(np.float32)
    np.savez(folder / "t.npz", x=x, y=y)
    return f"npz:path={folder / 't.npz'}"


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """The Python file ``path`` (a script of ``scripts/`` or ``examples/``) imported as a module
    named ``name`` (default: its stem), registered in ``sys.modules`` so its dataclasses resolve."""
    module_name = name or path.stem
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
