"""FedHKT's client→server transfer: Deng et al., "A Hierarchical Knowledge Transfer Framework
for Heterogeneous Federated Learning" (IEEE INFOCOM 2023), in the one-shot form FedOL compares
against.

Clients send softmax predictions on the public pool; the server weights each client's
knowledge per sample by its confidence, λ_k(x) = softmax_k(−H(p_k(x))) (the weighting FedOL's
Eq. 14 takes from FedHKT), and distils Σ_k λ_k(x)·KL(p_k(x) ‖ σ(w_s(x))) into the server model.

Deviations and choices: FedHKT's later server→client transfer needs more rounds and is not
part of the one-shot form; the server trains for ``epochs`` (None = ``server_epochs``) with the
server training config and no validation-based stopping (the server has no labelled data).
This is FedOL's distillation term alone (τ = 0, one iteration): both use
:func:`oneshotfl.functional.weighted_mixture` and :func:`~oneshotfl.functional.weighted_kl_rows`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch.nn.functional as F

from oneshotfl.functional import entropy_weights, weighted_kl_rows, weighted_mixture
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
from oneshotfl.seeding import torch_generator
from oneshotfl.training.distill import distil


@dataclass(frozen=True)
class FedHKTConfig(Params):
    """FedHKT hyper-parameters.

    Attributes:
        epochs: server distillation epochs (None = ``server_epochs``).
        temperature: softmax temperature of the client predictions.
        payload_dtype: float32 or float16 predictions on the wire.
    """

    epochs: int | None = None
    temperature: float = 1.0
    payload_dtype: Literal["float32", "float16"] = "float32"

    def validate(self) -> None:
        require(self.epochs is None or self.epochs >= 1, "epochs", ">= 1 or None", self.epochs)
        require(self.temperature > 0, "temperature", "> 0", self.temperature)


@register_method("fedhkt", "FedHKT: entropy-weighted per-sample KD of client predictions")
class FedHKT(SharesPredictions[FedHKTConfig]):
    """Confidence-weighted knowledge transfer from client predictions to a server model."""

    known_limits = (STUDENT_LIMIT,)

    Config = FedHKTConfig
    requires = Requires(public_data=True, server_model=True)

    def prediction_format(self) -> tuple[float, str]:
        return self.config.temperature, self.config.payload_dtype

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        if ctx.public is None or ctx.server_arch is None:
            raise ValueError("fedhkt needs a public pool and a server_model")
        probs = stack_probabilities(payloads)
        mixture, const = weighted_mixture(probs, entropy_weights(probs, "entropy"))
        base = ctx.train_config
        server = shared_initial_model(ctx)
        distil(
            server,
            ctx.public.x,
            lambda logits, m, c: weighted_kl_rows(F.log_softmax(logits, dim=-1), m, c),
            dataclasses.replace(base, epochs=self.config.epochs or base.epochs),
            torch_generator(ctx.seed, "fedhkt"),
            ctx.device,
            targets=(mixture, const),
            tracker=ctx.tracker,
            description="fedhkt server",
        )
        return GlobalModel(server.eval())
