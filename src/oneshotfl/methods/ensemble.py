"""The ensemble of client models: average of client softmaxes (or of their logits).

The strong one-shot reference of FedDF (Lin et al. 2020), DENSE (Zhang et al. 2022) and
IntactOFL: the server keeps every client model and predicts Σ_k w_k softmax(f_k(x)) / Σ_k w_k.
With ``weighting=uniform`` w_k = 1; with ``weighting=size`` w_k = n_k, the client's example
count. ``combine=logits`` averages the logits instead, softmax(Σ_k w_k f_k(x) / Σ_k w_k): the
ensemble the IntactOFL and DENSE code bases evaluate, and exactly what IntactOFL's mixture of
experts computes with a uniform gate. Robust modes (``aggregation``, :mod:`oneshotfl.robust`):
the members' probabilities combined per class by their ``median`` or ``trimmed_mean`` (``trim``
β dropped at each end), renormalised; member weights are not used then.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from oneshotfl.functional import Weighting, client_weights
from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import client_models
from oneshotfl.methods.common import SendsTrainedModel
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ServerContext
from oneshotfl.protocol.limits import KnownLimit
from oneshotfl.protocol.outcome import Ensemble as EnsembleOutcome
from oneshotfl.protocol.outcome import Outcome


@dataclass(frozen=True)
class EnsembleConfig(Params):
    """Ensemble hyper-parameters.

    Attributes:
        weighting: how much each client's model counts: ``uniform`` (every member 1),
            ``size`` (weighted by n_k) or ``clipped`` (n_k capped at twice the median: one
            client cannot take the vote).
        combine: what is averaged: ``probabilities`` (the mean of the members' softmaxes) or
            ``logits`` (the softmax of their mean logits).
        aggregation: how the members are combined: ``mean`` (as ``combine`` says), or a
            robust ``median`` or ``trimmed_mean`` of the members' probabilities.
        trim: the fraction β of members dropped at each end by ``trimmed_mean``.
    """

    weighting: Weighting = "uniform"
    combine: Literal["probabilities", "logits"] = "probabilities"
    aggregation: Literal["mean", "median", "trimmed_mean"] = "mean"
    trim: float = 0.2

    def validate(self) -> None:
        require(0 <= self.trim < 0.5, "trim", "in [0, 0.5)", self.trim)


@register_method(
    "ensemble", "average of client softmaxes (weighting=uniform|size, combine=probabilities|logits)"
)
class Ensemble(SendsTrainedModel[EnsembleConfig]):
    """Probability-averaging ensemble of the client models."""

    cost = (
        "clients: one local training each (O(N)); every prediction runs all n members, so "
        "evaluation is O(n·|test|): the method's own cost"
    )

    known_limits = (
        KnownLimit(
            "averaging logits rather than probabilities: under label skew a client's logits "
            "for classes it never saw are on no common scale, and their mean is far below the "
            "mean of probabilities (the IntactOFL benchmark: 4.5-18.4 points); where each "
            "client holds two or three classes it can end below a client's own model (the "
            "cut-budget robustness matrix, digits: 1-3 points)",
            below=("local", "ensemble"),
            options=("combine=logits",),
        ),
    )

    Config = EnsembleConfig

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        ids = sorted(payloads)
        members = client_models(payloads, ctx.dims)
        sizes = [float(payloads[c].scalars["n_examples"]) for c in ids]
        weights = client_weights(sizes, self.config.weighting).float()
        cfg = self.config
        if cfg.aggregation == "median":
            return EnsembleOutcome(members, weights, rule="median")
        if cfg.aggregation == "trimmed_mean":
            return EnsembleOutcome(members, weights, rule=f"trimmed_mean:{cfg.trim}")
        return EnsembleOutcome(members, weights, rule=cfg.combine)
