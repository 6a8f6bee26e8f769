"""One-shot FedAvg: one round of McMahan et al. (2017), "Communication-Efficient Learning of
Deep Networks from Decentralized Data" (AISTATS).

Every client starts from the shared initial model, trains ``local_epochs`` on its data and
sends its weights with its example count; the server returns the data-size-weighted average
of the parameters (and buffers: BatchNorm statistics are averaged the same way, integer
counters are rounded). Requires identical architectures. The example counts are the clients'
own reports (bounded to [1, N_max] on the wire); ``weighting=clipped`` caps each at twice the
median so one client cannot take the average by over-reporting, ``uniform`` ignores them.

Robust modes (``aggregation``; :mod:`oneshotfl.robust`): ``median`` (coordinate-wise),
``trimmed_mean`` (``trim`` β of the clients dropped at each end per coordinate) and
``norm_clip`` (each client's update from the shared initial model scaled to at most the median
update norm, then the weighted average, with ``size`` weights read as ``clipped``: a robust
mode never lets a client buy weight by over-reporting its size). ``mean`` is the paper's
average.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import nn

from oneshotfl.functional import Weighting
from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import shared_initial_model
from oneshotfl.methods.common import AVERAGING_LIMIT, SendsTrainedModel, average_models
from oneshotfl.methods.folds import ModelAverage
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import Requires, ServerContext
from oneshotfl.protocol.fold import Fold, fold_all
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.robust import Aggregation


@dataclass(frozen=True)
class FedAvgConfig(Params):
    """FedAvg hyper-parameters.

    Attributes:
        weighting: how much each client's model counts in the average: ``size`` (its n_k, the
            paper), ``clipped`` (n_k capped at twice the median) or ``uniform``.
        aggregation: how the models are combined: ``mean`` (the weighted average, the paper),
            or a robust rule against malicious clients: ``median`` (per coordinate),
            ``trimmed_mean`` or ``norm_clip`` (each update scaled to at most the median norm).
        trim: the fraction β of clients dropped at each end, per coordinate, by
            ``trimmed_mean``.
    """

    weighting: Weighting = "size"
    aggregation: Aggregation = "mean"
    trim: float = 0.2

    def validate(self) -> None:
        require(0 <= self.trim < 0.5, "trim", "in [0, 0.5)", self.trim)


def _global(model: nn.Module) -> Outcome:
    return GlobalModel(model, {"aggregation": "mean"})


@register_method("fedavg", "one round of FedAvg: data-size-weighted parameter average")
class FedAvg(SendsTrainedModel[FedAvgConfig]):
    """One-shot FedAvg (McMahan et al. 2017)."""

    cost = (
        "clients: one local training each (O(N) for N examples split n ways); server: one "
        "weighted average, O(n·|θ|), folded as the models arrive (one held at a time; the "
        "clipped weighting and the robust rules hold all n); evaluation: one model"
    )

    known_limits = (AVERAGING_LIMIT,)

    Config = FedAvgConfig
    requires = Requires(same_architecture=True)

    def fold(self, ctx: ServerContext) -> Fold | None:
        """The paper's average with ``size`` or ``uniform`` weights, folded as the payloads
        arrive; ``clipped`` weights (the median of every size) and the robust rules (per
        coordinate over every client, or the median update norm) need every model at once."""
        cfg = self.config
        if cfg.aggregation != "mean" or cfg.weighting == "clipped":
            return None
        return ModelAverage(ctx.dims, cfg.weighting, _global)

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        fold = self.fold(ctx)
        if fold is not None:
            return fold_all(fold, payloads)
        cfg = self.config
        reference = None
        if cfg.aggregation == "norm_clip":  # θ⁰, the initialisation every client started from
            arch = str(payloads[min(payloads)].scalars["model.arch"])
            reference = shared_initial_model(ctx, arch)
        model = average_models(
            payloads, ctx.dims, cfg.weighting, cfg.aggregation, cfg.trim, reference
        )
        return GlobalModel(model, {"aggregation": cfg.aggregation})
