"""What a receiver builds: a global model, an ensemble, or personalised models.

A star method's ``aggregate`` returns any of them; a peer method's ``aggregate_for`` returns a
:class:`GlobalModel` or :class:`Ensemble` for its receiving client, and the runner reports
those per client.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.functional import weighted_softmax_mean
from oneshotfl.training.loop import predict_logits

#: Turns member logits ``[M, N, K]`` (and member weights ``[M]``) into probabilities ``[N, C]``.
Combiner = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class GlobalModel:
    """One model for everyone, with optional diagnostics of how it was built."""

    model: nn.Module
    info: dict[str, Any] = field(default_factory=dict)

    def predict_proba(self, x: torch.Tensor, device: torch.device) -> torch.Tensor:
        return F.softmax(predict_logits(self.model, x, device), dim=-1)


@dataclass
class Ensemble:
    """Members whose outputs a combiner merges (default: weighted mean of softmaxes)."""

    members: Sequence[nn.Module]
    weights: torch.Tensor | None = None
    combine: Combiner = field(default=weighted_softmax_mean)
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.members:
            raise ValueError("an ensemble needs at least one member, got none")
        if self.weights is None:
            self.weights = torch.ones(len(self.members))
        if self.weights.shape != (len(self.members),):
            raise ValueError(
                f"ensemble weights: expected shape ({len(self.members)},), "
                f"got {tuple(self.weights.shape)}"
            )

    def predict_proba(self, x: torch.Tensor, device: torch.device) -> torch.Tensor:
        logits = torch.stack([predict_logits(m, x, device) for m in self.members])
        assert self.weights is not None
        return self.combine(logits, self.weights)


@dataclass
class Personalised:
    """One model per client (client id → model)."""

    models: Mapping[int, nn.Module]

    def predict_proba_for(self, client: int, x: torch.Tensor, device: torch.device) -> torch.Tensor:
        return F.softmax(predict_logits(self.models[client], x, device), dim=-1)


Outcome = GlobalModel | Ensemble | Personalised
