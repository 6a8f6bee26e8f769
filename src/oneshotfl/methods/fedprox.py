"""One-shot FedProx: one round of Li et al. (2020), "Federated Optimization in Heterogeneous
Networks" (MLSys).

Every client starts from the shared initial model w0 and minimises its local loss plus the
proximal term, h_k(w; w0) = F_k(w) + (μ/2)·‖w − w0‖² (the paper's Eq. 2), for the federation's
local epochs; it sends its weights with its example count n_k, and the server returns
FedAvg's size-weighted parameter average.

Deviations from the paper and choices where it is vague:

* One round: the anchor w^t of the proximal term is the shared initialisation w0, not a
  trained global model (the one-shot form FedOL compares against).
* Full participation and no stragglers: every client runs the full local budget, so the
  paper's γ-inexact partial work and device dropping do not arise.
* Aggregation: the paper samples devices with probability p_k = n_k/n and averages their
  models uniformly; with every client present we use the size-weighted average Σ p_k w_k,
  which is that estimator's expectation (and exactly FedAvg's server, reused from
  :func:`oneshotfl.methods.common.average_models`, folded as the models arrive).
* Local solver: the federation's client optimiser (SGD with momentum by default), where the
  paper uses plain SGD.
* μ is fixed (``mu``); the paper's heuristic of adapting μ to the training loss needs many
  rounds and is not used.
* The proximal term covers the trainable parameters only; buffers (BatchNorm statistics)
  are not optimised by gradient and are averaged as FedAvg averages them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from oneshotfl.methods.base import register_method
from oneshotfl.methods.common import AVERAGING_LIMIT, SendsTrainedModel
from oneshotfl.methods.folds import ModelAverage
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, Requires, ServerContext
from oneshotfl.protocol.fold import Fold, fold_all
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.training.components import ComponentSpec
from oneshotfl.training.recipe import ClientRecipe


@dataclass(frozen=True)
class FedProxConfig(Params):
    """FedProx hyper-parameters.

    Attributes:
        mu: weight μ of the proximal term (μ/2)·‖w − w0‖²; > 0 (μ = 0 is FedAvg).
    """

    mu: float = 0.01

    def validate(self) -> None:
        require(self.mu > 0, "mu", "> 0", self.mu)


@register_method("fedprox", "one round of FedProx: proximal local training, FedAvg average")
class FedProx(SendsTrainedModel[FedProxConfig]):
    """One-shot FedProx (Li et al. 2020): the federation's recipe plus the ``proximal``
    training component (:mod:`oneshotfl.training.components`)."""

    cost = (
        "clients: one proximal local training each (O(N)); server: one weighted average, "
        "O(n·|θ|), folded as the models arrive; evaluation: one model"
    )

    known_limits = (AVERAGING_LIMIT,)

    Config = FedProxConfig
    requires = Requires(same_architecture=True)

    def client_recipe(self, ctx: ClientContext) -> ClientRecipe:
        proximal = ComponentSpec.of("proximal", mu=self.config.mu)
        return ctx.recipe(name="fedprox", components=(proximal,))

    def fold(self, ctx: ServerContext) -> Fold:
        """FedAvg's average, folded as the models arrive."""
        mu = self.config.mu
        return ModelAverage(ctx.dims, "size", lambda model: GlobalModel(model, {"mu": mu}))

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        return fold_all(self.fold(ctx), payloads)
