"""Shared math of the methods, as pure functions on tensors and arrays.

Paper modules import from here instead of from each other: entropies and the entropy
weights of FedOL's Eq. (14) / FedHKT, softmax averaging (the ensemble of FedDF, DENSE,
IntactOFL), per-sample KL rows, vote tallies (FedKT's PATE, FedOV's votes) and parameter
averaging (FedAvg). Nothing here trains, loads, or knows a method.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

EPS = 1e-12


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """H(p) = −Σ_c p_c log p_c over the last axis."""
    return -(probs * probs.clamp_min(EPS).log()).sum(dim=-1)


def entropy_weights(
    probs: torch.Tensor, weighting: Literal["entropy", "uniform"] = "entropy"
) -> torch.Tensor:
    """λ_k(x) = softmax_k(−H(p_k(x))) (FedOL's Eq. 14, FedHKT's weighting), or 1/K with
    ``uniform``; ``[K, N, C] → [K, N]``."""
    if weighting == "uniform":
        return torch.full(probs.shape[:2], 1.0 / probs.shape[0], dtype=probs.dtype)
    return torch.softmax(-entropy(probs), dim=0)


def weighted_mixture(probs: torch.Tensor, lam: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ_k λ_k KL(p_k ‖ q) = const − Σ_c m_c log q_c with m = Σ_k λ_k p_k.

    Returns:
        ``(m [N, C], const [N])`` where const = Σ_k λ_k Σ_c p_kc log p_kc, so that
        :func:`weighted_kl_rows` equals the weighted KL exactly while its gradient needs only
        the mixture m.
    """
    mixture = weighted_member_sum(lam, probs)
    const = torch.einsum("kn,knc->n", lam, probs * probs.clamp_min(EPS).log())
    return mixture, const


def weighted_kl_rows(
    log_q: torch.Tensor, mixture: torch.Tensor, const: torch.Tensor
) -> torch.Tensor:
    """Per sample Σ_k λ_k KL(p_k ‖ q) from :func:`weighted_mixture`'s ``(m, const)``."""
    return const - (mixture * log_q).sum(dim=-1)


