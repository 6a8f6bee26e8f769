"""FOL's stages as pure functions (Huang and Shu, "Federated Oriented Learning: A Practical
One-Shot Personalized Federated Learning Framework", ICML 2025, OpenReview jwjvkWsePB).

* :func:`encounter_schedule` — which neighbours a client meets in each collection round.
* Stage 2, collect and align: :func:`alignment_scores` and :func:`align_prune`, the
  alignment-aware structured pruning of a received model (fine-tuning before and after is
  the one training loop's plain cross-entropy).
* Stage 3, Top-K ensemble: :func:`validation_scores`, :func:`prediction_cosines`,
  :func:`top_k`, :func:`ensemble_weights` and :func:`weighted_logits` (the paper's
  A_w(x) = Σ_i w_i f_i(x)).
* Stage 4, regularised distillation: :func:`kd_rows` and :func:`anchor_penalty`, the two
  terms of L_KD, and :func:`regularised_distillation`, which minimises their sum.
* What a run did: :func:`own_model_receivers`, the clients whose teacher was their own model.

The pruning objective is partly lost in our copy of the paper: it names a group-lasso norm
‖·‖₂,₁ with strength γ, an alignment regulariser with strength λ_p and an element-wise
product ⊙. Our reconstruction (the method's docs give the reasoning) is the weighted group
lasso

    min_φ  (1/|D|) Σ ℓ(f(x; φ), y) + Σ_g (γ + λ_p · (1 − a_g)) · √p_g · ‖φ_g‖₂,

where g runs over the filters and neurons of the received model (its channel groups,
:mod:`oneshotfl.training.structured`), p_g is a group's parameter count and a_g ∈ [0, 1] is
its alignment with the client's own model on the client's own data: the largest correlation,
over a probe batch of the client's training inputs, between the unit's responses and those
of any unit of the own model's layer at the same relative depth. The ⊙ is the product of the
misalignment vector (1 − a) with the vector of group norms. Minimised by proximal gradient
steps, then the ``prune_ratio`` smallest groups of each layer are removed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.data.types import LabelledData
from oneshotfl.functional import kl_rows, weighted_member_sum
from oneshotfl.seeding import numpy_rng
from oneshotfl.training import optim
from oneshotfl.training.components import proximal_penalty
from oneshotfl.training.loop import Batch, FitHooks, FitStats, TrainConfig, fit
from oneshotfl.training.structured import (
    ChannelGroup,
    channel_groups,
    channel_responses,
    group_lasso_prox,
    group_norms,
    group_sizes,
    kept_units,
    remove_groups,
)

Keep = dict[str, torch.Tensor]


def encounter_schedule(
    receiver: int,
    neighbours: Sequence[int],
    seed: int,
    rounds: int,
    per_round: int,
    contact: float,
) -> tuple[tuple[int, ...], ...]:
    """The neighbours ``receiver`` meets in each of ``rounds`` collection rounds.

    In round e every neighbour not met before is in contact with probability ``contact``;
    the client takes the first ``per_round`` (Q; 0: all) of those in contact in a random
    order. A neighbour sends its model once, so it is met at most once. The draws of round e
    do not depend on ``rounds``: the schedule of E rounds is a prefix of that of E + 1.
    """
    rng = numpy_rng(seed, "fol", "encounters", receiver)
    met: set[int] = set()
    windows: list[tuple[int, ...]] = []
    for _ in range(rounds):
        order = rng.permutation(len(neighbours))
        draws = rng.random(len(neighbours))
        fresh = [neighbours[i] for i in order if draws[i] < contact and neighbours[i] not in met]
        taken = fresh if per_round == 0 else fresh[:per_round]
        met.update(taken)
        windows.append(tuple(sorted(taken)))
    return tuple(windows)


def _pearson(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Correlations between the columns of ``a [N, U]`` and ``b [N, V]``: ``[U, V]``."""
    a = a - a.mean(0)
    b = b - b.mean(0)
    a = a / a.norm(dim=0).clamp_min(1e-12)
    b = b / b.norm(dim=0).clamp_min(1e-12)
    return a.T @ b


