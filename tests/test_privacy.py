"""The analytic Gaussian mechanism, checked against Google's dp-accounting."""

from __future__ import annotations

import math

import pytest
import torch

from oneshotfl.privacy import (
    analytic_gaussian_sigma,
    clip_rows,
    gaussian_delta,
    gaussian_release,
)

dp_accounting = pytest.importorskip("dp_accounting")


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 2.0, 8.0, 32.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-8])
@pytest.mark.parametrize("sensitivity", [1.0, 2.0, 6.0])
def test_sigma_matches_dp_accounting(epsilon: float, delta: float, sensitivity: float) -> None:
    ours = analytic_gaussian_sigma(epsilon, delta, sensitivity)
    theirs = sensitivity * dp_accounting.get_sigma_gaussian(epsilon, delta)
    assert math.isclose(ours, theirs, rel_tol=1e-6), (ours, theirs)
    back = dp_accounting.get_epsilon_gaussian(ours / sensitivity, delta)
    assert math.isclose(back, epsilon, rel_tol=1e-5)


def test_delta_is_tight_at_the_calibrated_sigma() -> None:
    sigma = analytic_gaussian_sigma(1.0, 1e-5, 2.0)
    assert gaussian_delta(sigma, 1.0, 2.0) <= 1e-5
    assert gaussian_delta(sigma * 0.999, 1.0, 2.0) > 1e-5
    classical = 2.0 * math.sqrt(2 * math.log(1.25 / 1e-5)) / 1.0
    assert sigma < classical  # the analytic calibration needs less noise


@pytest.mark.parametrize(
    ("args", "match"),
    [((0.0, 1e-5, 1.0), "epsilon"), ((1.0, 1.0, 1.0), "delta"), ((1.0, 1e-5, 0.0), "sensitivity")],
)
def test_bad_parameters(args: tuple[float, float, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        analytic_gaussian_sigma(*args)


def test_clip_and_release() -> None:
    x = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    clipped = clip_rows(x, 1.0)
    assert torch.allclose(clipped, torch.tensor([[0.6, 0.8], [0.3, 0.4]]))
    g = torch.Generator().manual_seed(0)
    big = torch.zeros(20000, 4)
    noised, sigma = gaussian_release(big, 1.0, 1.0, 1e-5, g)
    assert math.isclose(sigma, analytic_gaussian_sigma(1.0, 1e-5, 2.0))
    assert math.isclose(float(noised.std()), sigma, rel_tol=0.02)
