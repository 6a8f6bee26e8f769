"""FedCGS's training-free head: Σ_T is the features' total covariance, the head is its
formula and the pooled fit whatever the partition, singular statistics and an absent class
give finite logits, a client that lies about its statistics is refused and named, and the
method trains small data to a sensible result on the shared encoder."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import oneshotfl
from oneshotfl.methods import build_method
from oneshotfl.methods.fedcgs import FedCgsConfig, fedcgs_head, total_covariance
from oneshotfl.methods.ghofl import class_statistics
from oneshotfl.payload import Payload
from oneshotfl.protocol.spec import PayloadError, WireDims
from oneshotfl.protocol.validate import validate_payload


def blobs(n: int = 300, d: int = 6, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    centres = rng.normal(0, 3, (classes, d))
    return (centres[y] + rng.normal(0, 1, (n, d))).astype(np.float32), y


def summed(parts: list[Payload]) -> dict[str, np.ndarray]:
    return {k: np.add.reduce([p.arrays[k] for p in parts]) for k in parts[0].arrays}


def test_the_total_covariance_is_numpys_and_not_the_within_class_one() -> None:
    x, y = blobs()
    stats = class_statistics(x, y, 3, "lda").arrays
    cov = total_covariance(stats["gram"], stats["sums"], stats["counts"])
    assert np.allclose(cov, np.cov(x.astype(np.float64).T), atol=1e-9)
    within = sum(np.cov(x[y == c].astype(np.float64).T) for c in range(3)) / 3
    assert np.abs(cov - within).max() > 1.0  # the between-class scatter is in it


def test_the_head_is_its_formula_and_the_pooled_fit_whatever_the_partition() -> None:
    x, y = blobs()
    xd = x.astype(np.float64)
    cfg = FedCgsConfig(ridge=0.5)
    pooled, info = fedcgs_head(class_statistics(x, y, 3, "lda").arrays, cfg)
    order = np.argsort(y, kind="stable")  # label skew: each client holds one or two classes
    parts = [class_statistics(x[i], y[i], 3, "lda") for i in np.array_split(order, 5)]
    federated, _ = fedcgs_head(summed(parts), cfg)
    means = np.stack([xd[y == c].mean(0) for c in range(3)])
    prior = np.log(np.bincount(y) / len(y))
    inv = np.linalg.inv(np.cov(xd.T) + (0.5 + 1e-6) * np.eye(6))
    want = xd @ inv @ means.T - 0.5 * np.einsum("cd,de,ce->c", means, inv, means) + prior
    probe = torch.from_numpy(x)
    assert np.allclose(pooled(probe).numpy(), want, atol=1e-3)
    assert torch.allclose(pooled(probe), federated(probe), atol=1e-3)
    assert (federated(probe).argmax(1).numpy() == y).mean() > 0.9
    assert info == {"classes_present": 3.0, "examples": 300.0}


def test_singular_statistics_and_an_absent_class_give_finite_logits() -> None:
    x, y = blobs(n=12, d=20)  # fewer examples than dimensions: Σ_T is singular
    y = np.where(y == 2, 1, y)  # class 2 held by no client
    head, info = fedcgs_head(class_statistics(x, y, 3, "lda").arrays, FedCgsConfig())
    out = head(torch.from_numpy(x))
    assert torch.isfinite(out).all() and info["classes_present"] == 2.0
    ridged, _ = fedcgs_head(class_statistics(x, y, 3, "lda").arrays, FedCgsConfig(ridge=1.0))
    assert (ridged(torch.from_numpy(x)).argmax(1).numpy() == y).mean() == 1.0  # a ridge fits
    with pytest.raises(ValueError, match="ridge: expected >= 0, got -1"):
        FedCgsConfig(ridge=-1.0)


def test_a_client_that_lies_about_its_statistics_is_refused() -> None:
    dims = WireDims(3, 1, 8, 0, {"D": 6}, max_examples=100)
    spec = build_method("fedcgs").payload_spec(dims)
    x, y = blobs(n=40)
    honest = class_statistics(x, y, 3, "lda")
    validate_payload(honest, spec, dims, 0)
    lies = {
        "counts": honest.arrays["counts"] * 10,  # more examples than a client may hold
        "gram": honest.arrays["gram"][:5, :5],  # not d × d
        "sums": honest.arrays["sums"].astype(np.float32),  # another dtype
    }
    for name, value in lies.items():
        with pytest.raises(PayloadError, match=name):
            validate_payload(Payload({**honest.arrays, name: value}), spec, dims, 0)


def test_fedcgs_trains_small_data_on_the_shared_encoder(tiny_config: Any) -> None:
    cfg = tiny_config(methods=["fedcgs", "ghofl"], encoder="random:dim=16", clients=4)
    result = oneshotfl.run(cfg)
    by_key = {m.key: m for m in result.methods}
    assert by_key["fedcgs"].accuracy > 0.5, by_key["fedcgs"].accuracy
    assert by_key["fedcgs"].upload_bytes_mean == by_key["ghofl"].upload_bytes_mean