def alignment_scores(
    model: nn.Module,
    own: nn.Module,
    groups: list[ChannelGroup],
    x: torch.Tensor,
) -> list[torch.Tensor]:
    """a_g ∈ [0, 1] for every unit of ``model``'s groups: the largest correlation (clipped at
    0) of its responses on ``x`` with those of any unit of ``own``'s layer at the same
    relative depth. All ones when ``own`` has no channel groups (nothing to align to)."""
    own_groups = channel_groups(own)
    if not own_groups:
        return [torch.ones(r.shape[1]) for r in channel_responses(model, groups, x)]
    mine = channel_responses(own, own_groups, x)
    theirs = channel_responses(model, groups, x)
    scores = []
    for layer, responses in enumerate(theirs):
        depth = layer / max(len(theirs) - 1, 1)
        match = mine[round(depth * (len(mine) - 1))]
        scores.append(_pearson(responses, match).max(1).values.clamp(0.0, 1.0))
    return scores


def prune_thresholds(
    scores: list[torch.Tensor], sizes: list[int], gamma: float, lambda_p: float, lr: float
) -> list[torch.Tensor]:
    """Per-step proximal thresholds lr · (γ + λ_p (1 − a_g)) · √p_g of every unit."""
    return [
        lr * (gamma + lambda_p * (1.0 - a)) * math.sqrt(p)
        for a, p in zip(scores, sizes, strict=True)
    ]


def align_prune(
    model: nn.Module,
    own: nn.Module,
    data: LabelledData,
    cfg: TrainConfig,
    *,
    gamma: float,
    lambda_p: float,
    ratio: float,
    probe: int,
    generator: torch.Generator,
    device: torch.device,
) -> tuple[nn.Module, Keep, dict[str, float]]:
    """Alignment-aware structured pruning of a received (fine-tuned) model on the client's
    data: ``cfg.epochs`` of proximal gradient on the objective of the module docs, then the
    ``ratio`` smallest units of every layer removed (a smaller dense model).

    Returns:
        the pruned model, the kept unit indices per producer, and a report (mean alignment,
        parameters before and after).
    """
    groups = channel_groups(model)
    before = sum(p.numel() for p in model.parameters())
    if not groups:
        return model, {}, {"alignment": math.nan, "params_before": before, "params_after": before}
    x = data.x[:probe].to(device)
    model.to(device)
    scores = alignment_scores(model, own.to(device), groups, x)
    steps = prune_thresholds(scores, group_sizes(model, groups), gamma, lambda_p, cfg.lr)

    def loss_fn(m: nn.Module, batch: Batch) -> torch.Tensor:
        xb, yb = batch
        return F.cross_entropy(m(xb), yb)

    hooks = FitHooks(step_end=lambda: group_lasso_prox(model, groups, steps))
    fit(model, (data.x, data.y), loss_fn, cfg, generator, device, hooks=hooks)
    keep = {
        g.producer: kept_units(n, ratio)
        for g, n in zip(groups, group_norms(model, groups), strict=True)
    }
    pruned = remove_groups(model, groups, keep).eval()
    after = sum(p.numel() for p in pruned.parameters())
    mean_alignment = float(torch.cat(scores).mean())
    return (
        pruned,
        keep,
        {"alignment": mean_alignment, "params_before": before, "params_after": after},
    )


def validation_scores(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """score_k(θ): each candidate's accuracy on the validation split, ``[M]`` from ``[M, N, C]``."""
    return (logits.argmax(-1) == y[None, :]).float().mean(1)


def prediction_cosines(logits: torch.Tensor, own: int = 0) -> torch.Tensor:
    """The tie-breaker: cosine similarity between each candidate's softmax outputs on the
    validation split (flattened) and the own model's (candidate ``own``), ``[M]``."""
    probs = torch.softmax(logits, -1).reshape(len(logits), -1)
    return F.cosine_similarity(probs, probs[own][None, :], dim=1)


def top_k(scores: torch.Tensor, cosines: torch.Tensor, k: int) -> list[int]:
    """Indices of the ``k`` best candidates (0: all) by validation score, ties broken by cosine
    similarity, then by index; best first."""
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), -float(cosines[i]), i))
    return order if k == 0 else order[:k]


