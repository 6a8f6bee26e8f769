"""FedLPA (Liu et al., "FedLPA: One-shot Federated Learning with Layer-Wise Posterior
Aggregation", NeurIPS 2024; authors' code ``lebronlambert/FedLPA_NeurIPS2024``): every client
sends its locally trained model and, per layer, the Kronecker factors of a Laplace
approximation of its posterior; the server takes the mean of the product of those layer-wise
Gaussian posteriors.

Client k trains with the federation's recipe (the model FedAvg sends) and computes, in one
pass over its n_k training examples, the empirical-Fisher K-FAC factors (A_k, G_k) of every
linear and convolutional layer (:func:`~oneshotfl.methods.kfac.kfac_factors`; ``fisher=true``
takes the expectation over the model's predictions instead). It sends the model, the factors
(float32) and n_k.

The server damps every factor with the paper's prior, Ã = A + γI and G̃ = G + γI with
γ = √(1 − ``coor``) (the code's ``--coor 0.999``: γ ≈ 0.032), and per layer, with
p_k = n_k / Σ n_j and W̄ = [W | b], finds the posterior mean M of precision Σ_k p_k Ã_k ⊗ G̃_k:

    Σ_k p_k G̃_k M Ã_k = Z,   Z = Σ_k p_k G̃_k W̄_k Ã_k

``solver=cg`` (default): exactly, by conjugate gradients from the expectation approximation
(``cg_steps``, relative residual ``cg_tol``). ``approx``: the expectation approximation alone,
M = Ḡ⁻¹ Z Ā⁻¹ with Ḡ, Ā the p-weighted factor means (the paper's closed form). ``gd``: the
authors' code, ``gd_steps`` (10,000) of gradient descent at lr ``gd_lr`` (1.0) on the mean
squared residual, from the approximation: it aims at ``cg``'s minimiser and stops short of
it on large layers (the mean over entries makes its step tiny); where its step diverges the
approximation is kept and the layer counted (``gd_diverged_layers``), never a NaN weight.
Other tensors (BatchNorm, depthwise convolutions) keep the p-weighted FedAvg, as in the
authors' code. On the merging benchmark (docs/benchmarks/merging.md) ``approx`` is the most
accurate of the three; the default is the exact mean, the paper's stated objective.

Against the authors' code: they log the better of ``approx`` and ``gd`` on the *test* set; we
report the solver chosen. Their factors come from the network in train mode (the same as eval
mode for a model without dropout or BatchNorm) with the KFAC-Pytorch convolution scaling
(``scaling=kfac_pytorch``: A/S², G·S² for S output locations: the same A ⊗ G, but a damping
that weighs differently against each factor); ours by default with the KFC scaling
(``scaling=kfc``: A summed over locations, G averaged), so γ means relatively more on a
convolution's G. The split also decides whether ``gd`` is stable: its step (lr 1 on the *mean*
squared residual of N entries) converges only while the operator's largest eigenvalue is below
√N, which a convolution's Ã summed over S locations exceeds. On the merging benchmark
(docs/benchmarks/merging.md, "FedLPA's factors in the authors' scaling") the authors'
``newton_solve`` reaches chance on ``kfc`` factors and converges on ``kfac_pytorch`` ones, to
our ``gd``'s model; but every solver is about ten points less accurate on ``kfac_pytorch``
factors at Dirichlet α = 0.1 (level at 0.5), so ``kfc`` is the default.
Their one-shot clients train with plain cross-entropy (the posterior penalty of their
multi-round variant is inactive in one round), as ours do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from oneshotfl.data.types import LabelledData
from oneshotfl.functional import Weighting
from oneshotfl.methods.base import register_method
from oneshotfl.methods.common import (
    AVERAGING_LIMIT,
    SendsModelAndStatistics,
)
from oneshotfl.methods.kfac import (
    FisherKind,
    KfacScaling,
    damped,
    expectation_approximation,
    fedlpa_gradient_descent,
    kfac_conjugate_gradient,
    kfac_factors,
    kfac_target,
    merge_kfac_layers,
)
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import Requires, ServerContext
from oneshotfl.protocol.layer_stats import LayerStatistics
from oneshotfl.protocol.outcome import GlobalModel, Outcome

LpaSolver = Literal["cg", "approx", "gd"]


@dataclass(frozen=True)
class FedLPAConfig(Params):
    """FedLPA hyper-parameters (names as in the module docs).

    Attributes:
        coor: the prior's strength: each factor is damped by γ = √(1 − coor).
        solver: ``cg`` (the exact posterior mean), ``approx`` (the expectation approximation)
            or ``gd`` (the authors' gradient descent).
        cg_steps: most conjugate-gradient iterations per layer.
        cg_tol: stop when the residual is below this fraction of ‖Z‖.
        gd_steps: gradient-descent steps per layer of ``solver=gd``.
        gd_lr: its learning rate.
        fisher: ``empirical`` (the true labels, the paper) or ``true``.
        scaling: how a convolution's output locations split between A and G: ``kfc``
            (A summed, G averaged) or ``kfac_pytorch`` (the authors' code: A/S², G·S²).
        weighting: p_k: ``size`` (n_k, the paper), ``clipped`` or ``uniform``.
        factor_examples: the most training examples a client's factors use (0: all).
    """

    coor: float = 0.999
    solver: LpaSolver = "cg"
    cg_steps: int = 1000
    cg_tol: float = 1e-8
    gd_steps: int = 10000
    gd_lr: float = 1.0
    fisher: FisherKind = "empirical"
    scaling: KfacScaling = "kfc"
    weighting: Weighting = "size"
    factor_examples: int = 0

    def validate(self) -> None:
        require(0 <= self.coor < 1, "coor", "in [0, 1) (γ = √(1 − coor) > 0)", self.coor)
        require(self.cg_steps >= 1, "cg_steps", ">= 1", self.cg_steps)
        require(self.cg_tol > 0, "cg_tol", "> 0", self.cg_tol)
        require(self.gd_steps >= 0, "gd_steps", ">= 0", self.gd_steps)
        require(self.gd_lr > 0, "gd_lr", "> 0", self.gd_lr)
        require(self.factor_examples >= 0, "factor_examples", ">= 0", self.factor_examples)

    @property
    def damping(self) -> float:
        """γ = √(1 − coor)."""
        return math.sqrt(1.0 - self.coor)


@register_method("fedlpa", "FedLPA: layer-wise Laplace posteriors (K-FAC) aggregated in one shot")
class FedLPA(SendsModelAndStatistics[FedLPAConfig]):
    """FedLPA (see the module docs)."""

    cost = (
        "clients: one local training and one K-FAC pass (one backward per batch; C for "
        "fisher=true); server: per layer K factor pairs, O(K·(o²d + od²)) a solver step "
        "(cg: up to cg_steps, gd: gd_steps)"
    )
    known_limits = (AVERAGING_LIMIT,)

    Config = FedLPAConfig
    requires = Requires(same_architecture=True, data_free=True)

    statistics_group = LayerStatistics("kfac", "kfac")

    def statistics(
        self, model: nn.Module, data: LabelledData, device: torch.device
    ) -> dict[str, torch.Tensor]:
        return kfac_factors(model, data, device, self.config.fisher, self.config.scaling)

    def statistics_examples(self) -> int:
        return self.config.factor_examples

    def statistics_key(self) -> dict[str, object]:
        # the default scaling stays out of the key, so factors cached before the knob are reused
        scaling = {} if self.config.scaling == "kfc" else {"scaling": self.config.scaling}
        return {"fisher": self.config.fisher, **scaling}

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        cfg = self.config
        iterations: list[int] = []
        diverged: list[bool] = []

        def solve(
            start: torch.Tensor, w: torch.Tensor, a: torch.Tensor, g: torch.Tensor, p: torch.Tensor
        ) -> torch.Tensor:
            a, g = damped(a, cfg.damping), damped(g, cfg.damping)
            z = kfac_target(w, a, g, p)
            m = expectation_approximation(z, a, g, p)
            if cfg.solver == "cg":
                m, its = kfac_conjugate_gradient(m, z, a, g, p, cfg.cg_steps, cfg.cg_tol)
                iterations.append(its)
            elif cfg.solver == "gd":
                m, bad = fedlpa_gradient_descent(m, z, a, g, p, cfg.gd_steps, cfg.gd_lr)
                diverged.append(bad)
            return m

        merged = merge_kfac_layers(payloads, ctx.dims, cfg.weighting, solve, ctx.device)
        extra = {"cg_iterations_max": float(max(iterations))} if iterations else {}
        if diverged:  # layers where gd_lr was too large and the approximation was kept
            extra["gd_diverged_layers"] = float(sum(diverged))
        return GlobalModel(merged, {"damping": cfg.damping, **extra})
