"""FedAGE's server, Algorithm 1 (its two phases), as functions of a :class:`FedAGEConfig`.

Split from :mod:`oneshotfl.methods.fedage` (the method, its readings and its client) to keep
each module short; the readings and their line references are documented there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.functional import kl_rows, kl_to_student
from oneshotfl.methods.common import head_train_config
from oneshotfl.protocol.contract import ServerContext
from oneshotfl.seeding import numpy_rng, torch_generator
from oneshotfl.training.distill import distil
from oneshotfl.training.loop import Batch, TrainConfig, fit, make_optimizer

if TYPE_CHECKING:
    from oneshotfl.methods.fedage_config import FedAGEConfig


def kd_loss(
    student_logits: torch.Tensor,
    hard: torch.Tensor,
    soft: torch.Tensor,
    weight: torch.Tensor,
    beta: float,
    tau: float,
    beta_on: str = "hard",
    tau_squared: bool = False,
) -> torch.Tensor:
    """Eq. (1): β·CE(ŷ, C_s(z)) + (1−β)·mean_z w_z·KL(soft ‖ softmax(C_s(z)/τ)); with
    ``beta_on="soft"`` β and 1−β swap, with ``tau_squared`` the KL term is × τ². The same
    loss with ŷ_own and P_ens is the authors' phase 2."""
    ce = F.cross_entropy(student_logits, hard)
    kl = kl_rows(soft, F.log_softmax(student_logits / tau, dim=-1))
    soft_term = (weight * kl).mean() * tau**2 if tau_squared else (weight * kl).mean()
    if beta_on == "soft":
        return beta * soft_term + (1 - beta) * ce
    return beta * ce + (1 - beta) * soft_term


def probabilities(head: nn.Module, z: torch.Tensor, tau: float) -> torch.Tensor:
    """softmax(head(z)/τ) on the CPU, without gradients."""
    head = head.cpu().eval()
    with torch.no_grad():
        return torch.softmax(head(z) / tau, dim=-1)


def client_order(
    cfg: FedAGEConfig, ids: list[int], latents: Mapping[int, torch.Tensor], seed: int
) -> list[int]:
    """Phase 1's client order: ``id``, ``size`` (largest first) or ``random`` (seeded)."""
    if cfg.order == "size":
        return sorted(ids, key=lambda c: (-len(latents[c]), c))
    if cfg.order == "random":
        return [int(c) for c in numpy_rng(seed, "fedage", "order").permutation(ids)]
    return list(ids)


def phase1(
    cfg: FedAGEConfig,
    student: nn.Module,
    order: list[int],
    latents: Mapping[int, torch.Tensor],
    teachers: Mapping[int, torch.Tensor],
    ctx: ServerContext,
) -> None:
    """Sequential, confidence-weighted KD from each client's head (Eqs. 1-3, 5, 6)."""
    train = head_train_config(cfg.setting("block_epochs"), cfg.lr, cfg.batch_size)
    cycles, step_train = 1, train
    if cfg.schedule == "interleaved":  # every epoch visits the clients in order
        cycles, step_train = train.epochs, replace(train, epochs=1)
    shared = None
    if cfg.setting("optimizer_state") == "shared":  # one Adam through phase 1 (:157)
        shared = make_optimizer(list(student.to(ctx.device).parameters()), train)
    step = 0
    for _ in range(cycles):
        for c in order:
            p_i = teachers[c]
            soft, mix_live = p_i, False
            if step > 0 and cfg.setting("previous") == "snapshot":  # P_s^(i−1)
                previous = probabilities(student, latents[c], cfg.tau)
                soft = cfg.gamma * p_i + (1 - cfg.gamma) * previous
            elif step > 0:
                mix_live = True  # Eq. (5) against the head being trained, per batch
            tensors = (latents[c], p_i.argmax(dim=-1), soft, p_i.max(dim=-1).values)
            generator = torch_generator(ctx.seed, "fedage", "phase1", step)
            fit_kd(cfg, student, tensors, mix_live, step_train, ctx, generator, shared, step)
            step += 1


def phase2(
    cfg: FedAGEConfig,
    student: nn.Module,
    z: torch.Tensor,
    p_ens: torch.Tensor,
    own: torch.Tensor,
    ctx: ServerContext,
) -> None:
    """Ensemble distillation (Eq. 4), with the authors' own-client CE term as a knob."""
    train = head_train_config(
        cfg.setting("ensemble_epochs"), cfg.lr * cfg.setting("ensemble_lr_scale"), cfg.batch_size
    )
    weight = (
        p_ens.max(dim=-1).values
        if cfg.setting("ensemble_weighting") == "confidence"
        else torch.ones(len(z))
    )
    generator = torch_generator(ctx.seed, "fedage", "ensemble")
    if cfg.setting("phase2") == "kl+ce":
        fit_kd(cfg, student, (z, own, p_ens, weight), False, train, ctx, generator, None, -1)
        return
    tau, scale = cfg.tau, cfg.tau**2 if cfg.setting("tau_squared") else 1.0
    distil(  # Eq. (4): mean_z w_z·KL(P_ens ‖ softmax(C_s(z)/τ)) (w_z = 1 by default)
        student,
        z,
        lambda logits, t: kl_to_student(logits, t, tau) * scale,
        train,
        generator,
        ctx.device,
        targets=(p_ens,),
        weights=weight,
        tracker=ctx.tracker,
        description="fedage server phase 2 (ensemble)",
    )


def fit_kd(
    cfg: FedAGEConfig,
    student: nn.Module,
    tensors: tuple[torch.Tensor, ...],
    mix_live: bool,
    train: TrainConfig,
    ctx: ServerContext,
    generator: torch.Generator,
    optimizer: torch.optim.Optimizer | None,
    step: int,
) -> None:
    """Eq. (1) on ``(z, hard, soft, weight)``: phase 1's block ``step``, or phase 2 (−1)."""
    beta, tau, gamma = cfg.beta, cfg.tau, cfg.gamma
    beta_on, tau_sq = cfg.setting("beta_on"), cfg.setting("tau_squared")

    def loss_fn(model: nn.Module, batch: Batch) -> torch.Tensor:
        zb, h, s, w = batch
        logits = model(zb)
        if mix_live:
            s = gamma * s + (1 - gamma) * torch.softmax(logits.detach() / tau, dim=-1)
        return kd_loss(logits, h, s, w, beta, tau, beta_on, tau_sq)

    phase = "phase 2 (ensemble + own-client CE)" if step < 0 else f"phase 1 ({step + 1})"
    fit(
        student,
        tensors,
        loss_fn,
        train,
        generator,
        ctx.device,
        ctx.tracker,
        f"fedage server {phase}",
        optimizer=optimizer,
    )
