"""FedPFT: the client's mixtures are scikit-learn's fit of its classes, the server's samples
have the mixtures' moments (any covariance, a non-PSD one included, gives finite draws),
lying counts are bounded before anything is allocated, and the method runs end to end on
the shared encoder with bytes ordered by covariance type."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn

import oneshotfl
from helpers import make_server_context
from oneshotfl.data.types import TaskInfo
from oneshotfl.methods.fedpft import (
    FedPft,
    FedPftConfig,
    bounded_counts,
    class_mixtures,
    psd_factor,
    sample_mixture,
)
from oneshotfl.protocol.outcome import GlobalModel


def test_the_message_is_each_classs_mixture_and_a_rare_class_is_not_sent() -> None:
    rng = np.random.default_rng(0)
    y = np.array([0] * 200 + [1] * 150 + [2] * 1)
    z = rng.normal(0, 1, (len(y), 4)) * np.array([1.0, 2.0, 0.5, 1.0]) + 5 * y[:, None]
    msg = class_mixtures(z, y, 4, FedPftConfig(covariance="diag", wire="float32"), seed=0)
    assert msg.arrays["counts"].tolist() == [200, 150, 0, 0]  # one example: not more than K
    assert np.allclose(msg.arrays["means"][0, 0], z[y == 0].mean(0), atol=1e-4)
    assert np.allclose(msg.arrays["covariances"][1, 0], z[y == 1].var(0), rtol=1e-3)
    assert np.allclose(msg.arrays["weights"][:2], 1.0)
    assert not msg.arrays["means"][2:].any()
    half = class_mixtures(z, y, 4, FedPftConfig(), seed=0)
    assert half.arrays["means"].dtype == np.float16 and half.arrays["covariances"].shape == (4, 1)


def test_samples_have_the_mixtures_moments_for_every_covariance_type() -> None:
    gen = torch.Generator().manual_seed(0)
    mean = torch.tensor([[1.0, -2.0]], dtype=torch.float64)
    full = torch.tensor([[[2.0, 0.8], [0.8, 1.0]]], dtype=torch.float64)
    cases = {
        "spherical": torch.tensor([0.5], dtype=torch.float64),
        "diag": torch.tensor([[0.5, 2.0]], dtype=torch.float64),
        "full": full,
    }
    for kind, cov in cases.items():
        x = sample_mixture(20000, torch.ones(1), mean, cov, kind, gen)  # type: ignore[arg-type]
        assert torch.allclose(x.mean(0), mean[0], atol=0.05), kind
        if kind == "spherical":
            want = torch.eye(2, dtype=torch.float64) * 0.5
        else:
            want = torch.diag(cov[0]) if kind == "diag" else full[0]
        assert torch.allclose(torch.cov(x.T), want.double(), atol=0.06), kind
    bad = torch.tensor([[[1.0, 3.0], [3.0, 1.0]]], dtype=torch.float64)  # not PSD
    assert torch.isfinite(sample_mixture(50, torch.ones(1), mean, bad, "full", gen)).all()
    factor = psd_factor(full[0])
    assert torch.allclose(factor @ factor.T, full[0], atol=1e-10)


def test_a_client_over_reporting_its_counts_is_bounded_to_twice_the_median() -> None:
    honest = [np.array([50, 50]), np.array([40, 60]), np.array([100, 0])]
    liar = np.array([10**9, 10**9])
    bounded = bounded_counts([*honest, liar])
    assert [b.tolist() for b in bounded[:3]] == [h.tolist() for h in honest]
    assert bounded[3].sum() <= 2 * 100


def test_fedpft_runs_on_the_shared_encoder(tiny_config: Any) -> None:
    head = ":epochs=1:lr=0.03:min_steps=200"  # the server's head in 200 steps, not 5000
    kinds = ["fedpft", "fedpft:covariance=diag", "fedpft:covariance=full:wire=float32"]
    methods = [kind + head for kind in kinds]
    cfg = tiny_config(methods=methods, encoder="random:dim=16", clients=4)
    result = oneshotfl.run(cfg)
    up = [m.upload_bytes_mean for m in result.methods]
    assert up[0] < up[1] < up[2]
    for m in result.methods:
        assert m.accuracy > 0.5, (m.key, m.accuracy)
        assert {"counts_limit", "clipped_clients", "clipped_features"} <= set(m.diagnostics)


def test_clipping_an_honest_large_client_is_reported_and_noted() -> None:
    rng = np.random.default_rng(0)
    sizes = [100, 120, 100, 1000]  # quantity skew: client 3 holds ten times the others
    cfg = FedPftConfig(wire="float32", epochs=1, min_steps=0)
    payloads = {}
    for client, n in enumerate(sizes):
        y = np.arange(n) % 2
        z = rng.normal(0, 1, (n, 4)) + 3 * y[:, None]
        payloads[client] = class_mixtures(z, y, 2, cfg, seed=client)
    task = TaskInfo(dataset="table", num_classes=2, in_channels=1, image_size=2)
    encoder = SimpleNamespace(module=nn.Identity(), preprocess=None, task=task)
    ctx = make_server_context(task, encoder=encoder, client_archs=("mlp",) * 4)
    method = FedPft(cfg)
    outcome = method.aggregate(payloads, ctx)
    assert isinstance(outcome, GlobalModel)
    info = outcome.info
    assert info["counts_limit"] == 2 * 110  # twice the median client's 110
    assert info["clipped_clients"] == [{"client": 3, "reported": 1000, "kept": 220}]
    assert info["clipped_features"] == 780.0 and info["sampled_features"] == 540.0
    (note,) = method.notes(info)
    assert "3 (1000 -> 220)" in note and "780 of their 1000" in note, note
    assert "honest" in note and "\n" not in note
    unclipped = method.aggregate({c: payloads[c] for c in range(3)}, ctx)
    assert isinstance(unclipped, GlobalModel) and unclipped.info["clipped_clients"] == []
    assert method.notes(unclipped.info) == []
