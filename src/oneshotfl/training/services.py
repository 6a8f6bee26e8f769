"""The services a client's method uses, offered by the training layer.

A client's context (:class:`oneshotfl.protocol.contract.ClientContext`) is data: its shard,
the public facts, its training settings and handles to its services — its scoped view of the
artefact store (:mod:`oneshotfl.training.artefacts`), the progress tracker and the shared
frozen encoder (:mod:`oneshotfl.training.encoder`). What acts on them lives here:

* :func:`train_model` — the model a :class:`~oneshotfl.training.recipe.ClientRecipe` trains
  on the client's data: trained once, then a cache hit, for every method of a run (and of a
  sweep, with a disk cache) that asks for the same recipe;
* :func:`client_artefact` — any other per-client artefact (FedAGE's head on embeddings,
  FedKT's students, FedCVAE's decoder), keyed by its parts and everything client-specific.

Both take any context that has the fields of :class:`ClientSide`; the training layer knows
no method contract. This module is also where the method contract takes the types of the
services a context hands out (:class:`ArtefactStore`, :class:`Encoder`, :class:`Tracker`),
so the protocol reaches the training layer through its services and its settings
(``TrainConfig``, ``ClientRecipe``) only. A trained model is cached as its state arrays
(:mod:`oneshotfl.models.state`), not in the wire's encoding: a model crosses the wire encoding
once, when the method puts it into its payload.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import torch
from torch import nn

from oneshotfl.data.types import LabelledData, TaskInfo
from oneshotfl.models.state import model_from_state, model_state
from oneshotfl.payload import Payload
from oneshotfl.training.artefacts import ArtefactStore
from oneshotfl.training.encoder import Encoder
from oneshotfl.training.loop import TrainConfig
from oneshotfl.training.progress import NullTracker, Tracker
from oneshotfl.training.recipe import ClientRecipe, train_recipe


class ClientSide(Protocol):
    """What the client services read from a client's context."""

    @property
    def client_id(self) -> int: ...

    @property
    def data(self) -> LabelledData: ...

    @property
    def task(self) -> TaskInfo: ...

    @property
    def seed(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def store(self) -> ArtefactStore: ...

    @property
    def tracker(self) -> Tracker: ...

    @property
    def train_config(self) -> TrainConfig: ...

    @property
    def data_fingerprint(self) -> str: ...


def artefact_key(ctx: ClientSide, parts: Mapping[str, object]) -> dict[str, object]:
    """The key of client ``ctx``'s artefact: ``parts`` plus everything client-specific (data,
    task, seed, id, initialisation)."""
    return {
        "parts": dict(parts),  # nested: a part can never shadow the client's own keys
        "data": ctx.data_fingerprint,
        "task": [ctx.task.num_classes, ctx.task.in_channels, ctx.task.image_size],
        "seed": ctx.seed,
        "client": ctx.client_id,
        "init": ctx.train_config.init,  # a model trained here starts from it (heads, students)
    }


def client_artefact(
    ctx: ClientSide,
    kind: str,
    parts: Mapping[str, object],
    make: Callable[[], Payload],
    label: str,
) -> Payload:
    """Client ``ctx``'s artefact ``kind`` keyed by ``parts`` plus everything client-specific
    (:func:`artefact_key`): computed by ``make()`` once, then a cache hit."""
    key = artefact_key(ctx, parts)
    payload, _ = ctx.store.get_or_make(kind, key, make, f"client {ctx.client_id} {label}")
    return payload


def _model_payload(
    model: nn.Module, seconds: float, steps: int, facts: Mapping[str, float]
) -> Payload:
    arrays, arch = model_state(model.cpu())
    info = {"train_seconds": seconds, "steps": steps}
    return Payload(arrays, {"model.arch": arch, **info, **facts})


def model_ready(ctx: ClientSide, recipe: ClientRecipe) -> bool:
    """Whether :func:`train_model` of ``recipe`` on ``ctx`` would train nothing now."""
    return ctx.store.has("local_model", artefact_key(ctx, {"recipe": recipe.key()}))


def offer_model(
    ctx: ClientSide, recipe: ClientRecipe, model: nn.Module, steps: int, seconds: float
) -> None:
    """Hand ``ctx``'s store the model ``recipe`` trained elsewhere (with other clients, in
    ``seconds`` of this client's share): :func:`train_model` then takes it instead of
    training."""
    key = artefact_key(ctx, {"recipe": recipe.key()})
    ctx.store.offer("local_model", key, _model_payload(model, seconds, steps, {}), seconds)


def train_model(ctx: ClientSide, recipe: ClientRecipe) -> nn.Module:
    """The model ``recipe`` trains on client ``ctx``'s data — trained once, then a cache hit;
    returned on the client's device in eval mode."""

    def make() -> Payload:
        done = train_recipe(
            recipe,
            ctx.data,
            ctx.task,
            seed=ctx.seed,
            client_id=ctx.client_id,
            device=ctx.device,
            tracker=ctx.tracker,
        )
        return _model_payload(done.model, done.stats.seconds, done.stats.steps, done.facts)

    payload = client_artefact(ctx, "local_model", {"recipe": recipe.key()}, make, recipe.name)
    task = ctx.task
    model = model_from_state(
        str(payload.scalars["model.arch"]),
        payload.arrays,
        task.in_channels,
        task.num_classes + recipe.extra_outputs,
        task.image_size,
    )
    return model.to(ctx.device).eval()


__all__ = [
    "ArtefactStore",
    "ClientSide",
    "Encoder",
    "NullTracker",
    "Tracker",
    "artefact_key",
    "client_artefact",
    "model_ready",
    "offer_model",
    "train_model",
]
