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

import sys
from collections.abc import Callable, Mapping
from typing import Protocol

import torch
from torch import nn

from oneshotfl.data.types import LabelledData, TaskInfo
from oneshotfl.models.base import concrete, on_device
from oneshotfl.models.state import model_state
from oneshotfl.payload import Payload
from oneshotfl.training.artefacts import ArtefactStore, cache_key
from oneshotfl.training.encoder import Encoder
from oneshotfl.training.loop import TrainConfig
from oneshotfl.training.progress import NullTracker, Tracker
from oneshotfl.training.recipe import (
    ClientRecipe,
    as_built,
    module_from_state,
    recycle,
    train_recipe,
)


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
    arrays, arch = model_state(on_device(model, "cpu"))
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
    returned on the client's device in eval mode.

    No module is built where one can be handed back: on a miss the module just trained (its
    gradients dropped, every parameter trainable, as one built from the cached state), and
    on the next call for the same model, as long as nobody changed it (:class:`_Handed`), the
    module handed out last — a method's ``client_update`` and its ``local_model`` share it."""
    trained: list[nn.Module] = []

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
        trained.append(done.model)
        return _model_payload(done.model, done.stats.seconds, done.stats.steps, done.facts)

    parts = {"recipe": recipe.key()}
    payload = client_artefact(ctx, "local_model", parts, make, recipe.name)
    key = (ctx.store.scope, cache_key({"kind": "local_model", **artefact_key(ctx, parts)}))
    if trained:
        model = as_built(trained[0])
    else:
        handed = _HANDED.get(key, ctx.device)
        if handed is not None:
            return handed
        task = ctx.task
        model = module_from_state(
            str(payload.scalars["model.arch"]),
            payload.arrays,
            task.in_channels,
            task.num_classes + recipe.extra_outputs,
            task.image_size,
        )
    model = on_device(model, ctx.device).eval()
    _HANDED.put(key, model)
    return model


class _Handed:
    """The modules :func:`train_model` handed out last (a few, by party and artefact key),
    each with the signature of its tensors — identity, storage, in-place version counter and
    ``requires_grad`` — and modes when handed out. A module comes back only when this memo
    is its last holder (no caller can change it any more), its signature is unchanged and it
    has no gradients: what a caller gets is what a build would give."""

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self.entries: dict[tuple[str, str], tuple[nn.Module, tuple[object, ...]]] = {}

    @staticmethod
    def signature(model: nn.Module) -> tuple[object, ...]:
        tensors = [*model.parameters(), *model.buffers()]
        return (
            tuple((id(t), t.data_ptr(), t._version, t.requires_grad, t.device) for t in tensors),
            tuple(m.training for m in model.modules()),
        )

    def get(self, key: tuple[str, str], device: torch.device) -> nn.Module | None:
        entry = self.entries.get(key)
        # referenced by the entry and by getrefcount's argument alone: nobody else holds it
        if entry is None or sys.getrefcount(entry[0]) > 2:
            return None
        model, signature = entry
        want = concrete(device)
        unchanged = self.signature(model) == signature and all(
            p.grad is None and p.device == want for p in model.parameters()
        )
        return model if unchanged else None

    def put(self, key: tuple[str, str], model: nn.Module) -> None:
        old = self.entries.pop(key, None)
        if old is not None and old[0] is not model:
            self._drop(old)
        if len(self.entries) >= self.size:
            self._drop(self.entries.pop(next(iter(self.entries))))
        self.entries[key] = (model, self.signature(model))

    @staticmethod
    def _drop(entry: tuple[nn.Module, tuple[object, ...]]) -> None:
        """A module leaving the memo goes to :func:`recycle` when nobody else holds it."""
        if sys.getrefcount(entry[0]) <= 2:  # the entry and getrefcount's argument
            recycle(entry[0])


_HANDED = _Handed()


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