def weighted_logits(logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """A_w(x) = Σ_i w_i f_i(x): ``[K, N, C]`` member logits, ``[K]`` weights → ``[N, C]``."""
    return weighted_member_sum(weights.to(logits), logits)


def ensemble_weights(logits: torch.Tensor, y: torch.Tensor, steps: int, lr: float) -> torch.Tensor:
    """w = argmin over the simplex of the mean CE of A_w on the client's training split.

    The simplex is kept by the parametrisation w = softmax(v), v starting at 0 (uniform
    weights), optimised with Adam for ``steps`` full-batch steps; K = 1 gives [1].
    """
    v = torch.zeros(len(logits), requires_grad=True)
    if len(logits) == 1 or steps == 0:
        return torch.softmax(v.detach(), 0)
    opt = optim.Adam([v], lr=lr)
    fixed = logits.detach()
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(weighted_logits(fixed, torch.softmax(v, 0)), y)
        loss.backward()
        opt.step()
    return torch.softmax(v.detach(), 0)


def kd_rows(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(softmax(A_w(x)/T) ‖ softmax(f_k(x; θ)/T)) per example, ``[B]``."""
    target = torch.softmax(teacher / temperature, -1)
    return kl_rows(target, torch.log_softmax(student / temperature, -1))


def anchor_penalty(model: nn.Module, anchor: Sequence[torch.Tensor], lam: float) -> torch.Tensor:
    """λ ‖θ⁺ − θ⁻‖² over the trainable parameters (``anchor``: θ⁻, aligned with them)."""
    params: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
    return proximal_penalty(params, list(anchor), 2.0 * lam)


def regularised_distillation(
    student: nn.Module,
    x: torch.Tensor,
    teacher_logits: torch.Tensor,
    *,
    temperature: float,
    lam: float,
    cfg: TrainConfig,
    generator: torch.Generator,
    device: torch.device,
) -> FitStats:
    """Stage 4 in place: minimise mean KD rows + λ ‖θ⁺ − θ⁻‖² on the client's training
    inputs, θ⁻ being ``student``'s parameters on entry."""
    anchor = [p.detach().clone().to(device) for p in student.parameters() if p.requires_grad]

    def loss_fn(m: nn.Module, batch: Batch) -> torch.Tensor:
        xb, tb = batch
        return kd_rows(m(xb), tb, temperature).mean() + anchor_penalty(m, anchor, lam)

    return fit(student, (x, teacher_logits), loss_fn, cfg, generator, device)


OWN_MASS = 0.99
"""The share of the teacher's weight on a client's own model above which, in every round,
FOL's result is that client's local training (:func:`own_model_receivers`)."""

OWN_AGREEMENT = 0.99
"""The share of a client's held-out examples on which its final model predicting as its
local model makes FOL's result that client's local training (:func:`own_model_receivers`)."""


def prediction_agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    """The fraction of rows on which two ``[N, C]`` logit matrices pick the same class."""
    return float((a.argmax(1) == b.argmax(1)).float().mean()) if len(a) else 1.0


def own_weight(round_info: Mapping[str, Any], receiver: int) -> float:
    """The teacher's weight on the receiver's own model in one round's record (``top_k``:
    the chosen candidates' client ids, ``weights``: their weights); 0 when it was not chosen."""
    chosen = list(round_info.get("top_k", []))
    weights = list(round_info.get("weights", []))
    return float(weights[chosen.index(receiver)]) if receiver in chosen else 0.0


def own_model_receivers(
    diagnostics: Mapping[str, Mapping[str, Any]],
    mass: float = OWN_MASS,
    agreement: float = OWN_AGREEMENT,
) -> list[int]:
    """The receivers whose result is their local training (receiver id → its outcome's
    ``info``): their teacher put at least ``mass`` of its weight on their own model in every
    round (``rounds``), or their final model predicts as their local model on at least
    ``agreement`` of their held-out data (``own_agreement``)."""
    return sorted(
        int(r)
        for r, info in diagnostics.items()
        if (info.get("rounds") and all(own_weight(e, int(r)) >= mass for e in info["rounds"]))
        or info.get("own_agreement", 0.0) >= agreement
    )
