"""DeDES: the score filter, the min-max representation, the clustering and the mixed pick are
the authors' rules; the team votes by weighted majority; the method needs validation splits
(refused before training without them) and runs end to end and on Flower."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import oneshotfl
from oneshotfl.functional import weighted_hard_vote
from oneshotfl.methods.dedes import (
    cluster_labels,
    outlier_filter,
    pick_representative,
    representations,
)
from oneshotfl.runner.config_values import ConfigError


def test_the_score_filter_is_the_codes_and_the_supplements_threshold() -> None:
    scores = [0.15, 0.20, 0.50, 0.60, 0.90]  # q25 0.2, q75 0.6: IQR 0.4
    assert outlier_filter(scores, 1.0, "min_iqr") == [3, 4]  # ≥ 0.15 + 0.4
    assert outlier_filter(scores, 1.0, "iqr") == [2, 3, 4]  # ≥ 0.4
    assert outlier_filter(scores, 0.0, "min_iqr") == [0, 1, 2, 3, 4]
    assert outlier_filter([0.5, 0.5], 5.0, "iqr") == [0, 1]  # IQR 0: nobody is an outlier


def test_representations_are_min_max_scaled_and_clusters_find_the_groups() -> None:
    r = representations([np.array([0.0, 2.0, 5.0]), np.array([1.0, 4.0, 5.0])])
    assert np.allclose(r, [[0, 0, 0], [1, 1, 0]])
    rng = np.random.default_rng(0)
    groups = np.repeat([0, 1, 2], 4)
    vectors = [np.eye(3)[g] * 10 + rng.normal(0, 0.1, 3) for g in groups]
    for method in ("kmeans", "ward", "average"):
        labels = cluster_labels(representations(vectors), 3, method, seed=0)  # type: ignore[arg-type]
        for g in range(3):
            assert len(set(labels[groups == g])) == 1, method
        assert len(set(labels)) == 3, method
    assert cluster_labels(representations(vectors[:2]), 3, "kmeans", 0).tolist() == [0, 1]


def test_the_mixed_pick_prefers_data_when_it_is_uneven_and_the_score_otherwise() -> None:
    sizes = [100.0, 10.0, 20.0, 100.0]
    scores = [0.5, 0.9, 0.8, 0.6]
    assert pick_representative([0, 1, 2], sizes, scores, tau=0.9) == 0  # median 20 / 100 < τ
    assert pick_representative([0, 3], sizes, scores, tau=0.9) == 3  # even: the best score
    assert pick_representative([1], sizes, scores, tau=0.9) == 1


def test_the_mixed_pick_reads_the_median_of_an_even_cluster_as_the_authors_code_does() -> None:
    """Sizes ordered largest first, position ⌊m/2⌋: in a pair that is the smaller member, so
    an uneven pair goes to the larger (issue 51: read from the ascending order, a pair's
    "median" was the largest itself, a ratio of 1, and the data rule never fired)."""
    assert pick_representative([0, 1], [100.0, 50.0], [0.5, 0.9], tau=0.9) == 0  # 50/100 < τ
    assert pick_representative([0, 1], [100.0, 95.0], [0.5, 0.9], tau=0.9) == 1  # 95/100 ≥ τ
    four, scores = [0, 1, 2, 3], [0.5, 0.9, 0.6, 0.7]
    # the third largest (80 < τ·100), not the second (95), is held against the largest
    assert pick_representative(four, [100.0, 80.0, 95.0, 10.0], scores, tau=0.9) == 0
    # tied largest: the first of them in the members' order
    assert pick_representative(four, [100.0, 100.0, 10.0, 10.0], scores[::-1], tau=0.9) == 0


def test_the_vote_is_the_weighted_majority_of_labels() -> None:
    logits = torch.tensor([[[5.0, 0.0]], [[0.0, 1.0]], [[0.0, 1.0]]])  # labels 0, 1, 1
    assert weighted_hard_vote(logits, torch.tensor([1.0, 1.0, 1.0])).argmax().item() == 1
    assert weighted_hard_vote(logits, torch.tensor([3.0, 1.0, 1.0])).argmax().item() == 0
    assert torch.allclose(weighted_hard_vote(logits, torch.ones(3)).sum(-1), torch.ones(1))


def test_dedes_needs_validation_splits_and_runs_end_to_end(tiny_config: Any) -> None:
    with pytest.raises(ConfigError, match="dedes needs a private validation split"):
        oneshotfl.run(tiny_config(methods=["dedes"], clients=6))
    cfg = tiny_config(methods=["ensemble", "dedes", "dedes:vote=soft"], clients=6, val_fraction=0.2)
    result = oneshotfl.run(cfg)
    dedes = result.method("dedes")
    assert dedes.diagnostics["team_size"] <= 3.0
    assert set(dedes.diagnostics["team"]) <= set(range(6))
    for m in result.methods:
        assert m.accuracy > 0.5, (m.key, m.accuracy)
