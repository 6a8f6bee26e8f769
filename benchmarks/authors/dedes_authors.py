"""Plugin ``dedes_authors``: DeDES with the authors' selection step, unedited.

Clients are ``dedes``'s (the same cached models, example counts n_k and validation scores).
The server selects the team with the code of
``NaiboWang/Data-Free-Ensemble-Selection-For-One-Shot-Federated-Learning`` (commit 7aa5d88):

* ``box_plot_outliers`` (``common_tools.py``): their score filter, q₀ + s·(q₇₅ − q₂₅) on a
  pandas Series of the scores (s = ``outlier_scale``), the models below it dropped;
* the kept models' last linear layers (weight, then bias, flattened), min-max scaled per
  dimension by scikit-learn's ``MinMaxScaler`` in the models' float32, as their
  ``read_parameters`` prepares them (``dedes`` scales in float64);
* ``kmeans_clustering_selection`` (``clustering=kmeans``) or
  ``hierarchical_clustering_selection`` (a linkage, their ``cluster_method``) of
  ``ensemble_selection_clustering.py``, each taking one model per cluster by their
  ``get_indexes_by_mixed`` (τ = ``tau``). Their module's globals are this run's:
  ``flatten_weights`` the scaled vectors, ``flatten_indexes`` the kept clients' positions,
  ``party_local_validation_accuracies`` and ``party_dataset_amount`` every client's
  (position, score) and (position, n_k).

The team then votes as ``dedes``'s does (their ``ensemble.py`` is not run).

Adaptation: their k-means draws from NumPy's global generator (no seed): it is seeded with
the run's DeDES seed for the call, and restored after — the seed ``dedes`` gives its own
k-means, so the two agree when the rest does. ``KMeans`` in their scope is scikit-learn's with
``n_init=10``, the default of the version of their time (``"auto"``, one run, since 1.4).
K is capped at the number of models kept: their k-means raises above it, and at it every
model is its own cluster, as in ``dedes`` (a single model kept is the team, without their
clustering: their linkage needs two). Their figures are not drawn: ``plt`` is not in
their scope, and each figure sits in a ``try`` whose bare ``except`` skips it.
``threshold=iqr`` is refused: their filter has only q₀ + s·IQR.

Needs ``DEDES_REPO`` = a checkout of that repository.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.cluster.hierarchy import fcluster, linkage
from sklearn.cluster import KMeans
from sklearn.preprocessing import MinMaxScaler

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import authors_functions

from oneshotfl.methods.base import register_method
from oneshotfl.methods.dedes import Dedes, DedesConfig
from oneshotfl.params import require

ENV = "DEDES_REPO"
SELECTION = ("get_indexes_by_mixed", "hierarchical_clustering_selection")
KMEANS = "kmeans_clustering_selection"


class TheirConfig(dict[str, Any]):
    """Their ``commandline_config.Config`` as far as the selection reads it: each key read
    as an item or as an attribute."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as exc:
            raise AttributeError(name) from exc


def authors_selection(
    vectors: Sequence[np.ndarray],
    sizes: Sequence[float],
    scores: Sequence[float],
    cfg: DedesConfig,
    seed: int,
) -> tuple[list[int], int]:
    """The team's positions (ascending) their code selects, and how many models their filter
    dropped (see the module docs)."""
    tools = authors_functions(
        ENV, "common_tools.py", ("box_plot_outliers", "convert_int"), {"np": np, "pd": pd}
    )
    _, dropped = tools["box_plot_outliers"](
        pd.Series(list(scores)), p_low=0.25, p_high=0.75, s2=cfg.outlier_scale
    )
    outliers = {int(i) for i in dropped[0]}
    kept = [i for i in range(len(scores)) if i not in outliers]
    if len(kept) == 1:  # the team is that model (their linkage needs two)
        return kept, len(scores) - 1
    scaled = MinMaxScaler().fit_transform(np.stack([np.ravel(vectors[i]) for i in kept]))
    scope = {
        "np": np,
        "sys": sys,
        "logging": logging,
        "linkage": linkage,
        "fcluster": fcluster,
        "KMeans": functools.partial(KMeans, n_init=10),
        "convert_int": tools["convert_int"],
        "flatten_weights": scaled,
        "flatten_indexes": kept,
        "party_local_validation_accuracies": [(i, float(s)) for i, s in enumerate(scores)],
        "party_dataset_amount": [(i, float(n)) for i, n in enumerate(sizes)],
    }
    code = authors_functions(ENV, "ensemble_selection_clustering.py", (*SELECTION, KMEANS), scope)
    k = min(cfg.team or -(-len(scores) // 2), len(kept))
    config = TheirConfig(
        K=k,
        party_num=len(scores),
        cluster_method=cfg.clustering,
        selection_method="mixed",
        partition="oneshotfl",
        filter=True,
        tau=cfg.tau,
    )
    if cfg.clustering != "kmeans":
        team = code["hierarchical_clustering_selection"](config)[0]
    else:
        state = np.random.get_state()
        np.random.seed(seed % 2**32)
        try:
            team = code[KMEANS](config)[0]
        finally:
            np.random.set_state(state)
    return sorted(int(i) for i in team), len(scores) - len(kept)


@dataclass(frozen=True)
class DedesAuthorsConfig(DedesConfig):
    """``dedes``'s; ``threshold`` only ``min_iqr``, the one rule their filter has."""

    def validate(self) -> None:
        super().validate()
        require(
            self.threshold == "min_iqr",
            "threshold",
            "min_iqr (the authors' code has only q0 + s·IQR)",
            self.threshold,
        )


@register_method("dedes_authors", "DeDES, the authors' selection step (plugin)")
class DedesAuthors(Dedes):
    """``dedes``'s clients and vote; the authors' filter, clustering and mixed pick."""

    Config = DedesAuthorsConfig
    config: DedesAuthorsConfig

    def select(
        self,
        vectors: Sequence[np.ndarray],
        sizes: Sequence[float],
        scores: Sequence[float],
        seed: int,
    ) -> tuple[list[int], int]:
        return authors_selection(vectors, sizes, scores, self.config, seed)
