"""MA-Echo: Su, Li, Xue (Neural Networks 164, 2023), "One-Shot Federated Learning without
Server-Side Training" — parameter-space aggregation of same-architecture models that keeps each
client's layer outputs on its own data. We could not read the paper here; this follows its
official code (``FudanVI/MAEcho``), as IntactOFL compares against it.

Client (one message): its locally trained model, and for every convolution and linear layer but
the head a projection P_l that approximately projects onto the orthogonal complement of the
span of the layer's inputs on the client's data. P starts at I and takes one
recursive-least-squares (OWM) update per input row r: k = P·rᵀ, P ← P − C·k·kᵀ / (α + r·k)
(:func:`~oneshotfl.functional.projection_update`), with r the batch mean of the layer's
input over one shuffled pass (batch 64) — for a convolution, one row per patch of the batch-mean
input map (``patches=code``: stride 2, no padding, as the code — with the layer's padding
when the map is smaller than the kernel; ``layer``: the layer's own stride and padding);
C = ``shrink`` 0.5; α = ``alpha_linear`` 0.01^0.8, ``alpha_conv`` 1e-4.
It also sends which classes it holds (more than one example: the code's "split").

Server: W_out starts at the average of the models, each head row averaged over the clients that
hold its class. Then ``iterations`` times, for every projected layer (weights as F × d):
W_out ← W_out − λ·Σ_m α_m (W_out − W_m)(I − P_m) pulls the consensus towards each client inside
its data span; then each W_m ← W_m + λ·(W_out − W_m)P_m (``normalise``: row-normalised) moves the
client towards it only where its data never reach, so its outputs there are unchanged — the
"echo". α_m = 1/N. The result is the class-split average of the moved client models. λ =
``step``; the defaults are the code's MNIST preset (λ 1.6, 60 iterations, no normalisation; its
CIFAR preset is λ 0.05, 300 iterations, normalised).

Deviations: the code's networks have no biases and no BatchNorm; here a layer's bias is the
extra column of [W | b] and r gets a constant 1 (``bias=augment``, the exact generalisation;
``bias=average`` averages biases plainly), and every other tensor (BatchNorm parameters and
statistics) is averaged plainly. The projections make the message about (Σ_l d_l²) floats
larger than the model (about 0.8 MiB for LeNet ``cnn``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.functional import ma_echo_consensus_step, projection_update
from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import client_models
from oneshotfl.methods.common import BOTH, SendsTrainedModel
from oneshotfl.models import create_model
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, Requires, ServerContext
from oneshotfl.protocol.fields import model_fields
from oneshotfl.protocol.limits import KnownLimit
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.protocol.spec import ArraySpec, ModelSpec, PayloadSpec, WireDims, n_examples_spec
from oneshotfl.seeding import torch_generator
from oneshotfl.training.services import train_model


@dataclass(frozen=True)
class MAEchoConfig(Params):
    """MA-Echo (see the module docs).

    Attributes:
        step: λ, how far each consensus step and each client's echo step move the weights.
        iterations: how many times every layer's consensus and echo steps are repeated (0:
            the class-split average alone).
        normalise: row-normalise the echo step of each client's weights (the code's CIFAR
            preset).
        shrink: C, the factor of each recursive-least-squares update of a client's
            projection (in (0, 1]).
        alpha_linear: α of the projection updates of linear layers (regularises the
            inverse; larger = a looser projection).
        alpha_conv: α of the projection updates of convolutions.
        patches: the input rows of a convolution: ``code`` (patches of the batch-mean
            input map at stride 2, no padding) or ``layer`` (the layer's own stride and
            padding).
        bias: ``augment`` (a bias is an extra column of the weights and is projected with
            them) or ``average`` (biases are averaged plainly).
    """

    step: float = 1.6
    iterations: int = 60
    normalise: bool = False
    shrink: float = 0.5
    alpha_linear: float = 0.01**0.8
    alpha_conv: float = 1e-5**0.8
    patches: Literal["code", "layer"] = "code"
    bias: Literal["augment", "average"] = "augment"

    def validate(self) -> None:
        require(self.step > 0, "step", "> 0", self.step)
        require(self.iterations >= 0, "iterations", ">= 0", self.iterations)
        require(0 < self.shrink <= 1, "shrink", "in (0, 1]", self.shrink)
        for name in ("alpha_linear", "alpha_conv"):
            require(getattr(self, name) > 0, name, "> 0", getattr(self, name))


def projected_layers(model: nn.Module) -> list[tuple[str, nn.Conv2d | nn.Linear]]:
    """The layers MA-Echo projects: every ungrouped convolution and linear layer but the head."""
    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear | nn.Conv2d)
        and name != "head"
        and (not isinstance(m, nn.Conv2d) or m.groups == 1)
    ]


def layer_width(m: nn.Conv2d | nn.Linear, augment: bool) -> int:
    """d: the inputs of one output unit (+1 for the bias column)."""
    d = m.weight[0].numel()
    return d + int(augment and m.bias is not None)


def _rows(m: nn.Conv2d | nn.Linear, x: torch.Tensor, cfg: MAEchoConfig) -> torch.Tensor:
    """The input rows r of one batch: the batch mean (a linear layer), or the patches of the
    batch-mean input map (a convolution)."""
    mean = x.mean(0, keepdim=True)
    if isinstance(m, nn.Linear):
        rows = mean.flatten(1)
    else:
        stride, padding = (2, (0, 0)) if cfg.patches == "code" else (m.stride, m.padding)
        if min(mean.shape[-2:]) < min(m.kernel_size):  # no unpadded patch fits: pad as the layer
            padding = m.padding
        rows = F.unfold(mean, m.kernel_size, m.dilation, padding, stride)[0].T  # type: ignore[arg-type]
    if cfg.bias == "augment" and m.bias is not None:
        rows = torch.cat([rows, torch.ones(len(rows), 1, dtype=rows.dtype, device=rows.device)], 1)
    return rows


def client_projections(
    model: nn.Module, x: torch.Tensor, cfg: MAEchoConfig, rng: torch.Generator
) -> dict[str, torch.Tensor]:
    """P_l for every projected layer from one shuffled pass over ``x`` (batches of 64)."""
    layers = projected_layers(model)
    inputs: dict[str, torch.Tensor] = {}
    hooks = [
        m.register_forward_hook(lambda _m, a, _o, n=name: inputs.__setitem__(n, a[0].detach()))
        for name, m in layers
    ]
    augment = cfg.bias == "augment"
    cpu = torch.device("cpu")  # the recursion runs on the CPU, in float64 (the rows below)
    proj = {
        n: torch.eye(layer_width(m, augment), dtype=torch.float64, device=cpu) for n, m in layers
    }
    model.eval()
    try:
        with torch.no_grad():
            for idx in torch.randperm(len(x), generator=rng).split(64):
                model(x[idx])
                for name, m in layers:
                    alpha = cfg.alpha_linear if isinstance(m, nn.Linear) else cfg.alpha_conv
                    for r in _rows(m, inputs[name].cpu(), cfg).to(torch.float64):
                        proj[name] = projection_update(proj[name], r, cfg.shrink, alpha)
    finally:
        for h in hooks:
            h.remove()
    return {name: p.float() for name, p in proj.items()}


def _matrix(state: Mapping[str, torch.Tensor], name: str, augment: bool) -> torch.Tensor:
    """A layer as F × d: [W | b] (``augment`` and a bias) or W."""
    w = state[f"{name}.weight"].flatten(1)
    b = state.get(f"{name}.bias")
    return torch.cat([w, b[:, None]], dim=1) if augment and b is not None else w


def _class_split_average(
    states: list[dict[str, torch.Tensor]], holds: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The plain average of every tensor, each head row (and bias) over the clients that hold
    its class (all clients for a class nobody holds). In float64, rounded once to the
    tensors' dtype: clients with equal tensors average to exactly that tensor, so that their
    echo steps are exactly 0 (a rounding-size W − W_m would become a step of length λ once
    ``normalise`` scales each row to unit length)."""
    out = {k: torch.stack([s[k].double() for s in states]).mean(0) for k in states[0]}
    weights = holds.double()
    weights[:, weights.sum(0) == 0] = 1.0
    weights = weights / weights.sum(0, keepdim=True)  # [N, C]
    for key in ("head.weight", "head.bias"):
        if key in out:
            stacked = torch.stack([s[key].double() for s in states])  # [N, C, ...]
            shape = (len(states), -1) + (1,) * (stacked.dim() - 2)
            out[key] = (weights.view(shape) * stacked).sum(0)
    return {k: v.to(states[0][k].dtype) for k, v in out.items()}


