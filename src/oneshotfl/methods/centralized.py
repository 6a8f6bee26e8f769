"""Centralised training: the upper bound every federated method is measured against.

Written honestly as a "method" whose clients upload their raw data (the payload is the data,
and its bytes are counted as such); the server trains one model on the union with the same
training settings the clients use. The union is put in a canonical order (by a hash of each
example) before training, so the result depends on the set of examples, not on how a
partitioner dealt them out — and the trained model is cached under that set's hash, so a
sweep over partitions of the same pool trains it once per seed.

Budget: the clients' epochs, and a step floor of the clients' ``local_steps`` times the number
of clients (:func:`union_budget`) — the optimiser steps the federation spent together, so on
small data, where the floor sets the budget, the union gets as many passes over each example
as a client had over its shard (one client's 300 steps over five clients' data would be a fifth
of that, and the bound would fall below the ensemble it bounds). Where the epochs already
exceed the floor (Fashion-MNIST at full size) nothing changes.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from oneshotfl.data.types import LabelledData
from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import trained_on_examples, union_arch
from oneshotfl.params import Params, is_int, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, Method, ServerContext
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.protocol.spec import ArraySpec, PayloadSpec, WireDims
from oneshotfl.training.loop import TrainConfig


@dataclass(frozen=True)
class CentralizedConfig(Params):
    """Centralised-training hyper-parameters.

    Attributes:
        arch: the model; ``None`` means the clients' architecture when they all share one,
            else the configured server model.
        epochs: passes over the union; ``None`` means the clients' ``local_epochs`` (a union
            of n shards is n times a client's data, so fewer passes still take more steps
            than any client did: the demo's budget sets 2 against the clients' 3).
    """

    arch: str | None = None
    epochs: int | None = None

    def validate(self) -> None:
        require(self.epochs is None or is_int(self.epochs, 1), "epochs", "an int >= 1", self.epochs)


def union_budget(client: TrainConfig, clients: int, epochs: int | None = None) -> TrainConfig:
    """The clients' training settings for the union of ``clients`` clients' data: the step
    floor multiplied by the number of clients (see the module docs), and ``epochs`` passes
    where given."""
    union = dataclasses.replace(client, min_steps=client.min_steps * max(1, clients))
    return union if epochs is None else dataclasses.replace(union, epochs=epochs)


def canonical_order(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, str]:
    """A permutation sorting examples by a hash of their bytes, and a hash of the whole set."""
    rows = x.reshape(len(x), -1)
    digests = [
        hashlib.blake2b(rows[i].tobytes() + y[i].tobytes(), digest_size=16).digest()
        for i in range(len(x))
    ]
    order = np.array(sorted(range(len(x)), key=digests.__getitem__), dtype=np.int64)
    whole = hashlib.sha256(b"".join(digests[i] for i in order)).hexdigest()
    return order, whole


@register_method("centralized", "upper bound: one model trained on the union of client data")
class Centralized(Method[CentralizedConfig]):
    """Pooled-data training (not federated; the reference upper bound)."""

    cost = (
        "one model trained on the union (O(N), independent of n; the step floor scales with n "
        "up to local_floor_epochs)"
    )

    Config = CentralizedConfig

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        return PayloadSpec(
            arrays=(
                ArraySpec("x", ("N", "CH", "H", "W")),
                ArraySpec("y", ("N",), ("int64",), value_range=(0, dims.num_classes - 1)),
            )
        )

    def client_update(self, ctx: ClientContext) -> Payload:
        return Payload({"x": ctx.data.x.numpy(), "y": ctx.data.y.numpy()})

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        arch = union_arch(ctx, "centralized", self.config.arch)
        x = np.concatenate([payloads[c].arrays["x"] for c in sorted(payloads)])
        y = np.concatenate([payloads[c].arrays["y"] for c in sorted(payloads)])
        order, set_hash = canonical_order(x, y)
        data = LabelledData(torch.from_numpy(x[order]), torch.from_numpy(y[order]))
        train = union_budget(ctx.client_train_config, len(payloads), self.config.epochs)
        model = trained_on_examples(
            ctx, arch, data, set_hash, train, ("centralized", "train"), "centralized"
        )
        return GlobalModel(model)
