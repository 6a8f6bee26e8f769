"""FedOL: Algorithm 1 on a hand-computed example, Eq. (7), the iteration schedule."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import prepare, run_method
from oneshotfl.functional import entropy_weights, weighted_mixture
from oneshotfl.methods import build_method
from oneshotfl.methods.fedol import (
    FedOLConfig,
    class_confidence,
    entropy_baselines,
    fedol_loss,
    pseudo_labels,
)
from oneshotfl.payload import Payload

# Two source models, four public samples, three classes.
A = [[0.8, 0.1, 0.1], [0.4, 0.3, 0.3], [0.1, 0.8, 0.1], [0.34, 0.33, 0.33]]
B = [[0.1, 0.1, 0.8], [0.1, 0.8, 0.1], [0.34, 0.33, 0.33], [0.4, 0.3, 0.3]]
PROBS = torch.tensor([A, B], dtype=torch.float64)


def test_class_confidence_and_entropy_baseline_by_hand() -> None:
    conf = class_confidence(PROBS)
    torch.testing.assert_close(conf[0], torch.tensor([0.41, 0.3825, 0.2075], dtype=torch.float64))
    torch.testing.assert_close(conf[1], torch.tensor([0.235, 0.3825, 0.3825], dtype=torch.float64))
    h_low = -(0.8 * np.log(0.8) + 2 * 0.1 * np.log(0.1))  # H(.8, .1, .1) = 0.6390
    base = entropy_baselines(-(PROBS * PROBS.log()).sum(-1), rho=0.5)  # ⌈0.5·4⌉ = 2nd lowest
    torch.testing.assert_close(base, torch.tensor([h_low, h_low], dtype=torch.float64))


def test_algorithm_1_by_hand() -> None:
    conf = class_confidence(PROBS)
    labels = pseudo_labels(PROBS, conf, rho=0.5)
    # x0: A (+1 on class 0) and B (+1 on class 2) are both reliable; Eq. (13) per class:
    #   c0: (0.41 − 0.235) / 0.645 = 0.271, c1: −1, c2: (−0.2075 + 0.3825) / 0.59 = 0.297 → 2
    # x1: only B is reliable → 1;  x2: only A → 1;  x3: no reliable model → all-zero row.
    expected = torch.tensor([[0, 0, 1], [0, 1, 0], [0, 1, 0], [0, 0, 0]], dtype=torch.float64)
    torch.testing.assert_close(labels, expected)
    # without negative votes, x0: c0 0.41/0.645 = 0.636 < c2 0.3825/0.59 = 0.648 → still 2
    torch.testing.assert_close(pseudo_labels(PROBS, conf, 0.5, negative_votes=False), expected)


def test_curriculum_admits_more_samples_as_rho_grows() -> None:
    conf = class_confidence(PROBS)
    counts = [float(pseudo_labels(PROBS, conf, rho).sum()) for rho in (0.25, 0.5, 1.0)]
    assert counts == [3.0, 3.0, 4.0]
    full = pseudo_labels(PROBS, conf, 1.0)
    assert full[3].argmax() == 0  # both models vote class 0 on x3 once admitted
    cfg = FedOLConfig()
    assert [round(cfg.rho(t), 2) for t in (0, 1, 9)] == [0.1, 0.15, 0.55]
    assert FedOLConfig(rho_step=0.5).rho(5) == 1.0


def test_client_weights_follow_eq_14() -> None:
    lam = entropy_weights(PROBS)
    h = -(PROBS * PROBS.log()).sum(-1)
    torch.testing.assert_close(lam, torch.softmax(-h, dim=0))
    torch.testing.assert_close(lam.sum(0), torch.ones(4, dtype=torch.float64))
    torch.testing.assert_close(
        entropy_weights(PROBS, "uniform"), torch.full((2, 4), 0.5, dtype=torch.float64)
    )


def test_loss_equals_eq_7_computed_directly() -> None:
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(3, 5, 4, generator=gen, dtype=torch.float64), -1)
    logits = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    lam = entropy_weights(probs)
    pseudo = F.one_hot(torch.tensor([0, 1, 2, 3, 0]), 4).double()
    pseudo[4] = 0  # an excluded sample
    mixture, const = weighted_mixture(probs, lam)
    got = fedol_loss(logits, mixture, const, pseudo, tau=0.2).mean()
    log_q = F.log_softmax(logits, -1)
    kl = (probs * (probs.log() - log_q.unsqueeze(0))).sum(-1)  # [K, N]
    ce = -(pseudo * log_q).sum(-1)
    expected = ((lam * kl).sum(0) + 0.2 * ce).mean()
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize(("server_vote", "sources"), [(True, [3, 4, 4]), (False, [3, 3, 3])])
def test_server_joins_the_vote_from_iteration_two(
    tiny_config: Any, server_vote: bool, sources: list[int]
) -> None:
    setup = prepare(tiny_config(public_size=100, server_model="mlp", server_epochs=1))
    rng = np.random.default_rng(0)
    payloads = {
        k: Payload({"probs": rng.dirichlet(np.ones(10), 100).astype(np.float32)}) for k in range(3)
    }
    method = build_method(f"fedol:iterations=3:server_vote={server_vote}")
    outcome = method.aggregate(payloads, setup.server_view().server_context())
    history = outcome.info["iterations"]  # type: ignore[union-attr]
    assert [h["sources"] for h in history] == sources
    assert [h["rho"] for h in history] == pytest.approx([0.1, 0.15, 0.2])


def test_fedol_end_to_end_sends_only_predictions(tiny_config: Any) -> None:
    cfg = tiny_config(public_size=150, server_model="cnn", server_epochs=2, model="mlp,cnn")
    setup = prepare(cfg)
    result = run_method("fedol", build_method("fedol:iterations=2"), setup)
    assert result["rejected"] == {} and 0 <= result["accuracy"] <= 1
    # 150 × 10 float32 probabilities plus a small safetensors header
    assert all(6000 <= b < 6400 for b in result["upload_bytes_per_client"])
    half = run_method("fedol16", build_method("fedol:iterations=1:payload_dtype=float16"), setup)
    assert all(3000 <= b < 3400 for b in half["upload_bytes_per_client"])


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ("iterations=0", "iterations"),
        ("rho_start=0", "rho_start"),
        ("weighting=max", "weighting"),
        ("payload_dtype=int8", "payload_dtype"),
    ],
)
def test_bad_fedol_parameters(params: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        build_method(f"fedol:{params}")


def test_fedhkt_distils_the_entropy_weighted_mixture(tiny_config: Any) -> None:
    # a confident and a uniform client: λ favours the confident one (Eq. 14)
    probs = torch.tensor([[[0.98, 0.01, 0.01]], [[1 / 3, 1 / 3, 1 / 3]]], dtype=torch.float64)
    mixture, _ = weighted_mixture(probs, entropy_weights(probs))
    assert mixture[0, 0] > (0.98 + 1 / 3) / 2  # above the uniform average
    setup = prepare(tiny_config(public_size=120, server_model="mlp", server_epochs=2))
    result = run_method("fedhkt", build_method("fedhkt"), setup)
    assert result["rejected"] == {} and result["accuracy"] > 0.1


def test_negative_votes_never_change_the_pseudo_label() -> None:
    """Eq. (13) normalises each class by Σ_m C²_m,c, so G_c with ±1 votes is 2·A_c − 1 where
    A_c is the same sum with 0/1 votes: a monotone map per class, hence the same argmax.
    (The ablation in docs/benchmarks/prediction-sharing.md shows identical accuracy with and
    without them.)"""
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        probs = torch.softmax(torch.randn(4, 50, 6, generator=g) * 2, dim=-1)
        conf = torch.rand(4, 6, generator=g) + 0.01
        with_neg = pseudo_labels(probs, conf, 0.5, negative_votes=True)
        without = pseudo_labels(probs, conf, 0.5, negative_votes=False)
        assert torch.equal(with_neg, without)
