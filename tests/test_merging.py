"""FedFisher (Diag) and RegMean: the client statistics are their formulas, the server steps
are the papers' (closed forms checked against direct least squares / quadratic minima),
singular statistics give finite weights, statistics of another network or with wrong values
are refused by name, and both run end to end on images and tables."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import oneshotfl
from helpers import table_npz
from oneshotfl.data.types import LabelledData
from oneshotfl.methods.fedfisher import (
    FedFisherConfig,
    diagonal_fisher,
    fedfisher_adam,
    fisher_merge,
    fisher_objective_gradient,
)
from oneshotfl.methods.regmean import input_grams, reduce_non_diagonal, regmean_weight
from oneshotfl.models import create_model
from oneshotfl.payload import Payload
from oneshotfl.protocol.fields import model_fields
from oneshotfl.protocol.layer_stats import LayerStatistics
from oneshotfl.protocol.spec import PayloadError, WireDims


def tiny_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def test_the_true_fisher_diagonal_is_the_expectation_over_the_models_predictions() -> None:
    model = tiny_mlp()
    x = torch.randn(5, 3)
    data = LabelledData(x, torch.tensor([0, 1, 1, 0, 1]))
    got = diagonal_fisher(model, data, torch.device("cpu"), "true")
    empirical = diagonal_fisher(model, data, torch.device("cpu"), "empirical")
    want = {k: torch.zeros_like(v) for k, v in model.named_parameters()}
    want_emp = {k: torch.zeros_like(v) for k, v in model.named_parameters()}
    for i in range(5):
        probs = torch.softmax(model(x[i : i + 1]), -1)[0].detach()
        for c in range(2):
            model.zero_grad()
            torch.log_softmax(model(x[i : i + 1]), -1)[0, c].backward()
            for k, p in model.named_parameters():
                assert p.grad is not None
                want[k] += probs[c] * p.grad**2 / 5
                if c == int(data.y[i]):
                    want_emp[k] += p.grad**2 / 5
    for k in want:
        assert torch.allclose(got[k], want[k], atol=1e-6), k
        assert torch.allclose(empirical[k], want_emp[k], atol=1e-6), k


def test_the_fisher_solvers_reach_the_quadratics_minimum() -> None:
    rng = torch.Generator().manual_seed(0)
    fishers = [torch.rand(50, generator=rng, dtype=torch.float64) for _ in range(3)]
    models = [torch.randn(50, generator=rng, dtype=torch.float64) for _ in range(3)]
    p = [0.5, 0.3, 0.2]
    f = sum(pk * fk for pk, fk in zip(p, fishers, strict=True))
    b = sum(pk * fk * wk for pk, fk, wk in zip(p, fishers, models, strict=True))
    assert isinstance(f, torch.Tensor) and isinstance(b, torch.Tensor)
    minimum = b / f
    start = sum(pk * wk for pk, wk in zip(p, models, strict=True))
    assert isinstance(start, torch.Tensor)
    closed = fisher_merge(f, b, start, 1e-6)
    assert torch.allclose(closed, minimum)
    assert torch.allclose(
        fisher_objective_gradient(minimum, f, b), torch.zeros(50, dtype=torch.float64), atol=1e-12
    )
    iterated = fedfisher_adam(
        start, lambda w: fisher_objective_gradient(w, f, b), FedFisherConfig(steps=3000)
    )
    assert torch.allclose(iterated, minimum, atol=0.05)
    unseen = torch.where(torch.arange(50) < 10, torch.zeros_like(f), f)
    kept = fisher_merge(unseen, b * (unseen > 0), start, 1e-6)
    assert torch.equal(kept[:10], start[:10])  # no Fisher: FedAvg's value, never NaN
    seen_b = b * (unseen > 0)
    gradient = lambda w: fisher_objective_gradient(w, unseen, seen_b)  # noqa: E731
    assert torch.isfinite(fedfisher_adam(start, gradient, FedFisherConfig())).all()


def test_regmean_is_the_least_squares_merge_of_the_linear_layer() -> None:
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(40, 5)) for _ in range(3)]
    ws = [rng.normal(size=(2, 5)) for _ in range(3)]
    n = [40, 40, 40]
    grams = [x.T @ x / len(x) for x in xs]
    merged = regmean_weight(grams, ws, [k / sum(n) for k in n], alpha=1.0)
    x_all = np.concatenate(xs)
    y_all = np.concatenate([x @ w.T for x, w in zip(xs, ws, strict=True)])
    lstsq = np.linalg.lstsq(x_all, y_all, rcond=None)[0].T
    assert np.allclose(merged, lstsq, atol=1e-8)
    same = regmean_weight(grams, [ws[0]] * 3, [1 / 3] * 3, alpha=0.5)
    assert np.allclose(same, ws[0], atol=1e-8)  # identical clients: their model, any α
    assert np.allclose(reduce_non_diagonal(np.ones((2, 2)), 0.1), [[1, 0.1], [0.1, 1]])
    singular = [np.zeros((5, 5)) for _ in range(3)]  # no client activates any input
    assert np.isfinite(regmean_weight(singular, ws, [1 / 3] * 3, 0.9)).all()


def test_input_grams_are_each_linear_layers_input_second_moments() -> None:
    model = tiny_mlp()
    x = torch.randn(7, 3)
    grams = input_grams(
        model, LabelledData(x, torch.zeros(7, dtype=torch.long)), torch.device("cpu")
    )
    assert torch.allclose(grams["0"], x.T @ x / 7, atol=1e-6)
    hidden = torch.tanh(model[0](x)).detach()
    assert torch.allclose(grams["2"], hidden.T @ hidden / 7, atol=1e-6)


def statistics_payload(kind: str) -> tuple[Payload, WireDims]:
    model = create_model("mlp", 1, 10, 8)
    dims = WireDims(10, 1, 8)
    if kind == "diagonal":
        stats = {
            f"fisher.{k}": np.ones(tuple(p.shape), np.float32) for k, p in model.named_parameters()
        }
    elif kind == "gram":
        stats = {
            f"gram.{k}": np.eye(m.in_features, dtype=np.float32)
            for k, m in model.named_modules()
            if isinstance(m, nn.Linear)
        }
    else:
        stats = {}
        for k, m in model.named_modules():
            if isinstance(m, nn.Linear):
                stats[f"kfac.{k}.A"] = np.eye(m.in_features + 1, dtype=np.float32)
                stats[f"kfac.{k}.G"] = np.eye(m.out_features, dtype=np.float32)
    return model_fields(model).merged(Payload(stats)), dims


@pytest.mark.parametrize("kind", ["diagonal", "gram", "kfac"])
def test_statistics_of_another_shape_or_with_bad_values_are_refused_by_name(kind: str) -> None:
    prefix = {"diagonal": "fisher", "gram": "gram", "kfac": "kfac"}[kind]
    group = LayerStatistics(prefix, kind)  # type: ignore[arg-type]
    payload, dims = statistics_payload(kind)
    group.check(payload, dims, 3)  # the honest payload passes
    key = sorted(k for k in payload.arrays if group.owns(k))[0]
    cases = {
        "shape": np.ones((2, 2), np.float32),
        "finite": np.full_like(payload.arrays[key], np.nan),
        "non-negative": -np.abs(payload.arrays[key]) - 1,
    }
    if kind != "diagonal":
        asym = payload.arrays[key].copy()
        asym[0, 1] = 5.0
        cases["symmetric"] = asym
    for expected, value in cases.items():
        bad = Payload({**payload.arrays, key: value}, payload.scalars)
        with pytest.raises(PayloadError, match=f"client 3: payload field '{key}'.*{expected}"):
            group.check(bad, dims, 3)
    missing = Payload({k: v for k, v in payload.arrays.items() if k != key}, payload.scalars)
    with pytest.raises(PayloadError, match="got nothing"):
        group.check(missing, dims, 3)
    assert group.bound(dims, None) is not None


@pytest.mark.parametrize("dataset", ["digits", "table"])
def test_fedfisher_and_regmean_run_on_images_and_tables(
    tiny_config: Any, dataset: str, tmp_path: Any
) -> None:
    fisher, kfac, lpa = (  # the solvers at a few hundred steps, the true Fisher on 128 examples
        "fedfisher:fisher_examples=128:steps=200",
        "fedfisher:curvature=kfac:steps=50",
        "fedlpa:cg_steps=100",
    )
    methods = [
        "fedavg",
        fisher,
        "fedfisher:solver=closed:fisher=empirical",
        kfac,
        "regmean",
        lpa,
        "fedlpa:solver=gd:gd_steps=50",
    ]
    if dataset == "table":
        cfg = tiny_config(methods=methods, dataset=table_npz(tmp_path), model="mlp", clients=3)
    else:
        cfg = tiny_config(methods=methods, model="mlp", clients=4)
    result = oneshotfl.run(cfg)
    acc = {m.key: m.accuracy for m in result.methods}
    chance = 1 / 3 if dataset == "table" else 0.1
    for key, value in acc.items():
        assert value > chance + 0.2, (key, value)
    up = {m.key: m.upload_bytes_mean for m in result.methods}
    assert up[fisher] > 1.9 * up["fedavg"]  # a model and its Fisher, both float32
    assert up["regmean"] > up["fedavg"]
    assert up[lpa] == up[kfac] > up["fedavg"]
