"""Local training only: the no-collaboration reference.

Each client trains on its own data and keeps its model. Nothing is communicated: the payload
only carries the model to the evaluator and is counted as zero upload bytes. The evaluator
reports the mean, best and worst client on the global test set (the best one is an oracle
pick on test, reported as in FedOL's Table I, never used to choose a model).
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import client_models
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, Method, NoConfig, ServerContext
from oneshotfl.protocol.fields import model_fields
from oneshotfl.protocol.outcome import Outcome, Personalised
from oneshotfl.protocol.spec import ModelSpec, PayloadSpec, WireDims
from oneshotfl.training.recipe import ClientRecipe
from oneshotfl.training.services import train_model


@register_method("local", "each client's own model on the global test set (mean/best/worst)")
class Local(Method[NoConfig]):
    """Local training without collaboration."""

    cost = (
        "clients: one local training each (O(N)); evaluation: n personal models on the test "
        "split (O(n·|test|))"
    )

    communicates = False

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        return PayloadSpec(models=(ModelSpec(),))

    def client_update(self, ctx: ClientContext) -> Payload:
        return model_fields(train_model(ctx, ctx.recipe()).cpu())

    def local_model(self, ctx: ClientContext) -> nn.Module:
        return train_model(ctx, ctx.recipe())

    def client_recipe(self, ctx: ClientContext) -> ClientRecipe:
        return ctx.recipe()

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        models = client_models(payloads, ctx.dims)
        return Personalised(dict(zip(sorted(payloads), models, strict=True)))
