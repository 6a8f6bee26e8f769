"""The authors' DeDES selection and RegMean merge, as the plugins of ``benchmarks/authors/``
run them, agree with ours on small synthetic inputs (issue 51). Each test runs the authors'
code from a checkout named by an environment variable — ``DEDES_REPO`` and
``FEDFISHER_REPO``, as the plugins read them — and is skipped, naming it, without one."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from helpers import make_server_context
from oneshotfl import plugins
from oneshotfl.data.types import TaskInfo
from oneshotfl.methods.dedes import Dedes, DedesConfig, pick_representative
from oneshotfl.methods.regmean import RegMean, RegMeanConfig
from oneshotfl.models import create_model
from oneshotfl.payload import Payload
from oneshotfl.protocol.fields import model_fields
from oneshotfl.protocol.layer_stats import linear_layers

ROOT = Path(__file__).resolve().parents[1]
DEDES = ("DEDES_REPO", "NaiboWang/Data-Free-Ensemble-Selection-For-One-Shot-Federated-Learning")
FEDFISHER = ("FEDFISHER_REPO", "Divyansh03/FedFisher")


def authors_plugin(
    name: str, checkout: tuple[str, str], forget: list[str], monkeypatch: pytest.MonkeyPatch
) -> ModuleType:
    """``benchmarks/authors/<name>.py`` imported, its method registered for this test only;
    the test is skipped when the variable naming the authors' checkout is unset."""
    env, repo = checkout
    if not os.environ.get(env):
        pytest.skip(f"{env} is unset: set it to a checkout of {repo} to run the authors' code")
    monkeypatch.setattr(sys, "path", list(sys.path))  # the plugin puts its own folder first
    forget.append(name)
    path = ROOT / "benchmarks" / "authors" / f"{name}.py"
    plugins.import_plugin(str(path))
    return sys.modules[plugins.plugin_module_name(path)]


def test_the_authors_mixed_pick_is_ours_on_every_cluster(
    forget: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their ``get_indexes_by_mixed`` on random clusters, with tied sizes and scores and
    clusters of every size, picks what :func:`pick_representative` picks."""
    mod = authors_plugin("dedes_authors", DEDES, forget, monkeypatch)
    scope: dict[str, Any] = {"np": np, "logging": logging}
    file = "ensemble_selection_clustering.py"
    mixed = mod.authors_functions(mod.ENV, file, ("get_indexes_by_mixed",), scope)
    mixed = mixed["get_indexes_by_mixed"]

    def theirs(
        wheres: list[np.ndarray], sizes: list[float], scores: list[float], tau: float
    ) -> list[int]:
        mixed.__globals__.update(
            flatten_indexes=list(range(len(sizes))),
            party_local_validation_accuracies=list(enumerate(scores)),
            party_dataset_amount=list(enumerate(sizes)),
        )
        return mixed(mod.TheirConfig(K=len(wheres), filter=True, tau=tau), wheres)

    pair = ([100.0, 50.0], [0.5, 0.9])  # the pair: 50 < 0.9·100, the larger is picked
    assert theirs([np.array([0, 1])], *pair, 0.9) == [0]
    assert pick_representative([0, 1], *pair, 0.9) == 0
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(2, 13))
        sizes = rng.choice([10.0, 50.0, 85.0, 95.0, 100.0], n).tolist()
        scores = rng.choice([0.5, 0.7, 0.9], n).tolist()
        labels = rng.integers(0, 4, n)
        wheres = [np.flatnonzero(labels == g) for g in range(4)]
        tau = float(rng.choice([0.5, 0.9, 1.0]))
        ours = sorted(pick_representative(w.tolist(), sizes, scores, tau) for w in wheres if len(w))
        assert theirs(wheres, sizes, scores, tau) == ours, (sizes, scores, labels.tolist(), tau)


@pytest.mark.parametrize("clustering", ["kmeans", "ward", "average", "complete", "single"])
def test_the_authors_selection_is_ours(
    clustering: str, forget: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their filter, scaling, clustering and pick choose the team ``dedes`` chooses, and drop
    the same models, on last layers drawn around four centres."""
    mod = authors_plugin("dedes_authors", DEDES, forget, monkeypatch)
    rng = np.random.default_rng(1)
    for _ in range(5):
        n = 12
        centres = rng.normal(0, 5, (4, 20))
        vectors = [centres[g] + rng.normal(0, 0.5, 20) for g in rng.integers(0, 4, n)]
        sizes = rng.choice([10.0, 50.0, 95.0, 100.0], n).tolist()
        scores = rng.uniform(0.3, 0.9, n).round(2).tolist()
        team, seed = int(rng.integers(2, 7)), int(rng.integers(2**62))
        ours = Dedes(DedesConfig(team=team, clustering=clustering)).select(  # type: ignore[arg-type]
            vectors, sizes, scores, seed
        )
        authors = mod.DedesAuthors(mod.DedesAuthorsConfig(team=team, clustering=clustering))
        assert authors.select(vectors, sizes, scores, seed) == ours


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_the_authors_regmean_merge_is_ours(
    arch: str, forget: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their ``avg_merge`` (float32 pseudo-inverse) and ``regmean`` (float64) build the same
    model from three clients' models and well-conditioned Grams, at either α."""
    mod = authors_plugin("regmean_authors", FEDFISHER, forget, monkeypatch)
    ctx = make_server_context(TaskInfo("fashion_mnist", 10, 1, 28), client_archs=(arch,) * 3)
    rng = np.random.default_rng(0)
    payloads = {}
    for c, n in enumerate([30, 50, 120]):
        torch.manual_seed(c)
        model = create_model(arch, 1, 10, 28)
        grams = {}
        for k, m in linear_layers(model).items():
            x = rng.normal(size=(4 * m.in_features, m.in_features))
            grams[f"gram.{k}"] = (x.T @ x / len(x)).astype(np.float32)
        payloads[c] = model_fields(model).merged(Payload(grams, {"n_examples": n}))
    for alpha in (0.1, 0.9):
        ours = RegMean(RegMeanConfig(alpha=alpha)).aggregate(payloads, ctx)
        authors = mod.RegMeanAuthors(mod.RegMeanAuthorsConfig(alpha=alpha))
        theirs = authors.aggregate(payloads, ctx)
        want, got = ours.model.state_dict(), theirs.model.state_dict()  # type: ignore[attr-defined]
        assert want.keys() == got.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k], atol=1e-4, rtol=1e-4, msg=k)
