"""Helpers shared by test modules (pytest puts this folder on ``sys.path``)."""

from __future__ import annotations

from typing import Any

import torch

from oneshotfl.federation.contract import ServerContext, TaskInfo
from oneshotfl.training.loop import TrainConfig


def make_server_context(task: TaskInfo, **overrides: Any) -> ServerContext:
    """A CPU server context for ``task`` with one mlp client and no public pool by default."""
    values: dict[str, Any] = dict(
        task=task,
        public=None,
        server_arch=None,
        client_archs=("mlp",),
        train_config=TrainConfig(epochs=1),
        client_train_config=TrainConfig(),
        num_clients=1,
        device=torch.device("cpu"),
        seed=0,
    )
    values.update(overrides)
    return ServerContext(**values)
