"""RegMean (Jin, Ren, Preotiuc-Pietro and Cheng, "Dataless Knowledge Fusion by Merging Weights
of Language Models", ICLR 2023), as FedFisher's repository (``Divyansh03/FedFisher``) runs it
as a one-shot FL baseline: every client sends its locally trained model and, for each
``nn.Linear`` layer, the Gram matrix of that layer's inputs on its data; the server merges each
linear layer in closed form.

Client k trains with the federation's recipe (the model FedAvg sends) and records, in eval
mode over its n_k training examples, G_k = (1/n_k) Σ_x x xᵀ for the input x of every linear
layer (inputs flattened to ``[-1, d_in]``). It sends the model, the G_k (float32, symmetric)
and n_k.

With p_k = n_k / Σ n_j (``weighting``), the server solves, per linear weight W ``[out, in]``,
the least-squares merge min_W Σ_k ‖X_k Wᵀ − X_k W_kᵀ‖² in the paper's closed form

    G̃_k = α·(p_k G_k) + (1 − α)·diag(p_k G_k)           (:func:`reduce_non_diagonal`)
    W   = W̄ + ((Σ_k G̃_k)⁺ Σ_k G̃_k (W_k − W̄)ᵀ)ᵀ,  W̄ = Σ_k p_k W_k     (:func:`regmean_weight`)

with α = ``alpha`` (the off-diagonal scale; 1 is the exact least-squares merge) and ⁺ the
Moore-Penrose pseudo-inverse (float64, Hermitian), so a singular Gram gives no NaN. Where the
Grams span every input this is the paper's ((Σ_k G̃_k)⁻¹ Σ_k G̃_k W_kᵀ)ᵀ. Where they do not — an
input no client's data activate: a dead ReLU unit, a pixel that is always 0 — the objective
leaves those directions of W free, and W keeps the p-weighted average W̄ there (as FedFisher
and the K-FAC merges keep FedAvg where their curvature is blind), so one client, or identical
clients, merge to their own model. Every other tensor (convolutions, biases, BatchNorm) is
averaged: uniformly (``others=uniform``, the authors' code) or with the p_k (``weighted``).

Against the authors' code: they pick α from {0.1, 0.9} by accuracy on 500 labelled training
examples the server holds; ours holds no labels, so α is a knob (default 0.9, their code's
own default). They compute G_k over at most 16,000 shuffled examples; ours over all n_k (or
the first ``gram_examples``). They compress the Grams (rank-95 SVD + 8 bits for LeNet) to
match a model's bytes; ours sends them whole (a 784-input MLP's first layer alone is 784²
floats, about 2.4 MB). They run it on bias-free, BatchNorm-free models. Their merge is the
pseudo-inverse alone, ((Σ_k G̃_k)⁺ Σ_k G̃_k W_kᵀ)ᵀ: the minimum-norm solution, which sets W
to 0 along every input direction the Grams do not span (a dead unit's column; with α = 1
also the differences between inputs that are always equal, such as constant pixels), so a
client merging alone, or identical clients, lose those weights; ours keeps W̄ there and is
theirs on everything the Grams span.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from oneshotfl.data.types import LabelledData
from oneshotfl.functional import Weighting
from oneshotfl.methods.base import register_method
from oneshotfl.methods.common import (
    AVERAGING_LIMIT,
    SendsModelAndStatistics,
)
from oneshotfl.methods.folds import ClientWeight, ModelAverage, held_weights
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import Requires, ServerContext
from oneshotfl.protocol.fold import Fold, fold_all
from oneshotfl.protocol.layer_stats import LayerStatistics, linear_layers
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.protocol.spec import PayloadError, WireDims

GRAM_BATCH = 256


@dataclass(frozen=True)
class RegMeanConfig(Params):
    """RegMean hyper-parameters (names as in the module docs).

    Attributes:
        alpha: α, the scale of the Grams' off-diagonal entries (1: exact least squares).
        weighting: p_k: ``size`` (n_k), ``clipped`` or ``uniform``.
        others: how tensors outside linear weights are averaged: ``uniform`` (the authors'
            code) or ``weighted`` (with the p_k).
        gram_examples: the most training examples a client's Grams use (0: all).
    """

    alpha: float = 0.9
    weighting: Weighting = "size"
    others: Literal["uniform", "weighted"] = "uniform"
    gram_examples: int = 0

    def validate(self) -> None:
        require(0 <= self.alpha <= 1, "alpha", "in [0, 1]", self.alpha)
        require(self.gram_examples >= 0, "gram_examples", ">= 0", self.gram_examples)


def input_grams(
    model: nn.Module, data: LabelledData, device: torch.device
) -> dict[str, torch.Tensor]:
    """G = (1/rows) Σ x xᵀ of every linear layer's input over ``data`` (eval mode), float32
    ``[d_in, d_in]`` on the CPU, keyed by the layer's module name."""
    model = model.to(device).eval()
    layers = linear_layers(model)
    sums = {
        k: torch.zeros(m.in_features, m.in_features, dtype=torch.float64, device=device)
        for k, m in layers.items()
    }
    rows = dict.fromkeys(layers, 0)

    def hook(name: str):  # type: ignore[no-untyped-def]
        def record(module: nn.Linear, inputs: tuple[torch.Tensor, ...]) -> None:
            x = inputs[0].detach().reshape(-1, module.in_features).double()
            sums[name] += x.T @ x
            rows[name] += x.shape[0]

        return record

    handles = [m.register_forward_pre_hook(hook(k)) for k, m in layers.items()]
    try:
        with torch.no_grad():
            for start in range(0, len(data), GRAM_BATCH):
                model(data.x[start : start + GRAM_BATCH].to(device))
    finally:
        for h in handles:
            h.remove()
    return {k: (v / max(rows[k], 1)).float().cpu() for k, v in sums.items()}


