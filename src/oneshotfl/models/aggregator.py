"""Learned aggregators over an ensemble's outputs: what FENS (Allouah et al., NeurIPS 2024)
trains by federated learning over its frozen client models.

Both take the members' logits stacked member-major, ``z = [z_1, …, z_K]`` of width K·C
(``Ensemble``'s ``[K, N, C]`` logits as ``[N, K·C]``), and return C logits:

* ``nn`` — the authors' default ``SmallNN``: Linear(K·C → K·d) → ReLU → Linear(K·d → C),
  ``d = hidden`` units per member; initialised as PyTorch's ``nn.Linear`` (uniform in
  ±1/√fan_in) from the given generator;
* ``linear`` — one weight per member and a bias per class, Σ_k w_k z_k + b; it starts as
  the plain logit mean (w_k = 1/K, b = 0).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

AggregatorKind = Literal["nn", "linear"]


class StackedAggregator(nn.Module):
    """A learned combiner of ``members`` models' ``classes`` logits (see the module docs).

    Args:
        kind: ``nn`` or ``linear``.
        members: K, the members whose logits are stacked.
        classes: C, each member's outputs (and the aggregator's).
        hidden: d, hidden units per member (``nn`` only).
        generator: the initialisation's random stream (``None``: the global one).
    """

    def __init__(
        self,
        kind: AggregatorKind,
        members: int,
        classes: int,
        hidden: int = 2,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if members < 1 or classes < 1 or hidden < 1:
            raise ValueError(
                f"StackedAggregator: expected members, classes and hidden >= 1, got "
                f"{members}, {classes}, {hidden}"
            )
        self.kind, self.members, self.classes, self.hidden = kind, members, classes, hidden
        if kind == "nn":
            self.hidden_layer = nn.Linear(members * classes, members * hidden)
            self.out = nn.Linear(members * hidden, classes)
            with torch.no_grad():
                for layer in (self.hidden_layer, self.out):
                    bound = 1.0 / math.sqrt(layer.in_features)
                    for p in (layer.weight, layer.bias):
                        p.copy_(torch.rand(p.shape, generator=generator) * 2 * bound - bound)
        elif kind == "linear":
            self.weight = nn.Parameter(torch.full((members,), 1.0 / members))
            self.bias = nn.Parameter(torch.zeros(classes))
        else:
            raise ValueError(f"StackedAggregator: expected kind nn or linear, got {kind!r}")

    def forward(self, stacked: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, C]`` from the members' stacked logits ``[N, K·C]``."""
        if stacked.shape[-1] != self.members * self.classes:
            raise ValueError(
                f"StackedAggregator: expected {self.members}×{self.classes} stacked logits, "
                f"got width {stacked.shape[-1]}"
            )
        if self.kind == "nn":
            return self.out(torch.relu(self.hidden_layer(stacked)))
        per_member = stacked.reshape(-1, self.members, self.classes)
        return torch.einsum("nkc,k->nc", per_member, self.weight) + self.bias


def stack_member_logits(logits: torch.Tensor) -> torch.Tensor:
    """``[K, N, C]`` member logits as the aggregator's ``[N, K·C]`` input (member-major)."""
    members, n, classes = logits.shape
    return logits.permute(1, 0, 2).reshape(n, members * classes)
