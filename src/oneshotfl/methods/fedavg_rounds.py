"""Multi-round FedAvg, McMahan et al. (2017), "Communication-Efficient Learning of Deep
Networks from Decentralized Data" (AISTATS) — a reference that is **not one-shot**.

FedOL's Fig. 2 compares one-shot methods with baselines run for several rounds; this method
draws that comparison. Each round r = 0 … R−1:

1. the server broadcasts the current global model (round 0: the shared initialisation);
2. every client starts from it, trains ``local_epochs`` on its data with the client
   training config, and sends back its weights and example count n_k;
3. the server averages them, Σ_k (n_k/n)·w_k (the same :func:`weighted_average` as one-shot
   FedAvg), which becomes the next global model.

The runner counts every round's upload and the broadcast's size, and records the test
accuracy after every round (``rounds_history``). Full participation, no client sampling,
no server learning rate or momentum.

Choices: ``local_epochs`` (None = the client training config's epochs, after the
``local_steps`` floor; a number runs exactly that many epochs per round). When it equals the
client epochs, round 0 is exactly one-shot FedAvg and reuses its cached client models; later
rounds are not cached (they depend on the previous global model).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from torch import nn

from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import shared_initial_model
from oneshotfl.methods.common import SKEW, SendsTrainedModel
from oneshotfl.methods.folds import ModelAverage
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, Requires, ServerContext
from oneshotfl.protocol.fields import model_fields, model_from_fields
from oneshotfl.protocol.fold import Fold, fold_all
from oneshotfl.protocol.limits import KnownLimit
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.protocol.spec import ModelSpec, PayloadSpec, WireDims
from oneshotfl.seeding import torch_generator
from oneshotfl.training.loop import train_classifier
from oneshotfl.training.services import train_model


@dataclass(frozen=True)
class FedAvgRoundsConfig(Params):
    """Multi-round FedAvg hyper-parameters.

    Attributes:
        rounds: communication rounds R (>= 1).
        local_epochs: local epochs per round (None = the client training config's epochs).
    """

    rounds: int = 10
    local_epochs: int | None = None

    def validate(self) -> None:
        require(self.rounds >= 1, "rounds", ">= 1", self.rounds)
        ok = self.local_epochs is None or self.local_epochs >= 1
        require(ok, "local_epochs", ">= 1 or None", self.local_epochs)


@register_method(
    "fedavg_rounds", "NOT one-shot: R rounds of FedAvg (reference for accuracy vs rounds)"
)
class FedAvgRounds(SendsTrainedModel[FedAvgRoundsConfig]):
    """R rounds of FedAvg with full participation; every round's bytes are counted."""

    cost = (
        "R rounds of n local trainings (O(R·N)) and R averages (O(R·n·|θ|), each folded as "
        "the models arrive)"
    )

    known_limits = (
        KnownLimit(
            "a few rounds of FedAvg (3 in the matrix) under label skew: each round's local "
            "training drifts towards the client's classes, so the average stays below the "
            "ensemble of one-shot models until many more rounds have passed",
            partitions=SKEW,
        ),
    )

    Config = FedAvgRoundsConfig
    requires = Requires(same_architecture=True)

    def num_rounds(self) -> int:
        return self.config.rounds

    def broadcast_spec(self, dims: WireDims, round_index: int) -> PayloadSpec:
        return PayloadSpec(models=(ModelSpec(),))

    def server_message(
        self, round_index: int, previous: Outcome | None, ctx: ServerContext
    ) -> Payload:
        if previous is None:
            if len(set(ctx.client_archs)) != 1:
                raise ValueError(
                    "fedavg_rounds: expected one client architecture, "
                    f"got {sorted(set(ctx.client_archs))}"
                )
            model = shared_initial_model(ctx, ctx.client_archs[0])
        elif isinstance(previous, GlobalModel):
            model = previous.model
        else:
            raise TypeError(f"fedavg_rounds: expected a GlobalModel, got {previous!r}")
        return model_fields(model.cpu())

    def client_update(self, ctx: ClientContext) -> Payload:
        epochs = self.config.local_epochs or ctx.train_config.epochs
        if ctx.round == 0 and epochs == ctx.train_config.epochs:
            model = train_model(ctx, ctx.recipe())  # exactly one-shot FedAvg's client (cached)
        else:
            if ctx.broadcast is None:
                raise ValueError("fedavg_rounds: a client got no global model to start from")
            model = model_from_fields(ctx.broadcast, ctx.dims).to(ctx.device)
            train_classifier(
                model,
                ctx.data,
                dataclasses.replace(ctx.train_config, epochs=epochs, min_steps=0),
                torch_generator(ctx.seed, "client", ctx.client_id, "fedavg_rounds", ctx.round),
                ctx.device,
                tracker=ctx.tracker,
                description=f"client {ctx.client_id} round {ctx.round + 1}",
            )
        return model_fields(model.cpu()).merged(Payload({}, {"n_examples": len(ctx.data)}))

    def local_model(self, ctx: ClientContext) -> nn.Module | None:
        """None: a client's model changes every round; there is no one local model."""
        return None

    def fold(self, ctx: ServerContext) -> Fold:
        """Each round's average, folded as the models arrive."""
        return ModelAverage(ctx.dims)

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        return fold_all(self.fold(ctx), payloads)
