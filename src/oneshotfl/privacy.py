"""Differential-privacy mechanisms with exact calibration, as pure functions.

The analytic Gaussian mechanism (Balle and Wang 2018, "Improving the Gaussian Mechanism for
Differential Privacy: Analytical Calibration and Optimal Denoising", ICML, Theorem 8): adding
N(0, σ²) to a query of L2 sensitivity Δ is (ε, δ)-DP if and only if

    Φ(Δ/(2σ) − εσ/Δ) − e^ε · Φ(−Δ/(2σ) − εσ/Δ) ≤ δ.

:func:`analytic_gaussian_sigma` finds the smallest such σ by bisection on that exact
condition (no ε ≤ 1 restriction, unlike the classical σ = Δ·√(2 ln(1.25/δ))/ε).
"""

from __future__ import annotations

import math

import torch
from scipy.special import log_ndtr, ndtr


def gaussian_delta(sigma: float, epsilon: float, sensitivity: float) -> float:
    """The smallest δ for which N(0, σ²) noise on a Δ-sensitive query is (ε, δ)-DP."""
    if sigma <= 0:
        return 1.0
    a = sensitivity / (2 * sigma)
    b = epsilon * sigma / sensitivity
    first = float(ndtr(a - b))
    # e^ε·Φ(−a−b) in log space: e^ε overflows long before the product does
    second = math.exp(epsilon + float(log_ndtr(-a - b)))
    return max(0.0, first - second)


def analytic_gaussian_sigma(
    epsilon: float, delta: float, sensitivity: float, tol: float = 1e-12
) -> float:
    """The smallest σ with (ε, δ)-DP for a query of L2 sensitivity Δ (Balle & Wang 2018).

    Raises:
        ValueError: for ε <= 0, δ outside (0, 1) or Δ <= 0.
    """
    if not epsilon > 0:
        raise ValueError(f"epsilon: expected > 0, got {epsilon!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta: expected in (0, 1), got {delta!r}")
    if not sensitivity > 0:
        raise ValueError(f"sensitivity: expected > 0, got {sensitivity!r}")
    lo, hi = 0.0, sensitivity
    while gaussian_delta(hi, epsilon, sensitivity) > delta:
        lo, hi = hi, hi * 2
    while hi - lo > tol * max(1.0, hi):
        mid = (lo + hi) / 2
        if gaussian_delta(mid, epsilon, sensitivity) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def clip_rows(x: torch.Tensor, bound: float) -> torch.Tensor:
    """Scale every row of ``x`` to L2 norm at most ``bound`` (rows below it are unchanged)."""
    if not bound > 0:
        raise ValueError(f"clip bound: expected > 0, got {bound!r}")
    norms = x.norm(dim=1, keepdim=True)
    return x * torch.clamp(bound / norms.clamp_min(1e-12), max=1.0)


def gaussian_release(
    x: torch.Tensor, bound: float, epsilon: float, delta: float, generator: torch.Generator
) -> tuple[torch.Tensor, float]:
    """Clip each row to L2 ≤ C and add analytic-Gaussian noise for (ε, δ) per row.

    The sensitivity is 2C: replacing one record changes its clipped row by at most 2C
    (replace-one adjacency). Returns the noised rows and σ.
    """
    sigma = analytic_gaussian_sigma(epsilon, delta, 2 * bound)
    clipped = clip_rows(x, bound)
    noise = torch.randn(clipped.shape, generator=generator, dtype=clipped.dtype) * sigma
    return clipped + noise, sigma
