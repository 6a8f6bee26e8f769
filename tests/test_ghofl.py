"""GH-OFL's closed-form heads: the server's head depends only on the summed statistics (so it
equals the pooled fit whatever the partition), each head is its formula, singular statistics
give finite weights, and the method runs end to end on the shared encoder."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import oneshotfl
from oneshotfl.methods.ghofl import (
    GhOflConfig,
    class_statistics,
    gaussian_head,
    pooled_covariance,
    psd_part,
    shrink,
)


def blobs(n: int = 300, d: int = 6, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    centres = rng.normal(0, 3, (classes, d))
    scales = rng.uniform(0.5, 2.0, (classes, d))
    return (centres[y] + rng.normal(0, 1, (n, d)) * scales[y]).astype(np.float32), y


def summed(parts: list[Any]) -> dict[str, np.ndarray]:
    return {k: np.add.reduce([p.arrays[k] for p in parts]) for k in parts[0].arrays}


@pytest.mark.parametrize("head", ["nb", "lda", "qda"])
def test_the_head_is_the_pooled_fit_whatever_the_partition(head: str) -> None:
    x, y = blobs()
    cfg = GhOflConfig(head=head)  # type: ignore[arg-type]
    pooled, _ = gaussian_head(class_statistics(x, y, 3, cfg.head).arrays, cfg)
    order = np.argsort(y, kind="stable")  # label skew: each client holds one or two classes
    parts = [class_statistics(x[i], y[i], 3, cfg.head) for i in np.array_split(order, 5)]
    federated, _ = gaussian_head(summed(parts), cfg)
    probe = torch.from_numpy(x[:50])
    assert torch.allclose(pooled(probe), federated(probe), atol=1e-3)
    accuracy = (federated(torch.from_numpy(x)).argmax(1).numpy() == y).mean()
    assert accuracy > 0.9


def test_each_head_is_its_formula() -> None:
    x, y = blobs(n=200, d=4)
    xd = x.astype(np.float64)
    means = np.stack([xd[y == c].mean(0) for c in range(3)])
    prior = np.log(np.bincount(y) / len(y))
    probe = torch.from_numpy(x[:20])
    lda, _ = gaussian_head(class_statistics(x, y, 3, "lda").arrays, GhOflConfig(lda_shrink=0.0))
    within = sum((xd[y == c] - means[c]).T @ (xd[y == c] - means[c]) for c in range(3))
    inv = np.linalg.inv(within / (len(y) - 3) + 1e-6 * np.eye(4))
    want = xd[:20] @ inv @ means.T - 0.5 * np.einsum("cd,de,ce->c", means, inv, means) + prior
    assert np.allclose(lda(probe).numpy(), want, atol=1e-3)
    cfg = GhOflConfig(head="qda", qda_shrink=0.0)
    qda, _ = gaussian_head(class_statistics(x, y, 3, "qda").arrays, cfg)
    rows = []
    for c in range(3):
        cov = np.cov(xd[y == c].T) + 1e-6 * np.eye(4)
        diff = xd[:20] - means[c]
        maha = np.einsum("nd,de,ne->n", diff, np.linalg.inv(cov), diff)
        rows.append(prior[c] - 0.5 * maha - 0.5 * np.linalg.slogdet(cov)[1])
    assert np.allclose(qda(probe).numpy(), np.stack(rows, 1), atol=1e-2)
    nb, _ = gaussian_head(class_statistics(x, y, 3, "nb").arrays, GhOflConfig(head="nb"))
    var = np.stack([xd[y == c].var(0) for c in range(3)])
    want = [
        prior[c] - 0.5 * ((xd[:20] - means[c]) ** 2 / var[c]).sum(1) - 0.5 * np.log(var[c]).sum()
        for c in range(3)
    ]
    assert np.allclose(nb(probe).numpy(), np.stack(want, 1), atol=1e-3)


def test_singular_statistics_give_finite_heads_and_the_fallback_is_said() -> None:
    x, y = blobs(n=12, d=20)  # fewer examples than dimensions: every covariance is singular
    y[0], x[1:, 0] = 2, 0.0  # a feature constant over all but one example
    y = np.where(np.arange(12) == 0, 2, np.where(y == 2, 1, y))  # class 2 seen once
    for head in ("nb", "lda", "qda"):
        model, info = gaussian_head(class_statistics(x, y, 3, head).arrays, GhOflConfig(head=head))  # type: ignore[arg-type]
        out = model(torch.from_numpy(x))
        assert torch.isfinite(out).all(), head
        assert info["classes_seen_once"] == 1.0
    assert np.allclose(shrink(np.diag([2.0, 0.0]), 1.0), np.eye(2))
    assert np.allclose(
        pooled_covariance(np.eye(2) * 4, np.array([2, 2]), np.zeros((2, 2))), np.eye(2) * 2
    )


def test_ghofl_runs_on_the_shared_encoder_and_sends_what_its_head_needs(tiny_config: Any) -> None:
    cfg = tiny_config(
        methods=["ghofl", "ghofl:head=nb", "ghofl:head=qda"], encoder="random:dim=16", clients=4
    )
    result = oneshotfl.run(cfg)
    bytes_ = {m.key: m.upload_bytes_mean for m in result.methods}
    assert bytes_["ghofl:head=nb"] < bytes_["ghofl"] < bytes_["ghofl:head=qda"]
    for m in result.methods:
        assert m.accuracy > 0.5, (m.key, m.accuracy)
        assert m.diagnostics["classes_present"] == 10.0


def test_a_gram_that_is_no_gram_cannot_break_the_head() -> None:
    x, y = blobs(n=200, d=5)
    parts = [class_statistics(x[i::2], y[i::2], 3, "qda") for i in range(2)]
    parts[1].arrays["grams"][0] = -1e6 * np.eye(5)  # a hostile client's "Gram": negative definite
    for head in ("lda", "qda"):
        stats = summed(parts)
        if head == "lda":
            stats["gram"] = stats.pop("grams").sum(0)
        model, _ = gaussian_head(stats, GhOflConfig(head=head))  # type: ignore[arg-type]
        assert torch.isfinite(model(torch.from_numpy(x))).all(), head
    assert np.allclose(psd_part(np.diag([2.0, -1.0])), np.diag([2.0, 0.0]))


@pytest.mark.parametrize("head", ["nb", "lda", "qda"])
def test_an_absent_class_costs_only_its_prior_and_is_predicted_far_from_the_rest(
    head: str,
) -> None:
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 100)  # class 2 of 3: no client holds it
    centres = np.array([[10.0, 0.0, 0.0], [-10.0, 0.0, 0.0]])
    x = (centres[y] + rng.normal(0, 0.5, (200, 3))).astype(np.float32)
    cfg = GhOflConfig(head=head)  # type: ignore[arg-type]
    model, info = gaussian_head(class_statistics(x, y, 3, cfg.head).arrays, cfg)
    assert info["classes_present"] == 2.0
    probe = torch.tensor([[0.0, 0.0, 0.0], [10.0, 0.0, 0.0], [-10.0, 0.0, 0.0]])
    logits = model(probe)
    # the origin is far from both present means (their logits < −27.6): the absent class wins
    assert logits.argmax(1).tolist() == [2, 0, 1]
    if head == "lda":  # its mean is 0: its logit is log 1e-12 wherever x is
        assert torch.allclose(logits[:, 2], torch.full((3,), np.log(1e-12)), atol=1e-4)
