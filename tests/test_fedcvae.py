"""FedCVAE: the ELBO by hand, sample allocation, the decoder-only payload, both variants."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from helpers import prepare, run_method
from oneshotfl.methods import build_method
from oneshotfl.methods.fedcvae import FedCVAEConfig, allocate, elbo_loss
from oneshotfl.payload import Payload
from oneshotfl.protocol.spec import PayloadError, WireDims
from oneshotfl.protocol.validate import validate_payload
from oneshotfl.runner.checks import resolve_methods


def test_elbo_by_hand() -> None:
    x = torch.zeros(1, 1, 2, 2)
    recon = torch.full((1, 4), 0.5)
    mu, logvar = torch.tensor([[1.0]]), torch.tensor([[0.0]])
    # ½·4·0.25 = 0.5 reconstruction; KL = ½(μ² + σ² − 1 − log σ²) = 0.5
    assert math.isclose(float(elbo_loss(recon, x, mu, logvar, beta=2.0)), 0.5 + 2 * 0.5)


def test_allocate_is_proportional_and_exact() -> None:
    parts = allocate(10, np.array([1.0, 1.0, 1.0]))
    assert parts.sum() == 10 and sorted(parts.tolist()) == [3, 3, 4]
    assert allocate(7, np.array([6.0, 1.0])).tolist() == [6, 1]


def test_payload_is_a_decoder_and_label_counts() -> None:
    dims = WireDims(10, 1, 8, 0)
    method = build_method("fedcvae:latent=4:hidden=8")
    spec = method.payload_spec(dims)
    names = {a.name for a in spec.arrays}
    assert "label_counts" in names and all(
        n.startswith("decoder.") for n in names - {"label_counts"}
    )
    shapes = {a.name: a.shape for a in spec.arrays if a.name != "label_counts"}
    arrays = {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}
    validate_payload(Payload({**arrays, "label_counts": np.ones(10, np.int64)}), spec, dims, 0)
    with pytest.raises(PayloadError, match="label_counts"):
        validate_payload(Payload({**arrays, "label_counts": -np.ones(10, np.int64)}), spec, dims, 0)
    with pytest.raises(ValueError, match="variant"):
        FedCVAEConfig(variant="gan")  # type: ignore[arg-type]


def test_tiny_runs_of_both_variants(tiny_config: Any) -> None:
    specs = ["fedcvae:epochs=3", "fedcvae:epochs=3:variant=kd:synthetic_size=300"]
    setup = prepare(tiny_config(methods=specs, server_epochs=3))
    results = [run_method(key, method, setup) for key, method in resolve_methods(specs)]
    for result in results:
        assert result["rejected"] == {} and 0.0 <= result["accuracy"] <= 1.0
    total = sum(len(c.train) for c in setup.data.clients)
    assert results[0]["diagnostics"]["synthetic"] == total
    assert results[1]["diagnostics"]["synthetic"] == 300
