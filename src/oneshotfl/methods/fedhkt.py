"""FedHKT's client→server transfer: Deng et al., "A Hierarchical Knowledge Transfer Framework
for Heterogeneous Federated Learning" (IEEE INFOCOM 2023), in the one-shot form FedOL compares
against.

Clients send softmax predictions on the public pool; the server weights each client's
knowledge per sample by its confidence, λ_k(x) = softmax_k(−H(p_k(x))) (the weighting FedOL's
Eq. 14 takes from FedHKT), and distils Σ_k λ_k(x)·KL(p_k(x) ‖ σ(w_s(x))) into the server model.

Deviations and choices: FedHKT's later server→client transfer needs more rounds and is not
part of the one-shot form; the server trains for ``epochs`` (None = ``server_epochs``) with the
server training config and no validation-based stopping (the server has no labelled data).
This is FedOL's distillation term alone (τ = 0, one iteration), so the two share their math.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from oneshotfl.federation.contract import ClientContext, Method, Requires, ServerContext
from oneshotfl.federation.outcome import GlobalModel, Outcome
from oneshotfl.federation.payload import Payload
from oneshotfl.federation.spec import PayloadSpec, WireDims
from oneshotfl.methods.base import register_method
from oneshotfl.methods.fedol import (
    client_weights,
    distillation_target,
    fedol_loss,
    stack_probabilities,
)
from oneshotfl.methods.recipes import (
    initial_model,
    probabilities_payload,
    probabilities_spec,
)
from oneshotfl.seeding import torch_generator
from oneshotfl.training.loop import Batch, fit


@dataclass(frozen=True)
class FedHKTConfig:
    """FedHKT hyper-parameters.

    Attributes:
        epochs: server distillation epochs (None = ``server_epochs``).
        temperature: softmax temperature of the client predictions.
        payload_dtype: float32 or float16 predictions on the wire.
    """

    epochs: int | None = None
    temperature: float = 1.0
    payload_dtype: Literal["float32", "float16"] = "float32"

    def __post_init__(self) -> None:
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"epochs: expected >= 1 or None, got {self.epochs}")
        if not self.temperature > 0:
            raise ValueError(f"temperature: expected > 0, got {self.temperature}")
        if self.payload_dtype not in ("float32", "float16"):
            raise ValueError(f"payload_dtype: expected float32|float16, got {self.payload_dtype}")


@register_method("fedhkt", "FedHKT: entropy-weighted per-sample KD of client predictions")
class FedHKT(Method[FedHKTConfig]):
    """Confidence-weighted knowledge transfer from client predictions to a server model."""

    Config = FedHKTConfig
    requires = Requires(public_data=True, server_model=True)

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        return probabilities_spec(self.config.payload_dtype)

    def client_update(self, ctx: ClientContext) -> Payload:
        return probabilities_payload(ctx, self.config.temperature, self.config.payload_dtype)

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        if ctx.public is None or ctx.server_arch is None:
            raise ValueError("fedhkt needs a public pool and a server_model")
        probs = stack_probabilities(payloads)
        mixture, const = distillation_target(probs, client_weights(probs, "entropy"))
        no_labels = torch.zeros_like(mixture)
        base = ctx.train_config
        cfg = dataclasses.replace(base, epochs=self.config.epochs or base.epochs)
        server = initial_model(ctx.server_arch, ctx.task, ctx.seed)

        def loss_fn(model: nn.Module, batch: Batch) -> torch.Tensor:
            x, m, c, y = batch
            return fedol_loss(model(x), m, c, y, tau=0.0)

        fit(
            server,
            (ctx.public.x, mixture, const, no_labels),
            loss_fn,
            cfg,
            torch_generator(ctx.seed, "fedhkt"),
            ctx.device,
            ctx.tracker,
            "fedhkt server",
        )
        return GlobalModel(server.eval())
