"""Differential-privacy mechanisms with exact calibration, as pure functions, and the privacy
report of clients that upload latents and a head.

The analytic Gaussian mechanism (Balle and Wang 2018, "Improving the Gaussian Mechanism for
Differential Privacy: Analytical Calibration and Optimal Denoising", ICML, Theorem 8): adding
N(0, σ²) to a query of L2 sensitivity Δ is (ε, δ)-DP if and only if

    Φ(Δ/(2σ) − εσ/Δ) − e^ε · Φ(−Δ/(2σ) − εσ/Δ) ≤ δ.

:func:`analytic_gaussian_sigma` finds the smallest such σ by bisection on that exact
condition (no ε ≤ 1 restriction, unlike the classical σ = Δ·√(2 ln(1.25/δ))/ε).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch


def gaussian_delta(sigma: float, epsilon: float, sensitivity: float) -> float:
    """The smallest δ for which N(0, σ²) noise on a Δ-sensitive query is (ε, δ)-DP."""
    if sigma <= 0:
        return 1.0
    a = sensitivity / (2 * sigma)
    b = epsilon * sigma / sensitivity
    from scipy.special import log_ndtr, ndtr  # here: scipy's import is paid by DP runs only

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


def randomized_response_keep(epsilon: float, num_classes: int) -> float:
    """The probability p = e^ε / (e^ε + C − 1) that k-ary randomized response keeps a label;
    every other label is reported with (1 − p)/(C − 1), so the ratio is e^ε: ε-label-DP
    (Warner 1965; k-ary form as in Ghazi et al. 2021, "Deep Learning with Label Differential
    Privacy")."""
    if not epsilon > 0:
        raise ValueError(f"label epsilon: expected > 0, got {epsilon!r}")
    if num_classes < 2:
        raise ValueError(f"randomized response: expected >= 2 classes, got {num_classes}")
    return 1.0 / (1.0 + (num_classes - 1) * math.exp(-epsilon))


def randomized_response(
    y: torch.Tensor, num_classes: int, epsilon: float, generator: torch.Generator
) -> torch.Tensor:
    """Each label kept with :func:`randomized_response_keep`'s p, else replaced by one of the
    other C − 1 labels uniformly; all draws from ``generator``."""
    keep = torch.rand(y.shape, generator=generator) < randomized_response_keep(epsilon, num_classes)
    shift = torch.randint(1, num_classes, y.shape, generator=generator)  # never 0: another label
    return torch.where(keep, y, (y + shift) % num_classes)


class LatentUpload(Protocol):
    """The privacy settings of a client that uploads latents and a head (FedAGE)."""

    @property
    def dp_epsilon(self) -> float | None: ...
    @property
    def dp_delta(self) -> float: ...
    @property
    def clip(self) -> float: ...
    @property
    def head_source(self) -> str: ...
    @property
    def label_epsilon(self) -> float | None: ...


def latent_privacy_report(cfg: LatentUpload) -> dict[str, Any]:
    """Every uploaded field — and the labels, which the server recovers from them — covered by
    a DP guarantee or not, and why (written to ``privacy.json`` per method)."""
    latents_dp = cfg.dp_epsilon is not None
    labels_dp = cfg.label_epsilon is not None
    report: dict[str, Any] = {"n_examples": {"covered": False, "why": "the exact example count"}}
    if latents_dp:
        assert cfg.dp_epsilon is not None
        report["latents"] = {
            "covered": True,
            "epsilon": cfg.dp_epsilon,
            "delta": cfg.dp_delta,
            "mechanism": "analytic Gaussian (Balle & Wang 2018), per record",
            "clip_l2": cfg.clip,
            "sensitivity_l2": 2 * cfg.clip,
            "adjacency": "replace one record",
            "sigma": analytic_gaussian_sigma(cfg.dp_epsilon, cfg.dp_delta, 2 * cfg.clip),
        }
    else:
        report["latents"] = {"covered": False, "why": "no DP configured (dp_epsilon unset)"}
    if labels_dp:
        report["labels"] = {
            "covered": True,
            "epsilon": cfg.label_epsilon,
            "mechanism": "k-ary randomized response on each label before the head is trained",
            "disclosed_through": "the head, and the own-client pseudo-labels the server "
            "computes from it (agreement with the true labels: client_facts)",
        }
    else:
        report["labels"] = {
            "covered": False,
            "why": "the head is fitted to the true labels, so the pseudo-label the server "
            "computes for each uploaded latent with its own client's head recovers the label "
            "at the head's training accuracy (client_facts.pseudo_label_agreement); noising "
            "the latents does not change that: the labels themselves are not privatised "
            "(set label_epsilon)",
        }
    head_covered = labels_dp and latents_dp and cfg.head_source == "noised"
    if head_covered:
        assert cfg.dp_epsilon is not None and cfg.label_epsilon is not None
        report["head"] = {
            "covered": True,
            "epsilon": cfg.dp_epsilon + cfg.label_epsilon,
            "delta": cfg.dp_delta,
            "why": "trained on the noised latents and the randomized labels only: "
            "post-processing, composed (basic composition, per record)",
        }
    else:
        source = "noised" if latents_dp and cfg.head_source == "noised" else "clean"
        labels = "randomized" if labels_dp else "true"
        report["head"] = {
            "covered": False,
            "why": f"trained on the {source} latents and the {labels} labels",
        }
    return report
