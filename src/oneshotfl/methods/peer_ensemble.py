"""The neighbourhood ensemble: the server-free reference of the peer topology.

Every client trains its own model with the federation's recipe and sends it, once, to its
neighbours in the graph (``graph`` in the experiment config: ``complete``, ``ring:k=K``,
``random:degree=D`` or a file). There is no server. Each client's personalised model is the
ensemble of its own model and the models it received,
p_k(x) = Σ_m w_m softmax(f_m(x)) / Σ_m w_m over m ∈ {k} ∪ N(k), with uniform weights or the
members' example counts n_m (``weighting=size``); ``include_own=false`` leaves the client's
own model out.

It is the peer analogue of ``ensemble`` and what FOL's Top-K ensemble (Huang and Shu,
ICML 2025, stage 3) reduces to with K = every candidate, uniform
weights, and none of FOL's fine-tuning, alignment-aware pruning or distillation — the
reference FOL's stages are measured against. Not a method of its own paper; the weighting is
the choice of the ``ensemble`` baseline. A client whose neighbours all failed (or that has
none) keeps its own model alone, whatever ``include_own`` says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from oneshotfl.functional import Weighting, client_weights
from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import client_models
from oneshotfl.methods.common import SKEW, SendsTrainedModel
from oneshotfl.params import Params
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, PeerMethod
from oneshotfl.protocol.limits import KnownLimit
from oneshotfl.protocol.outcome import Ensemble, Outcome
from oneshotfl.training.services import train_model


@dataclass(frozen=True)
class PeerEnsembleConfig(Params):
    """Neighbourhood-ensemble hyper-parameters.

    Attributes:
        weighting: how much each member counts: ``uniform`` (every member 1), ``size``
            (weighted by n_k) or ``clipped`` (n_k capped at twice the median).
        include_own: the receiving client's own model is a member.
    """

    weighting: Weighting = "uniform"
    include_own: bool = True


@register_method("peer_ensemble", "server-free: each client's ensemble of its own + neighbours")
class PeerEnsemble(PeerMethod[PeerEnsembleConfig], SendsTrainedModel[PeerEnsembleConfig]):
    """Each client predicts with the softmax ensemble of its own and its neighbours' models."""

    cost = (
        "clients: one local training each (O(N)); each of n receivers evaluates its own and its"
        " ≤ Q neighbours' models: O(n·Q·|test|)"
    )

    known_limits = (
        KnownLimit(
            "does not personalise: every client averages its neighbours' models with its own "
            "uniformly, so under label skew the result knows the client's own classes worse "
            "than the client's own model does (FOL's Top-K weighting and distillation are "
            "what add personalisation)",
            below=("local",),
            partitions=SKEW,
        ),
    )

    Config = PeerEnsembleConfig

    def aggregate_for(self, ctx: ClientContext, payloads: Mapping[int, Payload]) -> Outcome:
        members = client_models(payloads, ctx.dims)
        weights = [float(payloads[sender].scalars["n_examples"]) for sender in sorted(payloads)]
        if self.config.include_own or not payloads:  # the receiver's own model comes first
            members.insert(0, train_model(ctx, ctx.recipe()))
            weights.insert(0, float(len(ctx.data)))
        info = {"members": len(members), "senders": sorted(payloads)}
        return Ensemble(members, client_weights(weights, self.config.weighting).float(), info=info)
