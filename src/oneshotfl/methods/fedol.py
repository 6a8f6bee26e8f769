"""FedOL: Ye et al., "Towards a Larger Model via One-Shot Federated Learning on Heterogeneous
Client Models" (Ye, An, Ayan, Wang, Yan, Carle; arXiv:2508.13625, 2025).

Clients train their own (possibly different) models once (Eq. 2) and send only their softmax
predictions on the unlabelled public pool D_u. The server trains a larger model by the
alternating block-coordinate algorithm of Section IV-B, for T iterations:

a) pseudo-labels (Algorithm 1): source models M = clients ∪ {server of iteration t−1}
   (clients only at t = 1); per model the entropy baseline H̃_m is the ⌈ρN_u⌉-th lowest
   prediction entropy; reliable models M(x) = {m : H(σ(w_m(x))) ≤ H̃_m} (Eq. 11) vote
   y_m = +1 on their argmax and −1 elsewhere (Eq. 12); G = Σ C²_m ⊙ y_m / Σ C²_m (Eq. 13) with
   C²_m the class-wise confidence (Eq. 10); ŷ = one-hot(argmax G), or 0 when M(x) is empty;
   ρ grows by ``rho_step`` per iteration (easy-to-hard);
b) server training on Eq. (7): Σ_k λ_k(x)·KL(σ(w_c^k(x)) ‖ σ(w_s(x))) + τ·CE(ŷ, σ(w_s(x))),
   λ_k(x) = softmax over clients of −H(σ(w_c^k(x))) (Eq. 14).

Choices where the paper is silent (each a ``FedOLConfig`` field): the server model continues
from the previous iteration (``restart=False``: block-coordinate descent on w_s); epochs per
iteration default to the server training config's ``server_epochs``; optimiser and learning
rate are the server training config (Adam, 1e-3 by default; the paper states lr 0.001);
temperature 1 (the paper uses plain softmax); the CE term is averaged over all of D_u with
excluded samples (ŷ = 0) contributing zero, which is Eq. (7) read literally; ties in argmax go
to the lowest class index. Ablation switches: ``rho_step=0`` (no curriculum),
``negative_votes=False`` (y_m ∈ {0, 1}), ``weighting=uniform`` (λ_k = 1/K), ``server_vote=False``.

Note on Eq. (12)-(13) as read here: G is normalised per class by Σ_m C²_m,c, so with ±1 votes
G_c = 2·A_c − 1 where A_c is the same weighted share with 0/1 votes — a monotone map of each
class, hence the same argmax. The negative votes therefore never change a pseudo-label
(tested, and the ablation in docs/benchmarks/prediction-sharing.md measures identical
accuracy); they would matter only under a normalisation that is not per class, which the
paper does not state.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.functional import (
    EPS,
    entropy,
    entropy_weights,
    soft_cross_entropy_rows,
    weighted_kl_rows,
    weighted_mixture,
)
from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import shared_initial_model
from oneshotfl.methods.common import (
    STUDENT_LIMIT,
    SharesPredictions,
    stack_probabilities,
)
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import Requires, ServerContext
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.robust import agreement_trust, trusted
from oneshotfl.seeding import torch_generator
from oneshotfl.training.distill import distil
from oneshotfl.training.loop import TrainConfig, predict_logits


@dataclass(frozen=True)
class FedOLConfig(Params):
    """FedOL hyper-parameters (paper defaults where it gives them).

    Attributes:
        iterations: T, alternating rounds of pseudo-labelling and server training (10).
        tau: weight τ of the pseudo-label loss in Eq. (7) (0.2).
        rho_start: initial ρ of the entropy baseline (0.1).
        rho_step: growth of ρ per iteration (0.05); 0 disables the curriculum.
        negative_votes: Eq. (12)'s −1 for the classes a model rejects (else 0).
        weighting: λ_k(x) of Eq. (14) (``entropy``) or 1/K (``uniform``).
        server_vote: the previous server model joins the vote from iteration 2.
        epochs_per_iteration: server epochs per iteration (None = ``server_epochs``).
        restart: re-initialise the server model at every iteration.
        temperature: softmax temperature of the client predictions.
        payload_dtype: float32 or float16 predictions on the wire.
        trust: ``none`` (the paper) or ``agreement``: clients whose agreement with the
            others' plurality vote on the pool is below half the median client's are left
            out of the mixture and the votes (:mod:`oneshotfl.robust`; not the paper's).
    """

    iterations: int = 10
    tau: float = 0.2
    rho_start: float = 0.1
    rho_step: float = 0.05
    negative_votes: bool = True
    weighting: Literal["entropy", "uniform"] = "entropy"
    server_vote: bool = True
    epochs_per_iteration: int | None = None
    restart: bool = False
    trust: Literal["none", "agreement"] = "none"
    temperature: float = 1.0
    payload_dtype: Literal["float32", "float16"] = "float32"

    def validate(self) -> None:
        require(self.iterations >= 1, "iterations", ">= 1", self.iterations)
        require(self.tau >= 0, "tau", ">= 0", self.tau)
        require(0 < self.rho_start <= 1, "rho_start", "in (0, 1]", self.rho_start)
        require(self.rho_step >= 0, "rho_step", ">= 0", self.rho_step)
        epochs = self.epochs_per_iteration
        require(epochs is None or epochs >= 1, "epochs_per_iteration", ">= 1 or None", epochs)
        require(self.temperature > 0, "temperature", "> 0", self.temperature)

    def rho(self, iteration: int) -> float:
        """ρ at 0-based ``iteration`` (capped at 1)."""
        return min(1.0, self.rho_start + self.rho_step * iteration)


def class_confidence(probs: torch.Tensor) -> torch.Tensor:
    """Eq. (10): C² = E_x[σ(w(x))], ``[M, N, C] → [M, C]``."""
    return probs.mean(dim=-2)


def entropy_baselines(entropies: torch.Tensor, rho: float) -> torch.Tensor:
    """H̃_m: the ⌈ρ·N⌉-th lowest entropy of each model, ``[M, N] → [M]``."""
    n = entropies.shape[-1]
    rank = min(n, max(1, math.ceil(rho * n)))
    return entropies.sort(dim=-1).values[..., rank - 1]


def pseudo_labels(
    probs: torch.Tensor, confidence: torch.Tensor, rho: float, negative_votes: bool = True
) -> torch.Tensor:
    """Algorithm 1: one-hot pseudo-labels ``[N, C]`` (all-zero rows: no reliable model).

    Args:
        probs: source model predictions ``[M, N, C]``.
        confidence: class-wise confidence C² of each source model ``[M, C]``.
        rho: participation ratio ρ of the entropy baseline.
        negative_votes: vote −1 on rejected classes (Eq. 12) rather than 0.
    """
    h = entropy(probs)
    reliable = h <= entropy_baselines(h, rho).unsqueeze(-1)  # Eq. (11), [M, N]
    top = F.one_hot(probs.argmax(dim=-1), probs.shape[-1]).to(probs.dtype)
    votes = 2 * top - 1 if negative_votes else top  # Eq. (12)
    mask = reliable.unsqueeze(-1).to(probs.dtype)  # [M, N, 1]
    weights = confidence.unsqueeze(1) * mask  # C²_m for m ∈ M(x), [M, N, C]
    g = (weights * votes).sum(0) / weights.sum(0).clamp_min(EPS)  # Eq. (13)
    labels = F.one_hot(g.argmax(dim=-1), probs.shape[-1]).to(probs.dtype)
    return labels * reliable.any(dim=0).unsqueeze(-1).to(probs.dtype)


def fedol_loss(
    logits: torch.Tensor,
    mixture: torch.Tensor,
    const: torch.Tensor,
    pseudo: torch.Tensor,
    tau: float,
) -> torch.Tensor:
    """Eq. (7) per sample: Σ_k λ_k KL(p_k ‖ q) + τ · CE(ŷ, q) (the CE is zero for excluded
    samples, ŷ = 0); the training loss is its mean over the batch."""
    log_q = F.log_softmax(logits, dim=-1)
    distill = weighted_kl_rows(log_q, mixture, const)
    pseudo_ce = soft_cross_entropy_rows(pseudo, log_q)
    return distill + tau * pseudo_ce


@register_method("fedol", "FedOL: iterative pseudo-labels + weighted KD into a larger server")
class FedOL(SharesPredictions[FedOLConfig]):
    """FedOL (Ye et al.): prediction sharing, server-side pseudo-label/KD alternation. The
    client half is Eq. (2) local training (the federation's recipe), then predictions on D_u."""

    known_limits = (STUDENT_LIMIT,)

    Config = FedOLConfig
    requires = Requires(public_data=True, server_model=True)

    def prediction_format(self) -> tuple[float, str]:
        return self.config.temperature, self.config.payload_dtype

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        if ctx.public is None or ctx.server_arch is None:
            raise ValueError("fedol needs a public pool and a server_model")
        cfg = self.config
        probs = stack_probabilities(payloads)
        info: dict[str, Any] = {}
        if cfg.trust == "agreement":  # leave out the clients the others contradict
            trust = agreement_trust(probs)
            keep = trusted(trust)
            ids = sorted(payloads)
            info["trust"] = {str(c): round(float(t), 4) for c, t in zip(ids, trust, strict=True)}
            info["untrusted"] = [c for c, k in zip(ids, keep, strict=True) if not k]
            probs = probs[keep]
        mixture, const = weighted_mixture(probs, entropy_weights(probs, cfg.weighting))
        client_conf = class_confidence(probs)
        train = self._train_config(ctx.train_config)
        server = shared_initial_model(ctx)
        history: list[dict[str, Any]] = []
        server_probs: torch.Tensor | None = None
        for t in range(cfg.iterations):
            sources, conf = probs, client_conf
            if cfg.server_vote and server_probs is not None:  # the server joins from t = 2
                sources = torch.cat([probs, server_probs.unsqueeze(0)])
                conf = torch.cat([client_conf, class_confidence(server_probs).unsqueeze(0)])
            pseudo = pseudo_labels(sources, conf, cfg.rho(t), cfg.negative_votes)
            if cfg.restart and t > 0:
                server = shared_initial_model(ctx)
            self._train(server, ctx, (mixture, const, pseudo), train, t)
            server_probs = torch.softmax(predict_logits(server, ctx.public.x, ctx.device), -1)
            history.append(
                {
                    "iteration": t + 1,
                    "rho": round(cfg.rho(t), 6),
                    "sources": len(sources),
                    "labelled_fraction": float(pseudo.sum() / len(pseudo)),
                }
            )
        return GlobalModel(server.eval(), {"iterations": history, **info})

    def _train_config(self, base: TrainConfig) -> TrainConfig:
        return dataclasses.replace(base, epochs=self.config.epochs_per_iteration or base.epochs)

    def _train(
        self,
        server: nn.Module,
        ctx: ServerContext,
        targets: tuple[torch.Tensor, ...],
        train: TrainConfig,
        t: int,
    ) -> None:
        assert ctx.public is not None
        tau = self.config.tau
        distil(
            server,
            ctx.public.x,
            lambda logits, m, c, y: fedol_loss(logits, m, c, y, tau),
            train,
            torch_generator(ctx.seed, "fedol", t),
            ctx.device,
            targets=targets,
            tracker=ctx.tracker,
            description=f"fedol server, iteration {t + 1}/{self.config.iterations}",
        )
