"""DeDES (Wang et al., "Data-Free Diversity-Based Ensemble Selection for One-Shot Federated
Learning", TMLR 2023; authors' code ``NaiboWang/Data-Free-Ensemble-Selection-For-One-Shot-
Federated-Learning``): the server picks a diverse team of K client models without any data,
and the team votes.

Every client trains with the federation's recipe and sends its model, its example count n_k
and its accuracy on its own private validation split (the "score"; the method requires
``val_fraction`` > 0; a client too small to split scores on its training data). The
server, with no data:

1. drops low scorers (:func:`outlier_filter`): models scoring below q₀ + s·(q₇₅ − q₂₅) of
   the scores (q₀ the minimum, s = ``outlier_scale``; the authors' code — their supplement
   writes the threshold without q₀, ``threshold=iqr``);
2. represents each remaining model by its last linear layer's weights and bias, flattened
   and min-max scaled per dimension across the models (:func:`representations`);
3. clusters them into K groups (``clustering``: k-means with the run's seed, as the authors
   use for label skew, or a hierarchical linkage cut at K clusters — ``ward``, ``average``,
   ``complete``, ``single``), K = ``team`` (0: half the clients, rounded up — the paper's
   "about half of m");
4. takes one model per cluster (:func:`pick_representative`, their "mixed" rule): with the
   cluster's m members ordered by data, largest first, the largest-data member where the
   member at position ⌊m/2⌋ of that order (the median; of an even cluster the lower of the
   two middle ones, of a pair the smaller) holds less than τ = ``tau`` of the largest's
   data, else the best-scoring member;
5. predicts by the team's majority vote of labels weighted by n_k (``vote=hard``; their
   ``max_voting``) or by the n_k-weighted mean of softmaxes (``soft``).

Against the authors' code: their k-means has no seed (ours: the run's); they run every
linkage and pick per partition when compiling results (ours: a knob, k-means by default);
their vote breaks ties towards the first model reaching the maximum, ours towards the lowest
label; their local models keep the best epoch on local validation, ours the federation's
recipe. Privacy: each client's validation accuracy and size are sent besides its model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import client_models
from oneshotfl.methods.common import SendsTrainedModel, held_out
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, Requires, ServerContext
from oneshotfl.protocol.layer_stats import linear_layers
from oneshotfl.protocol.outcome import Ensemble, Outcome
from oneshotfl.protocol.spec import PayloadSpec, ScalarSpec, WireDims
from oneshotfl.seeding import derive_seed
from oneshotfl.training.loop import accuracy, predict_logits

Clustering = Literal["kmeans", "ward", "average", "complete", "single"]


@dataclass(frozen=True)
class DedesConfig(Params):
    """DeDES hyper-parameters (names as in the module docs).

    Attributes:
        team: K, the models selected (0: half the clients, rounded up).
        clustering: ``kmeans`` or a hierarchical linkage (``ward``, ``average``,
            ``complete``, ``single``).
        outlier_scale: s of the score filter (0 keeps every model).
        threshold: ``min_iqr`` (q₀ + s·IQR, the authors' code) or ``iqr`` (s·IQR, their
            supplement's text).
        tau: τ of the mixed pick.
        vote: ``hard`` (n_k-weighted majority of labels) or ``soft`` (of softmaxes).
    """

    team: int = 0
    clustering: Clustering = "kmeans"
    outlier_scale: float = 1.0
    threshold: Literal["min_iqr", "iqr"] = "min_iqr"
    tau: float = 0.9
    vote: Literal["hard", "soft"] = "hard"

    def validate(self) -> None:
        require(self.team >= 0, "team", ">= 0 (0: half the clients)", self.team)
        require(self.outlier_scale >= 0, "outlier_scale", ">= 0", self.outlier_scale)
        require(0 < self.tau <= 1, "tau", "in (0, 1]", self.tau)


def outlier_filter(
    scores: Sequence[float], scale: float, threshold: Literal["min_iqr", "iqr"]
) -> list[int]:
    """The indices of the models kept: score ≥ (q₀ +) s·(q₇₅ − q₂₅)."""
    values = np.asarray(scores, np.float64)
    iqr = float(np.quantile(values, 0.75) - np.quantile(values, 0.25))
    bar = scale * iqr + (float(values.min()) if threshold == "min_iqr" else 0.0)
    kept = [i for i, v in enumerate(values) if v >= bar]
    return kept or [int(values.argmax())]


def representations(last_layers: Sequence[np.ndarray]) -> np.ndarray:
    """Each model's flattened last linear layer, min-max scaled per dimension across the
    models (a dimension equal for all becomes 0), ``[M, P]``."""
    r = np.stack([np.asarray(v, np.float64).ravel() for v in last_layers])
    low, span = r.min(0), r.max(0) - r.min(0)
    return np.where(span > 0, (r - low) / np.where(span > 0, span, 1.0), 0.0)


def last_layer_vectors(models: Sequence[nn.Module]) -> list[np.ndarray]:
    """Each model's last linear layer (of the first model's architecture), its weight then
    its bias, flattened."""
    last = list(linear_layers(models[0]))[-1]
    vectors = []
    for model in models:
        state = model.state_dict()
        parts = [state[f"{last}.weight"].numpy().ravel()]
        if f"{last}.bias" in state:
            parts.append(state[f"{last}.bias"].numpy())
        vectors.append(np.concatenate(parts))
    return vectors


def cluster_labels(r: np.ndarray, k: int, method: Clustering, seed: int) -> np.ndarray:
    """A cluster label per row of ``r``, at most ``k`` clusters."""
    if k >= len(r):
        return np.arange(len(r))
    if method == "kmeans":
        from sklearn.cluster import KMeans

        return np.asarray(KMeans(k, random_state=seed % 2**32, n_init=10).fit_predict(r))
    from scipy.cluster.hierarchy import fcluster, linkage

    return np.asarray(fcluster(linkage(r, method=method), t=k, criterion="maxclust"))


def pick_representative(
    members: Sequence[int], sizes: Sequence[float], scores: Sequence[float], tau: float
) -> int:
    """The "mixed" rule of the authors' code. ``members`` (in ascending order, as a cluster's
    members are listed) are ordered by data, largest first (ties keep their order); the
    member at position ⌊m/2⌋ of that order is the median — the lower of the two middle ones
    when m is even, the smaller of a pair. When the median's data is less than τ of the
    first's, the first (the largest, the earliest of tied largest) is picked; otherwise the
    best-scoring member (ties: the first in ``members``). A single member is picked."""
    by_size = sorted(members, key=lambda i: sizes[i], reverse=True)  # stable: ties keep order
    largest = by_size[0]
    if len(by_size) > 1 and sizes[by_size[len(by_size) // 2]] / sizes[largest] < tau:
        return largest
    return max(members, key=lambda i: scores[i])


@register_method(
    "dedes",
    "DeDES: a data-free diverse team of client models (clusters of last layers), their vote",
)
class Dedes(SendsTrainedModel[DedesConfig]):
    """DeDES's data-free ensemble selection (see the module docs)."""

    cost = (
        "clients: one local training and one validation pass each; server: clustering n "
        "last-layer vectors; evaluation runs the K team members, O(K·|test|)"
    )

    Config = DedesConfig
    requires = Requires(same_architecture=True, validation=True)

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        base = super().payload_spec(dims)
        score = ScalarSpec("val_accuracy", float, 0.0, 1.0)
        return PayloadSpec(models=base.models, scalars=(*base.scalars, score))

    def client_update(self, ctx: ClientContext) -> Payload:
        model, val = self.trained(ctx), held_out(ctx)
        score = accuracy(predict_logits(model, val.x, ctx.device), val.y)
        return super().client_update(ctx).merged(Payload({}, {"val_accuracy": float(score)}))

    def select(
        self,
        vectors: Sequence[np.ndarray],
        sizes: Sequence[float],
        scores: Sequence[float],
        seed: int,
    ) -> tuple[list[int], int]:
        """Steps 1–4 on every model's last-layer vector (:func:`last_layer_vectors`), data size
        and score: the team's positions (ascending) and how many models the filter dropped."""
        cfg = self.config
        kept = outlier_filter(scores, cfg.outlier_scale, cfg.threshold)
        k = cfg.team or -(-len(scores) // 2)
        labels = cluster_labels(
            representations([vectors[i] for i in kept]), k, cfg.clustering, seed
        )
        team = sorted(
            pick_representative(
                [kept[j] for j in np.flatnonzero(labels == g)], sizes, scores, cfg.tau
            )
            for g in np.unique(labels)
        )
        return team, len(scores) - len(kept)

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        cfg = self.config
        ids = sorted(payloads)
        models = client_models(payloads, ctx.dims)
        sizes = [float(payloads[c].scalars["n_examples"]) for c in ids]
        scores = [float(payloads[c].scalars["val_accuracy"]) for c in ids]
        seed = derive_seed(ctx.seed, "dedes")
        team, outliers = self.select(last_layer_vectors(models), sizes, scores, seed)
        weights = torch.tensor([sizes[i] for i in team], dtype=torch.float32)
        info = {
            "team": [ids[i] for i in team],
            "team_size": float(len(team)),
            "outliers": float(outliers),
        }
        rule = "vote" if cfg.vote == "hard" else "probabilities"
        return Ensemble([models[i] for i in team], weights, rule=rule, info=info)