def kl_rows(target: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """Per sample KL(t ‖ q) = Σ_c t_c (log t_c − log q_c), with 0·log 0 = 0."""
    return (torch.special.xlogy(target, target) - target * log_q).sum(dim=-1)


def soft_cross_entropy_rows(target: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """Per sample −Σ_c t_c log q_c (cross-entropy with probability or one-hot targets)."""
    return -(target * log_q).sum(dim=-1)


def kl_to_student(
    student_logits: torch.Tensor, target: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Per sample KL(t ‖ softmax(z_s/T)): the distillation loss of FedDF, FedKD, FedAGE."""
    return kl_rows(target, F.log_softmax(student_logits / temperature, dim=-1))


def average_probabilities(probs: torch.Tensor) -> torch.Tensor:
    """The uniform ensemble (1/K)·Σ_k p_k, ``[K, N, C] → [N, C]``."""
    if probs.ndim != 3 or probs.shape[0] == 0:
        raise ValueError(
            f"average_probabilities: expected [K >= 1, N, C], got {tuple(probs.shape)}"
        )
    return probs.mean(dim=0)


def weighted_softmax_mean(logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ_m w_m softmax(z_m) / Σ_m w_m: the classic ensemble of probabilities,
    ``logits [M, N, C]``, ``weights [M]``."""
    probs = F.softmax(logits, dim=-1)
    w = weights.to(probs.dtype) / weights.sum()
    return weighted_member_sum(w, probs)


def weighted_hard_vote(logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The weighted majority vote of the members' predicted labels, as a distribution:
    Σ_m w_m·onehot(argmax z_m) / Σ_m w_m, ``logits [M, N, C]``, ``weights [M]`` (its argmax
    breaks a tie towards the lowest label)."""
    votes = F.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    return weighted_member_sum(weights.to(logits.dtype) / weights.sum(), votes)


def weighted_member_sum(weights: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
    """Σ_k w_k·x_k over the member axis of ``members`` ``[K, N, C] → [N, C]``, with one
    weight per member (``weights [K]``) or per member and row (``[K, N]``); the weights are
    used as given (normalise them for a weighted mean)."""
    if weights.ndim == 1:
        return torch.einsum("k,knc->nc", weights, members)
    return torch.einsum("kn,knc->nc", weights, members)


Weighting = Literal["uniform", "size", "clipped"]
"""How clients are weighted by their self-reported sizes n_k (see :func:`client_weights`)."""

CLIP_MEDIANS = 2.0
"""``clipped`` weighting: no client weighs more than this many times the median client."""


def client_weights(sizes: Sequence[float], weighting: Weighting) -> torch.Tensor:
    """Member weights from self-reported sizes: ``uniform`` 1 each, ``size`` n_k, ``clipped``
    min(n_k, 2·median(n)) — a size-weighting one client cannot capture by over-reporting
    (with at least three clients, one liar moves the median at most one rank). Sizes must
    be positive (the wire bounds them to [1, N_max])."""
    n = torch.tensor([float(v) for v in sizes], dtype=torch.float64)
    if weighting == "uniform":
        return torch.ones_like(n)
    if weighting == "clipped":
        return n.clamp(max=CLIP_MEDIANS * float(n.median()))
    return n


def weighted_logit_mean(logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """softmax(Σ_m w_m z_m / Σ_m w_m): the ensemble of logits (what a mixture of experts with
    a uniform gate computes), ``logits [M, N, C]``, ``weights [M]``."""
    w = weights.to(logits.dtype) / weights.sum()
    return F.softmax(weighted_member_sum(w, logits), dim=-1)


def ensemble_target(
    logits: torch.Tensor,
    temperature: float = 1.0,
    form: Literal["probabilities", "logits"] = "probabilities",
) -> torch.Tensor:
    """An ensemble's probabilities from member logits ``[K, N, C] → [N, C]``:
    ``probabilities`` (1/K)·Σ_k softmax(z_k/T); ``logits`` softmax(((1/K)·Σ_k z_k)/T)."""
    if form == "logits":
        return F.softmax(logits.mean(dim=0) / temperature, dim=-1)
    return average_probabilities(F.softmax(logits / temperature, dim=-1))


def vote_counts(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Votes per class, ``[M voters, N] int labels → [N, C]`` float64 counts."""
    if labels.ndim != 2:
        raise ValueError(f"vote_counts: expected [voters, N] labels, got {tuple(labels.shape)}")
    onehot = F.one_hot(labels.long(), num_classes).to(torch.float64)
    return onehot.sum(dim=0)


def consistent_vote_counts(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """One party's consistent vote: M votes for the label its M voters all give, else none,
    ``[M, N] → [N, C]`` (FedKT's consistent voting)."""
    counts = vote_counts(labels, num_classes)
    agree = (labels == labels[:1]).all(dim=0)
    return counts * agree.unsqueeze(-1).to(counts.dtype)


def noisy_argmax(counts: torch.Tensor, gamma: float, rng: np.random.Generator) -> torch.Tensor:
    """argmax_c (counts_c + Lap(1/γ)) per row — PATE's report-noisy-max (no noise when
    γ = 0; ties: lowest class)."""
    if gamma > 0:
        noise = rng.laplace(0.0, 1.0 / gamma, size=tuple(counts.shape))
        counts = counts + torch.from_numpy(noise)
    return counts.argmax(dim=-1)


class WeightedSum:
    """Σ_k w_k θ_k and Σ_k w_k over states added one at a time (float64), read as the mean
    Σ_k w_k θ_k / Σ_k w_k: the weighted average of :func:`weighted_average`, folded so that n
    states are never held at once (issue 53). Integer tensors are rounded back to their dtype
    in :meth:`mean`."""

    def __init__(self) -> None:
        self.sums: dict[str, np.ndarray] = {}
        self.dtypes: dict[str, np.dtype] = {}
        self.total = 0.0
        self.count = 0

    def problem(self, state: Mapping[str, np.ndarray], weight: float) -> str | None:
        """Why ``state`` cannot be added (``None``: it can): a negative or non-finite
        weight, or other tensor names or shapes than the states added before."""
        if not (np.isfinite(weight) and weight >= 0):
            return f"expected a finite non-negative weight, got {weight}"
        if not self.sums:
            return None
        if set(state) != set(self.sums):
            return f"expected the tensors {sorted(self.sums)}, got {sorted(state)}"
        for key, total in self.sums.items():
            if np.shape(state[key]) != total.shape:
                return f"{key}: expected shape {total.shape}, got {np.shape(state[key])}"
        return None

    def add(self, state: Mapping[str, np.ndarray], weight: float) -> None:
        """Add w·θ; nothing changes when it cannot be added.

        Raises:
            ValueError: :meth:`problem`'s reason.
        """
        problem = self.problem(state, weight)
        if problem is not None:
            raise ValueError(f"weighted average: {problem}")
        for key, value in state.items():
            term = np.asarray(value, dtype=np.float64) * weight
            if key in self.sums:
                self.sums[key] += term
            else:
                self.sums[key], self.dtypes[key] = term, np.asarray(value).dtype
        self.total += weight
        self.count += 1

    def mean(self) -> dict[str, np.ndarray]:
        """Σ_k w_k θ_k / Σ_k w_k per tensor.

        Raises:
            ValueError: for no states, or a total weight that is not positive.
        """
        if not self.count or self.total <= 0:
            raise ValueError(
                f"weighted average: expected states of positive total weight, got {self.count}"
                f" state(s) of total weight {self.total}"
            )
        out: dict[str, np.ndarray] = {}
        for key, total in self.sums.items():
            mean, dtype = total / self.total, self.dtypes[key]
            out[key] = np.asarray(np.rint(mean) if dtype.kind in "iub" else mean, dtype=dtype)
        return out


def weighted_average(
    states: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]
) -> dict[str, np.ndarray]:
    """Σ_k w_k θ_k / Σ_k w_k per tensor, summed in the order given (:class:`WeightedSum`, the
    same float operations as folding the states one by one); integer tensors are rounded
    back to their dtype.

    Raises:
        ValueError: for no states, mismatched keys, or non-positive total weight.
    """
    if not states:
        raise ValueError("weighted_average: expected at least one state, got none")
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (len(states),) or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weighted_average: expected {len(states)} non-negative weights, got {w}")
    keys = set(states[0])
    if any(set(s) != keys for s in states[1:]):
        raise ValueError("weighted_average: expected states with the same keys, got different")
    summed = WeightedSum()
    for state, weight in zip(states, w.tolist(), strict=True):
        summed.add(state, weight)
    return summed.mean()


def abstention_weighted_ensemble(logits: torch.Tensor, accepted: int | None = None) -> torch.Tensor:
    """FedEOV's Theorem 2 on (C+1)-way members whose last output is "unknown" (⊥):
    f*(x) = Σ_c α_c(x) f_c(x) / Σ_c α_c(x) with α_c(x) = 1 − p_⊥,c(x) and f_c(x) the member's
    distribution over the C known classes (assumption F3), ``[M, N, C+1] → [N, C]``.

    Since α_c f_c is exactly the member's known-class softmax mass, this is also FedOV's vote,
    the sum of the members' known-class probabilities. With ``accepted = k`` only the k members
    with the smallest p_⊥ per input vote (FedOV's and the FedEOV code's top-k rule; ties to
    the lower member index); ``None`` (or k ≥ M) keeps every member. A row where every
    accepted member is certain of ⊥ (Σ α = 0) gets the uniform distribution.
    """
    if logits.ndim != 3 or logits.shape[0] == 0 or logits.shape[-1] < 2:
        raise ValueError(
            "abstention_weighted_ensemble: expected logits [M>=1, N, C+1>=2], "
            f"got {tuple(logits.shape)}"
        )
    if accepted is not None and accepted < 1:
        raise ValueError(f"abstention_weighted_ensemble: expected accepted >= 1, got {accepted}")
    probs = F.softmax(logits.double(), dim=-1)
    mass = probs[..., :-1]  # α_c f_c
    if accepted is not None and accepted < logits.shape[0]:
        order = torch.sort(probs[..., -1], dim=0, stable=True).indices[:accepted]  # [k, N]
        keep = torch.zeros_like(probs[..., -1]).scatter_(0, order, 1.0)
        mass = mass * keep.unsqueeze(-1)
    total = mass.sum(dim=(0, 2))  # Σ α
    out = mass.sum(0) / total.clamp_min(1e-300).unsqueeze(-1)
    out[total <= 0] = 1.0 / mass.shape[-1]
    return out.float()


def cv_squared(importance: torch.Tensor, eps: float = 1e-10) -> torch.Tensor:
    """CV(v)² = Var(v) / (mean(v)² + ε) of an expert-importance vector v (IntactOFL's Eq. 12,
    Shazeer et al. 2017's balance loss; unbiased variance, 0 for a single expert)."""
    if importance.numel() < 2:
        return importance.new_zeros(())
    return importance.var() / (importance.mean() ** 2 + eps)


def expert_variance(logits: torch.Tensor) -> torch.Tensor:
    """σ(f(x)) of IntactOFL's Eq. 10 per sample: the variance across the K experts of their
    softmax outputs, averaged over classes, ``[K, N, C] → [N]`` (biased, 0 for one expert)."""
    return F.softmax(logits, dim=-1).var(dim=0, unbiased=False).mean(dim=-1)


def masked_disagreement(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float
) -> torch.Tensor:
    """DENSE's adversarial term per sample: T²·KL(softmax(z_t/T) ‖ softmax(z_s/T)) where the
    two argmaxes differ, else 0 (the generator maximises its mean)."""
    kl = kl_to_student(student_logits, F.softmax(teacher_logits / temperature, -1), temperature)
    differ = student_logits.argmax(-1) != teacher_logits.argmax(-1)
    return temperature**2 * kl * differ.to(kl.dtype)


def total_variation_l2(x: torch.Tensor) -> torch.Tensor:
    """DeepInversion's image prior as the F-ADI code computes it: the sum of the Frobenius norms
    of the four neighbour differences (horizontal, vertical and both diagonals) of ``x``
    ``[B, C, H, W]``, not squared."""
    diffs = (
        x[:, :, :, :-1] - x[:, :, :, 1:],
        x[:, :, :-1, :] - x[:, :, 1:, :],
        x[:, :, 1:, :-1] - x[:, :, :-1, 1:],
        x[:, :, :-1, :-1] - x[:, :, 1:, 1:],
    )
    return torch.stack([torch.linalg.vector_norm(d) for d in diffs]).sum()


def projection_update(
    p: torch.Tensor, r: torch.Tensor, shrink: float, alpha: float
) -> torch.Tensor:
    """One recursive-least-squares (OWM) step of MA-Echo's client projection: k = P·r,
    P − C·k·kᵀ / (α + r·k); ``p`` ``[d, d]``, ``r`` ``[d]``."""
    k = p @ r
    return p - shrink * torch.outer(k, k) / (alpha + r @ k)


def ma_echo_consensus_step(
    consensus: torch.Tensor,
    clients: Sequence[torch.Tensor],
    projections: Sequence[torch.Tensor],
    eye: torch.Tensor,
    step: float,
    normalise: bool,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One MA-Echo iteration on a layer (weights ``[F, d]``): W ← W − λ·(1/N)Σ_m (W − W_m)(I −
    P_m), then each W_m ← W_m + λ·(W − W_m)P_mᵀ (rows normalised with ``normalise``)."""
    pull = sum(
        ((consensus - w) @ (eye - p) for w, p in zip(clients, projections, strict=True)),
        torch.zeros_like(consensus),
    )
    consensus = consensus - step * pull / len(clients)
    moved = []
    for w, p in zip(clients, projections, strict=True):
        d = (consensus - w) @ p.T
        if normalise:
            d = d / torch.linalg.vector_norm(d, dim=1, keepdim=True).clamp_min(1e-12)
        moved.append(w + step * d)
    return consensus, moved