def reduce_non_diagonal(gram: np.ndarray, alpha: float) -> np.ndarray:
    """G̃ = α·G + (1 − α)·diag(G)."""
    return alpha * gram + (1 - alpha) * np.diag(np.diagonal(gram))


def regmean_solve(total: np.ndarray, target: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """W = W̄ + ((Σ_k G̃_k)⁺ (Σ_k G̃_k W_kᵀ − (Σ_k G̃_k) W̄ᵀ))ᵀ from the sums ``total`` = Σ_k G̃_k,
    ``target`` = Σ_k G̃_k W_kᵀ and ``mean`` = W̄ (float64): the least-squares merge
    ((Σ_k G̃_k)⁺ Σ_k G̃_k W_kᵀ)ᵀ on the inputs the Grams span, W̄ on those they do not (see the
    module docs). The pseudo-inverse cuts singular values below d · ε₃₂ of the largest: the
    Grams are sent in float32."""
    # the Grams arrive in float32: directions below d · ε₃₂ of the largest are rounding, not
    # data, and keep W̄ (numpy's default cut-off, 1e-15, would invert that noise)
    cutoff = total.shape[0] * float(np.finfo(np.float32).eps)
    residual = target - total @ mean.T
    return mean + (np.linalg.pinv(total, rcond=cutoff, hermitian=True) @ residual).T


class RegMeanSums:
    """Σ_k G̃_k, Σ_k G̃_k W_kᵀ and Σ_k a_k W_k of one linear layer, one client at a time
    (G̃_k = reduce(a_k G_k, α), float64), divided by Σ_k a_k at the end so p_k = a_k / Σ a."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.total: np.ndarray | None = None
        self.target = np.zeros(0)
        self.weights = np.zeros(0)
        self.mass = 0.0

    def add(self, gram: np.ndarray, weight: np.ndarray, a: float) -> None:
        reduced = reduce_non_diagonal(a * gram.astype(np.float64), self.alpha)
        w = weight.astype(np.float64)
        if self.total is None:
            self.total, self.target, self.weights = reduced, reduced @ w.T, a * w
        else:
            self.total += reduced
            self.target += reduced @ w.T
            self.weights += a * w
        self.mass += a

    def merged(self) -> np.ndarray:
        """The layer's merged weight (:func:`regmean_solve` on the p-weighted sums)."""
        assert self.total is not None and self.mass > 0
        m = self.mass
        return regmean_solve(self.total / m, self.target / m, self.weights / m)


def regmean_weight(
    grams: list[np.ndarray], weights: list[np.ndarray], p: list[float], alpha: float
) -> np.ndarray:
    """RegMean's merge of one linear layer from every client's Gram G_k, weight W_k and share
    p_k (:class:`RegMeanSums` then :func:`regmean_solve`)."""
    sums = RegMeanSums(alpha)
    for gram, w, pk in zip(grams, weights, p, strict=True):
        sums.add(gram, w, pk)
    return sums.merged()


class RegMeanFold(Fold):
    """RegMean's server step folded (:mod:`oneshotfl.protocol.fold`): every linear layer's
    sums (:class:`RegMeanSums`) and the average of the other tensors."""

    def __init__(
        self, dims: WireDims, cfg: RegMeanConfig, weights: Mapping[int, float] | None = None
    ) -> None:
        self.cfg = cfg
        self.weight = ClientWeight(cfg.weighting, weights)
        weighted = cfg.others == "weighted"
        others = cfg.weighting if weighted else "uniform"
        self.models = ModelAverage(dims, others, weights=weights if weighted else None)
        self.layers: dict[str, RegMeanSums] = {}

    def add(self, client_id: int, payload: Payload) -> None:
        names = sorted(k[len("gram.") :] for k in payload.arrays if k.startswith("gram."))
        if self.layers and names != sorted(self.layers):
            raise PayloadError("gram", f"Grams of {sorted(self.layers)}", f"{names}", client_id)
        self.models.add(client_id, payload)  # checks the model before anything changes
        a = self.weight(client_id, payload)
        for name in names:
            sums = self.layers.setdefault(name, RegMeanSums(self.cfg.alpha))
            gram = np.asarray(payload.arrays[f"gram.{name}"])
            sums.add(gram, np.asarray(payload.arrays[f"model.{name}.weight"]), a)

    def finish(self) -> Outcome:
        merged = self.models.averaged()
        state = merged.state_dict()
        for name in linear_layers(merged):
            w = self.layers[name].merged()
            state[f"{name}.weight"] = torch.from_numpy(w.astype(np.float32))
        merged.load_state_dict(state)
        info = {"alpha": self.cfg.alpha, "merged_layers": float(len(linear_layers(merged)))}
        return GlobalModel(merged, info)


@register_method("regmean", "RegMean: linear layers merged in closed form from input Grams")
class RegMean(SendsModelAndStatistics[RegMeanConfig]):
    """RegMean as a one-shot FL method (see the module docs)."""

    cost = (
        "clients: one local training and one forward pass recording linear layers' input "
        "Grams; server: per linear layer one d_in×d_in pseudo-inverse, O(n·d_in² + d_in³), the "
        "sums folded as the payloads arrive (``clipped`` weights hold all n)"
    )
    known_limits = (AVERAGING_LIMIT,)

    Config = RegMeanConfig
    requires = Requires(same_architecture=True, data_free=True)

    statistics_group = LayerStatistics("gram", "gram")

    def statistics(
        self, model: nn.Module, data: LabelledData, device: torch.device
    ) -> dict[str, torch.Tensor]:
        return input_grams(model, data, device)

    def statistics_examples(self) -> int:
        return self.config.gram_examples

    def fold(self, ctx: ServerContext) -> Fold | None:
        """The sums folded as the payloads arrive; ``clipped`` weights (every size's median)
        need every payload."""
        if self.config.weighting == "clipped":
            return None
        return RegMeanFold(ctx.dims, self.config)

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        """The fold over the payloads (with ``clipped`` weights, a_k over the held sizes)."""
        weights = held_weights(payloads, self.config.weighting)
        return fold_all(RegMeanFold(ctx.dims, self.config, weights), payloads)
