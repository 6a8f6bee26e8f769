"""What a receiver builds: a global model, an ensemble, or personalised models.

A star method's ``aggregate`` returns any of them; a peer method's ``aggregate_for`` returns a
:class:`GlobalModel` or :class:`Ensemble` for its receiving client, and the runner reports
those per client.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.functional import (
    abstention_weighted_ensemble,
    weighted_hard_vote,
    weighted_logit_mean,
    weighted_softmax_mean,
)
from oneshotfl.models.aggregator import StackedAggregator, stack_member_logits
from oneshotfl.robust import robust_probability_mean
from oneshotfl.training.loop import many_logits

AGGREGATOR = "aggregator"
"""The rule of an ensemble combined by a learned aggregator."""

#: Turns member logits ``[M, N, K]`` (and member weights ``[M]``) into probabilities ``[N, C]``.
Combiner = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class GlobalModel:
    """One model for everyone, with optional diagnostics of how it was built."""

    model: nn.Module
    info: dict[str, Any] = field(default_factory=dict)

    def predict_proba(self, x: torch.Tensor, device: torch.device) -> torch.Tensor:
        return F.softmax(many_logits([self.model], x, device)[0], dim=-1)


def combiner(rule: str) -> Combiner:
    """The combiner a rule names: ``probabilities`` (weighted mean of softmaxes), ``logits``
    (softmax of the weighted mean logits), ``median`` / ``trimmed_mean:T`` (per class, over
    the members' probabilities), ``abstention:K`` (FedOV/FedEOV's vote of the K members least
    sure of the last, "unknown", class; ``abstention:all`` is Theorem 2 over every member),
    ``vote`` (the weighted majority vote of their labels).

    Raises:
        ValueError: for an unknown rule.
    """
    name, _, arg = rule.partition(":")
    if name == "probabilities":
        return weighted_softmax_mean
    if name == "logits":
        return weighted_logit_mean
    if name == "vote":
        return weighted_hard_vote
    if name in ("median", "trimmed_mean"):
        try:
            trim = float(arg) if arg else 0.2
        except ValueError:
            raise ValueError(f"ensemble rule {rule!r}: expected a number after ':'") from None
        mode: Literal["median", "trimmed_mean"] = "median" if name == "median" else "trimmed_mean"

        def robust(logits: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
            return robust_probability_mean(torch.softmax(logits, -1), mode, trim)

        return robust
    if name == "abstention":
        accepted = None if arg in ("", "all") else int(arg)

        def abstain(logits: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
            return abstention_weighted_ensemble(logits, accepted)

        return abstain
    raise ValueError(
        f"ensemble rule: expected probabilities, logits, vote, median, trimmed_mean:T or "
        f"abstention:K, got {rule!r}"
    )


@dataclass
class Ensemble:
    """Members whose outputs a combiner merges, as ``rule`` names it (:func:`combiner`;
    default: the weighted mean of softmaxes) — the rule is what a saved ensemble records.
    With a learned ``aggregator`` (FENS's; rule ``aggregator``) the combiner is that module
    over the members' stacked logits (:class:`~oneshotfl.models.aggregator.StackedAggregator`)
    and the weights are unused."""

    members: Sequence[nn.Module]
    weights: torch.Tensor | None = None
    rule: str = "probabilities"
    info: dict[str, Any] = field(default_factory=dict)
    aggregator: StackedAggregator | None = None
    combine: Combiner = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if (self.aggregator is None) == (self.rule == AGGREGATOR):
            raise ValueError(
                f"ensemble: rule {AGGREGATOR!r} goes with a learned aggregator and only with "
                f"one, got rule {self.rule!r} and aggregator {type(self.aggregator).__name__}"
            )
        self.combine = self._aggregated if self.aggregator is not None else combiner(self.rule)
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
        """The combined probabilities on ``x`` (the members' logits as
        :func:`~oneshotfl.training.loop.many_logits` gives them, one member at a time)."""
        logits = torch.stack(many_logits(list(self.members), x, device, stack=False))
        assert self.weights is not None
        return self.combine(logits, self.weights)

    @torch.no_grad()
    def _aggregated(self, logits: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
        assert self.aggregator is not None
        device = next(self.aggregator.parameters()).device
        stacked = stack_member_logits(logits).to(device)
        return F.softmax(self.aggregator.eval()(stacked), dim=-1).cpu()


@dataclass
class Personalised:
    """One model per client (client id → model)."""

    models: Mapping[int, nn.Module]

    def predict_proba_for(self, client: int, x: torch.Tensor, device: torch.device) -> torch.Tensor:
        return F.softmax(many_logits([self.models[client]], x, device)[0], dim=-1)


Outcome = GlobalModel | Ensemble | Personalised
