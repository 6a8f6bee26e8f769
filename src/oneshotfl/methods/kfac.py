"""Kronecker-factored (K-FAC) curvature of a client's model and the merge it defines: the
shared math of FedLPA (layer-wise posterior aggregation) and FedFisher's K-FAC variant.

Client side (:func:`kfac_factors`). For every layer of :func:`~oneshotfl.protocol.layer_stats.
kfac_layers` (``nn.Linear``, ungrouped ``nn.Conv2d``) with inputs a (a convolution's unfolded
patches, one per output location s = 1..S; a 1 appended where the layer has a bias) and
per-example output gradients g = ∂ log p_y(x) / ∂(layer output):

    A = (1/n) Σ_x Σ_s a_s a_sᵀ,      G = (1/n) Σ_x (1/S) Σ_s g_s g_sᵀ

(Grosse and Martens' KFC convention; S = 1 for a linear layer), so the layer's
Fisher block is approximated by A ⊗ G acting on the weight matrix W̄ = [W | b] (``out × d``)
as vec(G W̄ A). ``scaling=kfac_pytorch`` takes the convention of the KFAC-Pytorch code FedLPA's
authors build on: a convolution's A divided by S² and its G multiplied by S² — the same
A ⊗ G, but a different split between the factors, which matters once each factor is damped.
``fisher=empirical`` takes y as the true label (FedLPA); ``true`` takes the expectation over
the model's own predictive distribution exactly, Σ_c p_c(x) g_c g_cᵀ (one backward pass per
class; FedFisher through nngeometry). Eval mode, so examples are independent. nngeometry
splits the same product A ⊗ G over the output locations as we do, but its A is ours times √m
and its G ours over √m (m = C in nngeometry 0.3, C − 1 in 0.4, 1 for the empirical Fisher);
FedFisher's server uses only the product, and tests/test_statistics_libraries.py checks both
factors and the product against nngeometry and curvlinops.

Server side. With client shares p_k and factors (A_k, G_k) — damped by γ as FedLPA's prior,
Ã = A + γI, G̃ = G + γI — the product of the clients' Gaussian posteriors over a layer has
precision Σ_k p_k Ã_k ⊗ G̃_k, and its mean M solves the linear system

    T(M) = Σ_k p_k G̃_k M Ã_k = Z,      Z = Σ_k p_k G̃_k W̄_k Ã_k          (:func:`kfac_operator`,
                                                                        :func:`kfac_target`)

solved exactly by conjugate gradients (:func:`kfac_conjugate_gradient`: T is symmetric positive
(semi-)definite), approximately by swapping the sum of Kronecker products for the product of the
sums, M ≈ Ḡ⁻¹ Z Ā⁻¹ (:func:`expectation_approximation`, FedLPA's closed-form start), or by
FedLPA's code's gradient descent on mean((T(M) − Z)²) (:func:`fedlpa_gradient_descent`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.data.types import LabelledData
from oneshotfl.functional import Weighting
from oneshotfl.methods.common import average_models, client_shares
from oneshotfl.payload import Payload
from oneshotfl.protocol.layer_stats import kfac_input_size, kfac_layers
from oneshotfl.protocol.spec import WireDims

FisherKind = Literal["true", "empirical"]
KfacScaling = Literal["kfc", "kfac_pytorch"]
"""How a convolution's S output locations split between its factors (see the module docs)."""
KFAC_BATCH = 128
"""Examples per forward pass while the factors are recorded."""


