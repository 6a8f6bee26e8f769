"""FedET, FedKT, FedKD and multi-round FedAvg: hand-computed math, wire specs, tiny runs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from helpers import prepare, run_method
from oneshotfl.data.types import TaskInfo
from oneshotfl.functional import consistent_vote_counts, noisy_argmax, vote_counts
from oneshotfl.methods import build_method
from oneshotfl.methods.fedet import (
    FedETConfig,
    consensus,
    diversity_target,
    fedet_loss,
    variance_weights,
)
from oneshotfl.methods.fedkd import FedKDConfig, dequantize_levels, noisy_mean, quantize_levels
from oneshotfl.methods.fedkt import FedKTConfig, disjoint_parts, query_indices
from oneshotfl.payload import Payload
from oneshotfl.protocol.spec import PayloadError, task_dims
from oneshotfl.protocol.validate import validate_payload
from oneshotfl.runner.checks import resolve_methods

DIMS = task_dims(TaskInfo("digits", 10, 1, 8), 4)

# ----------------------------------------------------------------------------- Fed-ET


def test_variance_weights_by_hand() -> None:
    probs = torch.tensor([[[1.0, 0.0]], [[0.5, 0.5]]])  # variances 0.25 and 0
    assert torch.allclose(variance_weights(probs), torch.tensor([[1.0], [0.0]]))
    flat = torch.full((3, 2, 4), 0.25)
    assert torch.allclose(variance_weights(flat), torch.full((3, 2), 1 / 3))
    assert torch.allclose(variance_weights(probs, "uniform"), torch.full((2, 1), 0.5))
    with pytest.raises(ValueError, match="expected \\[K >= 1, N, C\\]"):
        variance_weights(torch.zeros(2, 3))


def three_models() -> torch.Tensor:
    return torch.tensor([[[0.8, 0.1, 0.1]], [[0.7, 0.2, 0.1]], [[0.1, 0.1, 0.8]]])


def test_consensus_and_diversity_by_hand() -> None:
    probs = three_models()
    alpha = variance_weights(probs)
    # Var = (Σ (p − 1/3)²)/3: 0.108889, 0.068889, 0.108889
    v1, v2 = 0.326667 / 3, 0.206667 / 3
    expected = torch.tensor([v1, v2, v1]) / (2 * v1 + v2)
    assert torch.allclose(alpha[:, 0], expected, atol=1e-5)
    mean, labels = consensus(probs, alpha)
    assert labels.tolist() == [0]
    assert math.isclose(float(mean[0, 0]), float((expected * probs[:, 0, 0]).sum()), rel_tol=1e-6)
    div, dissent = diversity_target(probs, alpha, labels)
    assert dissent.tolist() == [True]
    assert torch.allclose(div[0], probs[2, 0])  # the only dissenting model
    agree = torch.tensor([[[0.9, 0.1]], [[0.6, 0.4]]])
    _, agreed = diversity_target(agree, variance_weights(agree), torch.tensor([0]))
    assert agreed.tolist() == [False]


def test_fedet_loss_by_hand() -> None:
    logits = torch.zeros(1, 3)  # q = uniform
    target = torch.tensor([[1.0, 0.0, 0.0]])
    div = three_models()[2]
    loss = fedet_loss(logits, target, div, torch.tensor([True]), lam=0.5).mean()
    kl = 0.8 * math.log(0.8) + 0.2 * math.log(0.1) + math.log(3)
    assert math.isclose(float(loss), math.log(3) + 0.5 * kl, rel_tol=1e-5)
    without = fedet_loss(logits, target, div, torch.tensor([False]), lam=0.5).mean()
    assert math.isclose(float(without), math.log(3), rel_tol=1e-6)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"diversity": -1.0}, "diversity"),
        ({"consensus": "mean"}, "consensus"),
        ({"weighting": "entropy"}, "weighting"),
        ({"epochs": 0}, "epochs"),
    ],
)
def test_fedet_config_validation(params: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FedETConfig(**params)


# ----------------------------------------------------------------------------- FedKT


def test_disjoint_parts_cover_everything_once() -> None:
    parts = disjoint_parts(11, 3, np.random.default_rng(0))
    joined = np.concatenate(parts)
    assert sorted(joined.tolist()) == list(range(11))
    assert sorted(len(p) for p in parts) == [3, 4, 4]
    with pytest.raises(ValueError, match="expected at least 5 examples to split, got 4"):
        disjoint_parts(4, 5, np.random.default_rng(0))


def test_votes_by_hand() -> None:
    labels = torch.tensor([[0, 1], [0, 2], [1, 2]])  # 3 voters, 2 samples
    counts = vote_counts(labels, 3)
    assert counts.tolist() == [[2, 1, 0], [0, 1, 2]]
    assert noisy_argmax(counts, 0.0, np.random.default_rng(0)).tolist() == [0, 2]
    students = torch.tensor([[0, 1], [0, 2]])  # one client's two students
    assert consistent_vote_counts(students, 3).tolist() == [[2, 0, 0], [0, 0, 0]]


def test_noisy_argmax_is_seeded_and_noise_matters() -> None:
    counts = torch.tensor([[3.0, 2.0, 0.0]] * 200, dtype=torch.float64)
    a = noisy_argmax(counts, 0.5, np.random.default_rng(1))
    b = noisy_argmax(counts, 0.5, np.random.default_rng(1))
    assert torch.equal(a, b)
    assert 0 < int((a != 0).sum()) < 200  # Lap(2) noise flips some one-vote margins
    quiet = noisy_argmax(counts, 1e6, np.random.default_rng(1))
    assert quiet.tolist() == [0] * 200


def test_query_indices() -> None:
    assert query_indices(5, 1.0, 0).tolist() == [0, 1, 2, 3, 4]
    chosen = query_indices(100, 0.3, 0)
    assert len(chosen) == 30 and len(set(chosen.tolist())) == 30
    assert torch.equal(chosen, query_indices(100, 0.3, 0))


def test_fedkt_config_and_spec() -> None:
    with pytest.raises(ValueError, match="query_fraction"):
        FedKTConfig(query_fraction=0.0)
    with pytest.raises(ValueError, match="teachers"):
        FedKTConfig(teachers=0)
    spec = build_method("fedkt:partitions=3").payload_spec(DIMS)
    assert [m.prefix for m in spec.models] == ["student0", "student1", "student2"]


# ----------------------------------------------------------------------------- FedKD


def test_level_quantisation_round_trip() -> None:
    probs = torch.tensor([[0.75, 0.25, 0.0]])
    codes = quantize_levels(probs, 5)
    assert codes.dtype == np.uint8 and codes.tolist() == [[3, 1, 0]]
    assert torch.allclose(dequantize_levels(torch.from_numpy(codes), 5), probs)
    zero = dequantize_levels(torch.zeros(1, 4, dtype=torch.uint8), 5)
    assert torch.allclose(zero, torch.full((1, 4), 0.25))


def test_noisy_mean() -> None:
    dists = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[1.0, 0.0]]])
    assert torch.allclose(noisy_mean(dists, 0.0, torch.Generator()), torch.tensor([[2 / 3, 1 / 3]]))
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    noisy = noisy_mean(dists.repeat(1, 50, 1), 1.0, g1)
    assert torch.equal(noisy, noisy_mean(dists.repeat(1, 50, 1), 1.0, g2))
    assert (noisy >= 0).all() and torch.allclose(noisy.sum(-1), torch.ones(50))
    assert not torch.allclose(noisy, torch.tensor([[2 / 3, 1 / 3]]).expand(50, 2))


def test_fedkd_payload_specs_follow_the_quantisation() -> None:
    onehot = build_method("fedkd:quantize=onehot").payload_spec(DIMS)
    good = Payload({"labels": np.array([0, 9, 3, 1], np.uint8)})
    validate_payload(good, onehot, DIMS, 0)
    with pytest.raises(PayloadError, match="labels"):
        validate_payload(Payload({"labels": np.array([0, 10, 3, 1], np.uint8)}), onehot, DIMS, 0)
    levels = build_method("fedkd:quantize=levels:levels=4").payload_spec(DIMS)
    with pytest.raises(PayloadError, match="codes"):
        validate_payload(Payload({"codes": np.full((4, 10), 4, np.uint8)}), levels, DIMS, 0)
    with pytest.raises(ValueError, match="levels"):
        FedKDConfig(levels=1)


# ----------------------------------------------------------------------------- end to end


def test_tiny_runs_of_the_family(tiny_config: Any) -> None:
    specs = [
        "fedet",
        "fedet:form=predictions:consensus=soft",
        "fedkt:teachers=2",
        "fedkt:teachers=2:partitions=1:consistent_voting=false:server_noise_gamma=1",
        "fedkd",
        "fedkd:quantize=onehot",
        "fedkd:quantize=levels:noise_std=0.5",
    ]
    cfg = tiny_config(public_size=200, server_model="mlp", server_epochs=2, methods=specs)
    setup = prepare(cfg)
    results = {key: run_method(key, method, setup) for key, method in resolve_methods(specs)}
    for key, result in results.items():
        assert 0.0 <= result["accuracy"] <= 1.0, key
        assert result["rejected"] == {} and result["clients_used"] == [0, 1, 2], key
    logits = results["fedkd"]["upload_bytes_per_client"]
    onehot = results["fedkd:quantize=onehot"]["upload_bytes_per_client"]
    assert all(200 < s < 200 + 256 for s in onehot), onehot  # one byte per public sample
    assert max(onehot) * 20 < min(logits)
    two = results["fedkt:teachers=2"]["upload_bytes_per_client"]
    [one_key] = [k for k in results if "partitions=1" in k]  # keys list params sorted
    one = results[one_key]["upload_bytes_per_client"]
    assert all(1.9 < a / b < 2.1 for a, b in zip(two, one, strict=True))  # s students
    assert 0 < results["fedet"]["diagnostics"]["dissent_fraction"] <= 1


def test_fedavg_rounds_counts_every_round_and_starts_as_fedavg(tiny_config: Any) -> None:
    specs = ["fedavg", "fedavg_rounds:rounds=3"]
    setup = prepare(tiny_config(methods=specs))
    results = {key: run_method(key, method, setup) for key, method in resolve_methods(specs)}
    once, rounds = results["fedavg"], results["fedavg_rounds:rounds=3"]
    history = rounds["rounds_history"]
    assert [h["round"] for h in history] == [1, 2, 3] and rounds["rounds"] == 3
    assert history[0]["accuracy"] == once["accuracy"]  # round 1 is one-shot FedAvg
    assert history[-1]["accuracy"] == rounds["accuracy"]  # the final model is reported
    assert rounds["upload_bytes_per_client"] == [3 * b for b in once["upload_bytes_per_client"]]
    assert rounds["download_bytes_per_client"] > 2 * once["upload_bytes_per_client"][0]
    assert once["rounds"] == 1 and "rounds_history" not in once
    with pytest.raises(ValueError, match="rounds"):
        build_method("fedavg_rounds:rounds=0")