@register_method("ma_echo", "MA-Echo: iterative null-space projection of same-arch models")
class MAEcho(SendsTrainedModel[MAEchoConfig]):
    """MA-Echo (see the module docs)."""

    cost = (
        "clients: one local training and per-layer projections each (O(N)); server: null-space "
        "projections over n models, O(n·|θ|) an iteration"
    )

    known_limits = (
        KnownLimit(
            "parameter averaging with each head row averaged over the clients that hold its "
            "class (the authors' code): with no echo iterations at all this start is already "
            "far below FedAvg under label skew (digits, Dirichlet 0.1: 12.5% against 49.0%), "
            "and the projections do not recover it; like FedAvg it is below the ensemble",
            below=BOTH,
        ),
    )

    Config = MAEchoConfig
    requires = Requires(same_architecture=True, data_free=True)

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        arrays = [ArraySpec("classes", ("C",), ("float32",), (0.0, 1.0))]
        if len(set(dims.archs)) == 1:
            reference = create_model(
                dims.archs[0], dims.in_channels, dims.num_classes, dims.image_size
            )
            augment = self.config.bias == "augment"
            for name, m in projected_layers(reference):
                d = layer_width(m, augment)
                arrays.append(ArraySpec(f"proj.{name}", (d, d)))
        return PayloadSpec(
            arrays=tuple(arrays),
            models=(ModelSpec(),),
            scalars=(n_examples_spec(),),
        )

    def client_update(self, ctx: ClientContext) -> Payload:
        model = train_model(ctx, ctx.recipe())
        rng = torch_generator(ctx.seed, "ma_echo", ctx.client_id)
        proj = client_projections(model, ctx.data.x.to(ctx.device), self.config, rng)
        counts = torch.bincount(ctx.data.y, minlength=ctx.task.num_classes)
        arrays = {f"proj.{k}": v.numpy() for k, v in proj.items()}
        arrays["classes"] = (counts > 1).float().numpy()
        extra = Payload(arrays, {"n_examples": len(ctx.data)})
        return model_fields(model.cpu()).merged(extra)

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        cfg, ids = self.config, sorted(payloads)
        augment = cfg.bias == "augment"
        models = client_models(payloads, ctx.dims)
        states = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in models]
        holds = torch.stack(
            [torch.from_numpy(np.asarray(payloads[c].arrays["classes"])) > 0.5 for c in ids]
        )
        out = _class_split_average(states, holds)
        layers = projected_layers(models[0])
        device = holds.device  # the payloads' (decoded on the CPU)
        eye = {n: torch.eye(layer_width(m, augment), device=device) for n, m in layers}
        proj = {
            n: [torch.from_numpy(np.asarray(payloads[c].arrays[f"proj.{n}"])) for c in ids]
            for n, _ in layers
        }
        clients = {n: [_matrix(s, n, augment) for s in states] for n, _ in layers}
        consensus = {n: _matrix(out, n, augment) for n, _ in layers}
        for _ in range(cfg.iterations):
            for n, _ in layers:
                consensus[n], clients[n] = ma_echo_consensus_step(
                    consensus[n], clients[n], proj[n], eye[n], cfg.step, cfg.normalise
                )
        for n, m in layers:
            for state, w in zip(states, clients[n], strict=True):
                cols = m.weight[0].numel()
                state[f"{n}.weight"] = w[:, :cols].reshape(m.weight.shape)
                if augment and m.bias is not None:
                    state[f"{n}.bias"] = w[:, cols]
        model = models[0]
        model.load_state_dict(_class_split_average(states, holds))
        info = {"iterations": cfg.iterations, "layers": [n for n, _ in layers]}
        return GlobalModel(model.eval(), info)
