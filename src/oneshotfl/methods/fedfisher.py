"""FedFisher (Jhunjhunwala, Wang and Joshi, AISTATS 2024; authors' code
``Divyansh03/FedFisher``), diagonal and K-FAC variants: every client sends its locally trained
model and the diagonal (or Kronecker factors) of its Fisher information, and the server finds
the model that best agrees with all of them under the clients' Laplace approximations.

Client k trains with the federation's recipe (the model FedAvg sends) and computes, over its
n_k training examples in eval mode, F_k = (1/n_k) Σ_x Σ_c p_c(x) (∂ log p_c(x) / ∂w)² — the
*true* Fisher's diagonal with the expectation over the model's own predictive distribution
taken exactly, as the authors' code does through nngeometry (``fisher=true``; ``empirical``
uses the true labels instead: (∂ log p_y(x) / ∂w)², one backward pass per example instead of C).
It sends the model, F_k (one float32 tensor per parameter) and n_k.

With p_k = n_k / Σ n_j (``weighting``), the server minimises the paper's objective

    L(w) = ½ Σ_k p_k (w − w_k)ᵀ diag(F_k) (w − w_k),   ∇L(w) = F·w − b,
    F = Σ_k p_k F_k,  b = Σ_k p_k F_k ⊙ w_k          (:func:`fisher_objective_gradient`)

``solver=adam`` (default, the authors' FedFisher(Diag)): from the p-weighted FedAvg, ``steps``
(2000) of their Adam-like rule without bias correction, m ← g + β₁m, v ← g² + β₂v, w ← w −
η m / (√v + ε) with η 0.01, β₁ 0.9, β₂ 0.99, ε 0.01 (:func:`fedfisher_adam`); coordinates the
Fisher does not see stay near FedAvg. ``solver=closed``: the minimiser b / F where F > ``floor``,
FedAvg elsewhere (the "Fisher merge" baseline of their repository, :func:`fisher_merge`).
Buffers (BatchNorm statistics) are FedAvg's.

Against the authors' code: their server keeps, of iterates 0, 100, …, 1900, the one most
accurate on 500 *labelled* training examples it holds; our server holds no labels by
construction, so it returns the last iterate (``steps`` is the knob). They quantise weights
and Fisher to 15 bits per tensor to match a float32 model's bytes; ours sends float32, so a
client uploads about twice a model. Their models have no biases and no BatchNorm; ours may.

``curvature=kfac`` (their FedFisher(K-FAC)): per linear and convolutional layer the client
sends the true Fisher's Kronecker factors (A_k, G_k) (:mod:`oneshotfl.methods.kfac`: the
product A ⊗ G nngeometry computes, split as in Grosse and Martens' KFC), the objective's
gradient is Σ_k p_k G_k (W̄ − W̄_k) A_k on W̄ = [W | b], and ``solver=adam`` runs the same rule
with ε inside the root, w ← w − η m/√(v + ε), as their
code; ``closed`` solves the layer's system by conjugate gradients (at most ``steps``). No
damping: directions the factors do not see keep FedAvg's values. They compress the factors
(rank-50 SVD, 8 bits for LeNet) to a model's bytes; ours go whole, as float32.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from oneshotfl.data.types import LabelledData
from oneshotfl.functional import Weighting
from oneshotfl.methods.base import register_method
from oneshotfl.methods.common import (
    AVERAGING_LIMIT,
    SendsModelAndStatistics,
)
from oneshotfl.methods.folds import ClientWeight, ModelAverage, held_weights
from oneshotfl.methods.kfac import (
    FisherKind,
    kfac_conjugate_gradient,
    kfac_factors,
    kfac_operator,
    kfac_target,
    merge_kfac_layers,
)
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import Requires, ServerContext
from oneshotfl.protocol.fold import Fold, fold_all
from oneshotfl.protocol.layer_stats import LayerStatistics
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.protocol.spec import PayloadError

Solver = Literal["adam", "closed"]
Curvature = Literal["diag", "kfac"]
FISHER_BATCH = 64
"""Examples per vectorised per-example gradient pass."""


@dataclass(frozen=True)
class FedFisherConfig(Params):
    """FedFisher (Diag) hyper-parameters (names as in the module docs).

    Attributes:
        fisher: ``true`` (expectation over the model's predictions, the authors') or
            ``empirical`` (the true labels; C times cheaper).
        curvature: ``diag`` (one Fisher entry per parameter) or ``kfac`` (per linear and
            convolutional layer, Kronecker factors A ⊗ G; other tensors are FedAvg's).
        solver: ``adam`` (the authors' iterative server) or ``closed`` (the minimiser: b / F,
            Fisher merge; for ``kfac`` by conjugate gradients, at most ``steps`` per layer).
        steps: T, the Adam-like steps of ``solver=adam``.
        lr: η of ``solver=adam``.
        beta1: β₁.
        beta2: β₂.
        adam_eps: ε, added to √v.
        floor: where F ≤ this, ``solver=closed`` keeps FedAvg's value.
        weighting: p_k: ``size`` (n_k, the paper), ``clipped`` or ``uniform``.
        fisher_examples: the most training examples a client computes F_k on (0: all, the
            paper; the first ones, in the client's order).
    """

    fisher: FisherKind = "true"
    curvature: Curvature = "diag"
    solver: Solver = "adam"
    steps: int = 2000
    lr: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.99
    adam_eps: float = 0.01
    floor: float = 1e-6
    weighting: Weighting = "size"
    fisher_examples: int = 0

    def validate(self) -> None:
        require(self.steps >= 0, "steps", ">= 0", self.steps)
        require(self.lr > 0, "lr", "> 0", self.lr)
        require(0 <= self.beta1 < 1, "beta1", "in [0, 1)", self.beta1)
        require(0 <= self.beta2 < 1, "beta2", "in [0, 1)", self.beta2)
        require(self.adam_eps > 0, "adam_eps", "> 0", self.adam_eps)
        require(self.floor >= 0, "floor", ">= 0", self.floor)
        require(self.fisher_examples >= 0, "fisher_examples", ">= 0", self.fisher_examples)


def diagonal_fisher(
    model: nn.Module, data: LabelledData, device: torch.device, kind: FisherKind
) -> dict[str, torch.Tensor]:
    """F = (1/n) Σ_x Σ_c p_c(x) (∇_w log p_c(x))² (``true``) or (1/n) Σ_x (∇_w log p_y(x))²
    (``empirical``) per parameter, in eval mode; float32 on the CPU."""
    model = model.to(device).eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def log_prob(p: dict[str, torch.Tensor], x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, (p, buffers), (x.unsqueeze(0),))
        return torch.log_softmax(out, -1)[0].gather(0, c.view(1)).sum()

    per_example = vmap(grad(log_prob), in_dims=(None, 0, 0))
    total = {k: torch.zeros_like(v) for k, v in params.items()}
    n = len(data)
    for start in range(0, n, FISHER_BATCH):
        x = data.x[start : start + FISHER_BATCH].to(device)
        targets: list[tuple[torch.Tensor, torch.Tensor | None]]
        if kind == "empirical":
            targets = [(data.y[start : start + FISHER_BATCH].to(device), None)]
        else:
            with torch.no_grad():
                probs = torch.softmax(model(x), -1)
            targets = [
                (torch.full((len(x),), c, device=device), probs[:, c])
                for c in range(probs.shape[1])
            ]
        for labels, weight in targets:
            grads = per_example(params, x, labels)
            for k, g in grads.items():
                sq = g.square()
                if weight is not None:
                    sq = sq * weight.view(-1, *([1] * (sq.dim() - 1)))
                total[k] += sq.sum(0)
    return {k: (v / max(n, 1)).float().cpu() for k, v in total.items()}


def fisher_objective_gradient(
    w: torch.Tensor, fisher: torch.Tensor, b: torch.Tensor
) -> torch.Tensor:
    """∇L(w) = F·w − b, with F = Σ_k p_k F_k and b = Σ_k p_k F_k ⊙ w_k (flat vectors)."""
    return fisher * w - b


def fedfisher_adam(
    start: torch.Tensor,
    gradient: Callable[[torch.Tensor], torch.Tensor],
    cfg: FedFisherConfig,
    eps_inside: bool = False,
) -> torch.Tensor:
    """The authors' server: T steps of m ← g + β₁m, v ← g² + β₂v, w ← w − η m/(√v + ε)
    (``eps_inside``: w ← w − η m/√(v + ε), their K-FAC variant) with g = ``gradient(w)``."""
    w = start.clone()
    m, v, step = torch.zeros_like(w), torch.zeros_like(w), torch.empty_like(w)
    for _ in range(cfg.steps):  # in place: T steps over |θ| entries without allocating
        g = gradient(w)
        m.mul_(cfg.beta1).add_(g)
        v.mul_(cfg.beta2).addcmul_(g, g)
        if eps_inside:
            torch.add(v, cfg.adam_eps, out=step).sqrt_()
        else:
            torch.sqrt(v, out=step).add_(cfg.adam_eps)
        w.addcdiv_(m, step, value=-cfg.lr)
    return w


def fisher_merge(
    fisher: torch.Tensor, b: torch.Tensor, fallback: torch.Tensor, floor: float
) -> torch.Tensor:
    """argmin L = b / F where F > ``floor``, ``fallback`` (FedAvg) elsewhere."""
    seen = fisher > floor
    return torch.where(seen, b / torch.where(seen, fisher, torch.ones_like(fisher)), fallback)


def merge_diagonal(
    avg: nn.Module,
    fisher: torch.Tensor,
    b: torch.Tensor,
    cfg: FedFisherConfig,
    device: torch.device,
) -> Outcome:
    """FedFisher (Diag) from the p-weighted sums F = Σ_k p_k F_k and b = Σ_k p_k F_k θ_k
    (flat, in ``avg``'s parameter order), started from the average ``avg``."""
    start = torch.nn.utils.parameters_to_vector(avg.parameters()).detach().to(device, b.dtype)
    if cfg.solver == "adam":
        merged = fedfisher_adam(start, lambda w: fisher_objective_gradient(w, fisher, b), cfg)
    else:
        merged = fisher_merge(fisher, b, start, cfg.floor)
    torch.nn.utils.vector_to_parameters(merged.float().cpu(), avg.parameters())
    seen = float((fisher > cfg.floor).double().mean())
    return GlobalModel(avg, {"solver": cfg.solver, "fisher_support": seen})


class DiagonalFisherFold(Fold):
    """FedFisher (Diag)'s server step folded (:mod:`oneshotfl.protocol.fold`): per parameter
    Σ_k a_k F_k and Σ_k a_k F_k θ_k (float64, on the server's device) and the models' average,
    divided by Σ_k a_k at the end (p_k = a_k / Σ a)."""

    def __init__(
        self, ctx: ServerContext, cfg: FedFisherConfig, weights: Mapping[int, float] | None = None
    ) -> None:
        self.cfg, self.device = cfg, ctx.device
        self.weight = ClientWeight(cfg.weighting, weights)
        self.models = ModelAverage(ctx.dims, cfg.weighting, weights=weights)
        self.fisher: dict[str, torch.Tensor] = {}
        self.b: dict[str, torch.Tensor] = {}
        self.mass = 0.0

    def add(self, client_id: int, payload: Payload) -> None:
        fishers = {
            k[len("fisher.") :]: v for k, v in payload.arrays.items() if k.startswith("fisher.")
        }
        if self.fisher and sorted(fishers) != sorted(self.fisher):
            raise PayloadError(
                "fisher", f"Fishers of {sorted(self.fisher)}", f"{sorted(fishers)}", client_id
            )
        for name, value in fishers.items():
            model = payload.arrays.get(f"model.{name}")
            if model is None or np.shape(model) != np.shape(value):
                got = "none" if model is None else f"shape {np.shape(model)}"
                raise PayloadError(
                    f"fisher.{name}", f"a parameter of shape {np.shape(value)}", got, client_id
                )
        self.models.add(client_id, payload)  # checks the model before anything changes
        a = self.weight(client_id, payload)
        for name, value in fishers.items():
            f = torch.from_numpy(value).to(self.device, torch.float64).mul_(a)
            theta = torch.from_numpy(payload.arrays[f"model.{name}"]).to(self.device, torch.float64)
            if name in self.fisher:
                self.fisher[name] += f
                self.b[name] += f * theta
            else:
                self.fisher[name], self.b[name] = f, f * theta
        self.mass += a

    def finish(self) -> Outcome:
        avg = self.models.averaged()
        names = [k for k, _ in avg.named_parameters()]
        fisher = torch.cat([self.fisher[k].flatten() for k in names]) / self.mass
        b = torch.cat([self.b[k].flatten() for k in names]) / self.mass
        return merge_diagonal(avg, fisher, b, self.cfg, self.device)


@register_method("fedfisher", "FedFisher (Diag): Fisher-weighted one-shot model merging")
class FedFisher(SendsModelAndStatistics[FedFisherConfig]):
    """FedFisher's diagonal variant (see the module docs)."""

    cost = (
        "clients: one local training and one Fisher pass each (C per-example gradients per "
        "example for fisher=true); server: n models and Fishers summed, O(n·|θ|), folded as "
        "they arrive (K-FAC and clipped weights hold all n), then T element-wise steps O(T·|θ|)"
    )
    known_limits = (AVERAGING_LIMIT,)

    Config = FedFisherConfig
    requires = Requires(same_architecture=True, data_free=True)

    statistics_group = LayerStatistics("fisher", "diagonal")

    def __init__(self, config: FedFisherConfig | None = None) -> None:
        super().__init__(config)
        if self.config.curvature == "kfac":
            self.statistics_group = LayerStatistics("kfac", "kfac")

    def statistics(
        self, model: nn.Module, data: LabelledData, device: torch.device
    ) -> dict[str, torch.Tensor]:
        if self.config.curvature == "kfac":
            return kfac_factors(model, data, device, self.config.fisher)
        return diagonal_fisher(model, data, device, self.config.fisher)

    def statistics_examples(self) -> int:
        return self.config.fisher_examples

    def statistics_key(self) -> dict[str, object]:
        return {"fisher": self.config.fisher}

    def fold(self, ctx: ServerContext) -> Fold | None:
        """The diagonal merge's sums, folded as the payloads arrive; K-FAC's operator
        Σ_k p_k G_k W A_k keeps every client's factors, and ``clipped`` weights need every
        size's median: both hold every payload."""
        cfg = self.config
        if cfg.curvature == "kfac" or cfg.weighting == "clipped":
            return None
        return DiagonalFisherFold(ctx, cfg)

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        """K-FAC's operator over every payload, or the diagonal merge's fold over them (with
        ``clipped`` weights, a_k over the held sizes)."""
        if self.config.curvature == "kfac":
            return self._aggregate_kfac(payloads, ctx)
        weights = held_weights(payloads, self.config.weighting)
        return fold_all(DiagonalFisherFold(ctx, self.config, weights), payloads)

    def _aggregate_kfac(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        """Per K-FAC layer, L = ½ Σ_k p_k vec(W̄ − W̄_k)ᵀ (A_k ⊗ G_k) vec(W̄ − W̄_k), whose
        gradient is T(W̄) − Z (:func:`~oneshotfl.methods.kfac.kfac_operator`), from FedAvg;
        no damping, as the authors' code."""
        cfg = self.config

        def solve(
            start: torch.Tensor, w: torch.Tensor, a: torch.Tensor, g: torch.Tensor, p: torch.Tensor
        ) -> torch.Tensor:
            z = kfac_target(w, a, g, p)
            if cfg.solver == "closed":
                return kfac_conjugate_gradient(start, z, a, g, p, max(cfg.steps, 1), 1e-8)[0]
            return fedfisher_adam(
                start, lambda m: kfac_operator(m, a, g, p) - z, cfg, eps_inside=True
            )

        merged = merge_kfac_layers(payloads, ctx.dims, cfg.weighting, solve, ctx.device)
        return GlobalModel(merged, {"solver": cfg.solver, "curvature": "kfac"})
