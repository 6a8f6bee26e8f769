"""The models a method builds: fresh ones from the run's context, and the client models a
receiver rebuilds from the payloads it got.

Every run-wide setting of a fresh model (the task's shapes, the model seed, the
initialisation ``train_config.init``) is read from the context here, so a method names only
what is its own: the architecture, and the seed stream of a model that is not the shared
initialisation.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from oneshotfl.data.types import LabelledData
from oneshotfl.models import create_model
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, ServerContext
from oneshotfl.protocol.fields import model_fields, model_from_fields
from oneshotfl.protocol.spec import WireDims
from oneshotfl.seeding import seeded_torch, torch_generator
from oneshotfl.training.loop import TrainConfig, predict_logits, train_classifier
from oneshotfl.training.recipe import initial_model

__all__ = [
    "client_logits",
    "client_models",
    "initial_model_parts",
    "seeded_head",
    "seeded_model",
    "shared_initial_model",
    "trained_on_examples",
    "union_arch",
]

Context = ClientContext | ServerContext


def _own_arch(ctx: Context) -> str:
    """The context's own architecture: the client's on a :class:`ClientContext`, the
    server's on a :class:`ServerContext`.

    Raises:
        ValueError: on a server context without a server architecture.
    """
    if isinstance(ctx, ClientContext):
        return ctx.arch
    if ctx.server_arch is None:
        raise ValueError("expected a server architecture: set server_model")
    return ctx.server_arch


def shared_initial_model(
    ctx: Context, arch: str | None = None, extra_outputs: int = 0
) -> nn.Module:
    """The run's shared initialisation of ``arch`` with ``extra_outputs`` outputs beyond the
    task's classes: the model every party with that architecture starts from
    (:func:`~oneshotfl.training.recipe.initial_model` with the context's task, model seed and
    ``train_config.init``). ``arch`` defaults to the context's own: the client's on a
    :class:`ClientContext`, the server's on a :class:`ServerContext`.

    Raises:
        ValueError: for the server's own architecture where none is configured.
    """
    return initial_model(
        arch or _own_arch(ctx), ctx.task, ctx.seed, extra_outputs, init=ctx.train_config.init
    )


def initial_model_parts(ctx: Context, arch: str | None = None) -> dict[str, object]:
    """Everything :func:`shared_initial_model` ``(ctx, arch)`` depends on, as parts of an
    artefact key (a model trained from it is keyed by them and what it was trained on)."""
    task = ctx.task
    return {
        "arch": arch or _own_arch(ctx),
        "seed": ctx.seed,
        "init": ctx.train_config.init,
        "task": [task.num_classes, task.in_channels, task.image_size],
    }


def seeded_model(ctx: Context, *stream: object, arch: str | None = None) -> nn.Module:
    """A fresh image classifier ``arch`` (default: the context's own, as in
    :func:`shared_initial_model`) for the context's task, drawn from the model seed's
    ``stream`` rather than the shared initialisation's, with the run's initialisation."""
    task, name = ctx.task, arch or _own_arch(ctx)
    with seeded_torch(ctx.seed, *stream):
        return create_model(
            name, task.in_channels, task.num_classes, task.image_size, ctx.train_config.init
        )


def seeded_head(ctx: Context, arch: str, dim: int, *stream: object) -> nn.Module:
    """A fresh head ``arch`` on ``dim``-dimensional embeddings with one output per class,
    drawn from the model seed's ``stream`` with the run's initialisation."""
    with seeded_torch(ctx.seed, *stream):
        return create_model(arch, dim, ctx.task.num_classes, 1, ctx.train_config.init)


def client_models(
    payloads: Mapping[int, Payload],
    dims: WireDims,
    *,
    prefix: str = "model",
    extra_outputs: int = 0,
    device: torch.device | None = None,
) -> list[nn.Module]:
    """The model each payload carries under ``prefix`` (with ``extra_outputs`` beyond the
    classes), rebuilt in client-id order, in eval mode, on ``device`` (default: where they
    were rebuilt, the CPU): the members of an ensemble or teacher."""
    models = [model_from_fields(payloads[c], dims, prefix, extra_outputs) for c in sorted(payloads)]
    if device is not None:
        models = [m.to(device) for m in models]
    return [m.eval() for m in models]


def client_logits(
    payloads: Mapping[int, Payload],
    dims: WireDims,
    x: torch.Tensor,
    device: torch.device,
    prefix: str = "model",
) -> torch.Tensor:
    """The logits on ``x`` of every payload's model (:func:`client_models`), in client-id
    order: ``[K, N, C]`` on the CPU."""
    models = client_models(payloads, dims, prefix=prefix)
    return torch.stack([predict_logits(m, x, device) for m in models])


def union_arch(ctx: ServerContext, method: str, arch: str | None) -> str:
    """The architecture a server trains on examples it received: ``arch`` if given, else the
    clients' when they all share one, else the configured server model.

    Raises:
        ValueError: for clients of several architectures and no server model.
    """
    if arch is not None:
        return arch
    if len(set(ctx.client_archs)) == 1:
        return ctx.client_archs[0]
    if ctx.server_arch is not None:
        return ctx.server_arch
    raise ValueError(
        f"{method}: clients use several architectures {sorted(set(ctx.client_archs))}; "
        "expected arch=NAME or a server_model"
    )


def trained_on_examples(
    ctx: ServerContext,
    arch: str,
    data: LabelledData,
    digest: str,
    train: TrainConfig,
    stream: tuple[str, str],
    kind: str,
) -> nn.Module:
    """A model of ``arch`` from the run's shared initialisation trained on ``data`` (whose
    content ``digest`` names) with ``train`` and the seed stream ``stream``, cached as artefact
    ``kind`` under everything it depends on."""

    def make() -> Payload:
        model = shared_initial_model(ctx, arch)
        train_classifier(
            model,
            data,
            train,
            torch_generator(ctx.seed, *stream),
            ctx.device,
            tracker=ctx.tracker,
            description=f"{stream[0]} ({arch}, {len(data)} examples)",
        )
        return model_fields(model.cpu())

    parts = {"data": digest, "train": train.as_dict(), **initial_model_parts(ctx, arch)}
    payload, _ = ctx.store.get_or_make(kind, parts, make, f"{stream[0]} model")
    return model_from_fields(payload, ctx.dims)
