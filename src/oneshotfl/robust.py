"""Robust aggregation rules: pure functions over client models or predictions.

A one-shot server sees each client once, so it cannot learn whom to trust over rounds; these
rules limit what any few clients can do to the result in that one step:

* :func:`coordinate_median` — each parameter the median of the clients' values (Yin et al.,
  ICML 2018, "Byzantine-Robust Distributed Learning"): fewer than half the clients cannot move
  it outside the honest clients' range.
* :func:`trimmed_mean` — per coordinate, the ⌊β·K⌋ largest and smallest values dropped and the
  rest averaged (the same paper): tolerates up to ⌊β·K⌋ attackers.
* :func:`norm_clipped_average` — every client's update Δ_k = θ_k − θ⁰ from the shared initial
  model scaled down to at most the median update norm, then the weighted average (norm
  clipping as in Sun et al. 2019, "Can You Really Backdoor Federated Learning?", with the
  median as the bound so it needs no tuning): a scaled model counts as a typical one.
* :func:`agreement_trust` — for prediction sharing, each client's agreement with the others:
  the fraction of public-pool samples on which its argmax equals the plurality vote of the
  *other* clients; confident wrong predictions agree with nobody and lose their weight.
* :func:`robust_probability_mean` — the ensemble of member probabilities by the median or the
  trimmed mean per class, renormalised.

Integer tensors (BatchNorm's counters) take the median everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import torch

Aggregation = Literal["mean", "median", "trimmed_mean", "norm_clip"]
"""How a server combines parameter vectors (``mean``: the method's weighted average)."""

State = Mapping[str, np.ndarray]


def _stacked(states: Sequence[State]) -> dict[str, np.ndarray]:
    if not states:
        raise ValueError("robust aggregation: expected at least one state, got none")
    keys = list(states[0])
    if any(set(s) != set(keys) for s in states[1:]):
        raise ValueError("robust aggregation: expected states with the same keys, got different")
    return {k: np.stack([np.asarray(s[k], dtype=np.float64) for s in states]) for k in keys}


def _cast(value: np.ndarray, like: np.ndarray) -> np.ndarray:
    return np.asarray(np.rint(value) if like.dtype.kind in "iub" else value, dtype=like.dtype)


def coordinate_median(states: Sequence[State]) -> dict[str, np.ndarray]:
    """The coordinate-wise median of the clients' tensors."""
    stacked = _stacked(states)
    return {k: _cast(np.median(v, axis=0), states[0][k]) for k, v in stacked.items()}


def trimmed_mean(states: Sequence[State], trim: float) -> dict[str, np.ndarray]:
    """Per coordinate, the mean after dropping the ⌊trim·K⌋ largest and smallest values.

    Raises:
        ValueError: when ``trim`` is outside [0, 0.5) or leaves no value.
    """
    k = len(states)
    drop = int(np.floor(trim * k))
    if not 0 <= trim < 0.5 or k - 2 * drop < 1:
        raise ValueError(f"trimmed_mean: expected trim in [0, 0.5) leaving a value, got {trim}")
    out = {}
    for key, v in _stacked(states).items():
        kept = np.sort(v, axis=0)[drop : k - drop]
        value = kept.mean(axis=0) if states[0][key].dtype.kind == "f" else np.median(v, axis=0)
        out[key] = _cast(value, states[0][key])
    return out


def norm_clipped_average(
    states: Sequence[State], weights: Sequence[float], reference: State
) -> dict[str, np.ndarray]:
    """θ⁰ + Σ_k w_k·min(1, m/‖Δ_k‖)·Δ_k / Σ_k w_k with Δ_k = θ_k − θ⁰ over the float tensors
    and m the median of ‖Δ_k‖; integer tensors take the median.

    Raises:
        ValueError: for mismatched keys or non-positive total weight.
    """
    stacked = _stacked(states)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (len(states),) or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"norm_clipped_average: expected {len(states)} weights >= 0, got {w}")
    floats = [k for k in stacked if states[0][k].dtype.kind == "f"]
    deltas = {k: stacked[k] - np.asarray(reference[k], dtype=np.float64) for k in floats}
    norms = np.sqrt(sum((d.reshape(len(states), -1) ** 2).sum(1) for d in deltas.values()))
    bound = float(np.median(norms))
    scale = np.minimum(1.0, bound / np.maximum(norms, 1e-12)) * w / w.sum()
    out = {}
    for key, v in stacked.items():
        if key in deltas:
            update = np.tensordot(scale, deltas[key], axes=1)
            value = np.asarray(reference[key], dtype=np.float64) + update
        else:
            value = np.median(v, axis=0)
        out[key] = _cast(value, states[0][key])
    return out


def agreement_trust(probs: torch.Tensor) -> torch.Tensor:
    """``[K]`` trust weights from client predictions ``[K, N, C]`` on a shared pool: client
    k's fraction of samples whose argmax equals the plurality vote of the other clients
    (ties to the lowest class). With one client, 1."""
    k, _, c = probs.shape
    if k == 1:
        return torch.ones(1, dtype=probs.dtype)
    labels = probs.argmax(-1)  # [K, N]
    votes = torch.nn.functional.one_hot(labels, c).sum(0)  # [N, C]
    trust = torch.empty(k, dtype=probs.dtype)
    for i in range(k):
        others = votes - torch.nn.functional.one_hot(labels[i], c)
        trust[i] = (others.argmax(-1) == labels[i]).to(probs.dtype).mean()
    return trust


TRUST_RATIO = 0.5
"""A client whose agreement is below this fraction of the median client's is not trusted."""


def trusted(trust: torch.Tensor, ratio: float = TRUST_RATIO) -> torch.Tensor:
    """``[K]`` mask of the clients whose :func:`agreement_trust` is at least ``ratio`` times
    the median client's (every client when the median is 0)."""
    floor = ratio * float(trust.median())
    return trust >= floor if floor > 0 else torch.ones_like(trust, dtype=torch.bool)


def robust_probability_mean(
    probs: torch.Tensor, rule: Literal["median", "trimmed_mean"], trim: float = 0.2
) -> torch.Tensor:
    """Members' probabilities ``[K, N, C]`` combined per class by the median or the trimmed
    mean, then renormalised to rows summing to 1."""
    k = probs.shape[0]
    if rule == "median":  # the middle value, or the mean of the two middle ones
        ordered = probs.sort(0).values
        combined = ordered[(k - 1) // 2 : k // 2 + 1].mean(0)
    else:
        drop = int(np.floor(trim * k))
        if not 0 <= trim < 0.5 or k - 2 * drop < 1:
            raise ValueError(f"trimmed mean: expected trim in [0, 0.5) leaving a value, got {trim}")
        combined = probs.sort(0).values[drop : k - drop].mean(0)
    return combined / combined.sum(-1, keepdim=True).clamp_min(1e-12)