def _layer_inputs(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A layer's inputs as rows ``[rows, d]`` (a convolution's patches; a bias's 1)."""
    if isinstance(layer, nn.Conv2d):
        if isinstance(layer.padding, str) or layer.padding_mode != "zeros":
            raise ValueError(f"K-FAC: a Conv2d with padding {layer.padding!r} is not supported")
        patches = F.unfold(x, layer.kernel_size, layer.dilation, layer.padding, layer.stride)
        rows = patches.transpose(1, 2).reshape(-1, patches.shape[1])
    else:
        rows = x.reshape(-1, x.shape[-1])
    if layer.bias is not None:
        rows = torch.cat([rows, rows.new_ones(rows.shape[0], 1)], 1)
    return rows


def _output_rows(out: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Output gradients as rows ``[rows, out]`` and S, the locations per example."""
    if out.dim() == 4:  # [B, out, H, W]
        return out.permute(0, 2, 3, 1).reshape(-1, out.shape[1]), out.shape[2] * out.shape[3]
    return out.reshape(-1, out.shape[-1]), 1


def kfac_factors(
    model: nn.Module,
    data: LabelledData,
    device: torch.device,
    fisher: FisherKind,
    scaling: KfacScaling = "kfc",
) -> dict[str, torch.Tensor]:
    """``<layer>.A`` and ``<layer>.G`` of every K-FAC layer over ``data`` (see the module
    docs), float32 on the CPU."""
    model = model.to(device).eval()
    layers = kfac_layers(model)
    acc = {}
    for name, layer in layers.items():
        d, out = kfac_input_size(layer), layer.weight.shape[0]
        acc[f"{name}.A"] = torch.zeros(d, d, dtype=torch.float64, device=device)
        acc[f"{name}.G"] = torch.zeros(out, out, dtype=torch.float64, device=device)
    outputs: dict[str, torch.Tensor] = {}
    spatial: dict[str, int] = {}  # S of every convolution

    def hook(name: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...], torch.Tensor], object]:
        def record(layer: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> object:
            rows = _layer_inputs(layer, inputs[0].detach()).double()
            acc[f"{name}.A"] += rows.T @ rows
            outputs[name] = out
            if out.dim() == 4:
                spatial[name] = out.shape[2] * out.shape[3]
            return out.clone()  # a following in-place ReLU must not overwrite what we differentiate

        return record

    handles = [m.register_forward_hook(hook(k)) for k, m in layers.items()]
    try:
        for start in range(0, len(data), KFAC_BATCH):
            x = data.x[start : start + KFAC_BATCH].to(device)
            log_p = torch.log_softmax(model(x), -1)
            if fisher == "empirical":
                y = data.y[start : start + KFAC_BATCH].to(device)
                losses = [log_p.gather(1, y.view(-1, 1)).sum()]
            else:
                root = log_p.detach().exp().sqrt()
                losses = [(root[:, c] * log_p[:, c]).sum() for c in range(log_p.shape[1])]
            names = list(outputs)
            for i, loss in enumerate(losses):
                grads = torch.autograd.grad(
                    loss, [outputs[k] for k in names], retain_graph=i < len(losses) - 1
                )
                for name, g in zip(names, grads, strict=True):
                    rows, locations = _output_rows(g.detach().double())
                    acc[f"{name}.G"] += (rows.T @ rows) / locations
            outputs.clear()
    finally:
        for h in handles:
            h.remove()
    if scaling == "kfac_pytorch":
        for name, s in spatial.items():
            acc[f"{name}.A"] /= s * s
            acc[f"{name}.G"] *= s * s
    n = max(len(data), 1)
    return {k: (v / n).float().cpu() for k, v in acc.items()}


def augmented_weight(layer_state: dict[str, torch.Tensor]) -> torch.Tensor:
    """W̄ = [W reshaped to ``out × fan_in`` | b] from a layer's ``weight`` (and ``bias``)."""
    w = layer_state["weight"].reshape(layer_state["weight"].shape[0], -1)
    bias = layer_state.get("bias")
    return w if bias is None else torch.cat([w, bias.reshape(-1, 1)], 1)


def split_augmented(
    m: torch.Tensor, weight_shape: torch.Size, has_bias: bool
) -> dict[str, torch.Tensor]:
    """The inverse of :func:`augmented_weight`."""
    parts = {"weight": (m[:, :-1] if has_bias else m).reshape(weight_shape)}
    if has_bias:
        parts["bias"] = m[:, -1].contiguous()
    return parts


def kfac_operator(
    m: torch.Tensor, a: torch.Tensor, g: torch.Tensor, p: torch.Tensor
) -> torch.Tensor:
    """T(M) = Σ_k p_k G_k M A_k for stacked factors ``a`` ``[K, d, d]``, ``g`` ``[K, o, o]``."""
    return (p.view(-1, 1, 1) * (g @ m @ a)).sum(0)


def kfac_target(w: torch.Tensor, a: torch.Tensor, g: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Z = Σ_k p_k G_k W̄_k A_k for stacked client weights ``w`` ``[K, o, d]``."""
    return (p.view(-1, 1, 1) * (g @ w @ a)).sum(0)


def expectation_approximation(
    z: torch.Tensor, a: torch.Tensor, g: torch.Tensor, p: torch.Tensor
) -> torch.Tensor:
    """M ≈ Ḡ⁻¹ Z Ā⁻¹ with Ā = Σ_k p_k A_k, Ḡ = Σ_k p_k G_k (pseudo-inverses: no NaN where a
    factor is singular)."""
    a_bar = torch.einsum("k,kij->ij", p, a)
    g_bar = torch.einsum("k,kij->ij", p, g)
    return torch.linalg.pinv(g_bar, hermitian=True) @ z @ torch.linalg.pinv(a_bar, hermitian=True)


def kfac_conjugate_gradient(
    start: torch.Tensor,
    z: torch.Tensor,
    a: torch.Tensor,
    g: torch.Tensor,
    p: torch.Tensor,
    steps: int,
    tol: float,
) -> tuple[torch.Tensor, int]:
    """Solve T(M) = Z by conjugate gradients from ``start``; stops when ‖T(M) − Z‖ ≤ tol·‖Z‖
    or after ``steps``. Returns M and the iterations run. Directions T does not see (a
    singular, undamped factor) keep ``start``'s component."""
    m = start.clone()
    r = z - kfac_operator(m, a, g, p)
    d = r.clone()
    rr = float((r * r).sum())
    goal = (tol * float(z.norm())) ** 2
    for it in range(steps):
        if rr <= goal:
            return m, it
        td = kfac_operator(d, a, g, p)
        curvature = float((d * td).sum())
        if curvature <= 0:  # only null directions left
            return m, it
        step = rr / curvature
        m.add_(d, alpha=step)
        r.sub_(td, alpha=step)
        rr_next = float((r * r).sum())
        d.mul_(rr_next / rr).add_(r)
        rr = rr_next
    return m, steps


def fedlpa_gradient_descent(
    start: torch.Tensor,
    z: torch.Tensor,
    a: torch.Tensor,
    g: torch.Tensor,
    p: torch.Tensor,
    steps: int,
    lr: float,
) -> tuple[torch.Tensor, bool]:
    """FedLPA's code's solver: ``steps`` of M ← M − lr·∇ mean((T(M) − Z)²), i.e. M ← M −
    lr·(2/N)·T(T(M) − Z) with N = M's entries (the factors are symmetric). It diverges where
    lr·(2/N)·λ_max(T)² > 2; then, or if it ends with a larger residual than it started
    from, ``start`` is returned and the flag is True (never a NaN weight)."""
    m = start.clone()
    scale = 2.0 * lr / m.numel()
    for _ in range(steps):
        m.sub_(kfac_operator(kfac_operator(m, a, g, p) - z, a, g, p), alpha=scale)
        if not bool(torch.isfinite(m).all()):
            return start, True
    before = float((kfac_operator(start, a, g, p) - z).norm())
    after = float((kfac_operator(m, a, g, p) - z).norm())
    return (start, True) if after > before else (m, False)


def kfac_largest_eigenvalue(
    a: torch.Tensor, g: torch.Tensor, p: torch.Tensor, steps: int = 300, seed: int = 0
) -> float:
    """λ_max(T) of the (symmetric positive semi-definite) operator T(M) = Σ_k p_k G_k M A_k,
    by ``steps`` power iterations from a seeded random start. :func:`fedlpa_gradient_descent`
    at lr η converges only while η·(2/N)·λ_max(T)² < 2 (N = o·d entries), i.e. at the authors'
    η = 1 while λ_max(T) < √N."""
    gen = torch.Generator().manual_seed(seed)
    m = torch.randn(g.shape[-1], a.shape[-1], generator=gen, dtype=torch.float64).to(a)
    largest = 0.0
    for _ in range(steps):
        m = kfac_operator(m, a, g, p)
        largest = float(m.norm())
        if largest == 0:
            return 0.0
        m = m / largest
    return largest


def damped(factors: torch.Tensor, gamma: float) -> torch.Tensor:
    """F + γI for stacked square factors ``[K, d, d]`` (FedLPA's prior)."""
    if gamma == 0:
        return factors
    eye = torch.eye(factors.shape[-1], dtype=factors.dtype, device=factors.device)
    return factors + gamma * eye


LayerSolver = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]
"""(M₀, W̄_k stacked ``[K, o, d]``, A_k ``[K, d, d]``, G_k ``[K, o, o]``, p ``[K]``) → W̄."""


def merge_kfac_layers(
    payloads: Mapping[int, Payload],
    dims: WireDims,
    weighting: Weighting,
    solve: LayerSolver,
    device: torch.device,
    prefix: str = "kfac",
) -> nn.Module:
    """The clients' p-weighted average (:func:`~oneshotfl.methods.common.average_models`)
    with every K-FAC layer's weight (and bias) replaced by ``solve``'s result from that
    average (M₀), the clients' models, ``<prefix>.<layer>.A``/``.G`` and the shares p_k
    (float64 on ``device``); the other tensors keep the average."""
    merged = average_models(payloads, dims, weighting)
    p = client_shares(payloads, weighting)
    ids = sorted(payloads)
    state = merged.state_dict()
    shares = torch.tensor(p, dtype=torch.float64, device=device)

    def stacked(key: str) -> torch.Tensor:
        return torch.stack([torch.from_numpy(np.asarray(payloads[c].arrays[key])) for c in ids]).to(
            device, torch.float64
        )

    for name, layer in kfac_layers(merged).items():
        keys = ["weight"] + (["bias"] if layer.bias is not None else [])
        start = augmented_weight({k: state[f"{name}.{k}"] for k in keys}).to(device, torch.float64)
        weights = torch.stack(
            [
                augmented_weight(
                    {
                        k: torch.from_numpy(np.asarray(payloads[c].arrays[f"model.{name}.{k}"]))
                        for k in keys
                    }
                )
                for c in ids
            ]
        ).to(device, torch.float64)
        a, g = stacked(f"{prefix}.{name}.A"), stacked(f"{prefix}.{name}.G")
        m = solve(start, weights, a, g, shares)
        parts = split_augmented(m.float().cpu(), layer.weight.shape, layer.bias is not None)
        state.update({f"{name}.{k}": v for k, v in parts.items()})
    merged.load_state_dict(state)
    return merged
