"""Client recipes shared by many methods: build the shared initial model, train it locally.

A recipe's result is cached in the :class:`~oneshotfl.federation.artefacts.ArtefactStore`
under a key of everything that determines it, so every method in a sweep that needs "the
client's locally trained model" gets the same one, trained once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from oneshotfl.federation.contract import ClientContext, ConfigT, Method, TaskInfo
from oneshotfl.federation.payload import Payload
from oneshotfl.federation.spec import (
    ArraySpec,
    ModelSpec,
    PayloadSpec,
    ScalarSpec,
    WireDims,
    model_fields,
    model_from_fields,
)
from oneshotfl.models import create_model
from oneshotfl.seeding import seeded_torch, torch_generator
from oneshotfl.training.loop import predict_logits, train_classifier

Regulariser = Callable[[nn.Module], torch.Tensor]


def initial_model(arch: str, task: TaskInfo, seed: int, extra_outputs: int = 0) -> nn.Module:
    """The shared initialisation of ``arch``: the same for every client with that architecture.

    One-shot FedAvg and FedProx assume the server broadcast one initial model; deriving it
    from the model seed and the architecture name gives every party the same weights.
    """
    with seeded_torch(seed, "init", arch, extra_outputs):
        return create_model(
            arch, task.in_channels, task.num_classes + extra_outputs, task.image_size
        )


def trained_local_model(
    ctx: ClientContext,
    recipe: str = "erm",
    make_regulariser: Callable[[nn.Module], Regulariser] | None = None,
    recipe_params: Mapping[str, object] | None = None,
) -> nn.Module:
    """The client's model trained on its own data (cached).

    Args:
        ctx: the client's context.
        recipe: name of the training recipe (part of the cache key).
        make_regulariser: given the initial model, returns a penalty added to the loss
            (e.g. FedProx's proximal term).
        recipe_params: the recipe's hyper-parameters (part of the cache key).
    """
    parts = {
        "recipe": recipe,
        "recipe_params": dict(recipe_params or {}),
        "data": ctx.data_fingerprint,
        "arch": ctx.arch,
        "task": [ctx.task.num_classes, ctx.task.in_channels, ctx.task.image_size],
        "train": ctx.train_config.as_dict(),
        "seed": ctx.seed,
        "client": ctx.client_id,
    }

    def make() -> Payload:
        model = initial_model(ctx.arch, ctx.task, ctx.seed)
        regulariser = None if make_regulariser is None else make_regulariser(model)
        stats = train_classifier(
            model,
            ctx.data,
            ctx.train_config,
            torch_generator(ctx.seed, "client", ctx.client_id, "train", recipe),
            ctx.device,
            regulariser=regulariser,
            tracker=ctx.tracker,
            description=f"client {ctx.client_id} {recipe} ({ctx.arch})",
        )
        info = {"train_seconds": stats.seconds, "steps": stats.steps}
        return model_fields(model.cpu()).merged(Payload({}, info))

    payload, hit = ctx.store.get_or_make(
        "local_model", parts, make, label=f"client {ctx.client_id} {recipe} model"
    )
    ctx.notes["train_seconds"] = float(payload.scalars.get("train_seconds", 0.0))
    ctx.notes["cache_hit"] = hit
    model = model_from_fields(payload, ctx.task.dims())
    return model.to(ctx.device).eval()


def public_probabilities(
    model: nn.Module, ctx: ClientContext, temperature: float = 1.0
) -> torch.Tensor:
    """softmax(f(x)/T) of a client model on the public pool, ``[N_pub, C]`` float32 on CPU.

    Raises:
        ValueError: when the federation has no public pool.
    """
    if ctx.public is None:
        raise ValueError("this method needs a public pool: set public_size > 0")
    logits = predict_logits(model, ctx.public.x, ctx.device)
    return torch.softmax(logits / temperature, dim=-1)


def probabilities_payload(
    ctx: ClientContext, temperature: float = 1.0, dtype: str = "float32"
) -> Payload:
    """The prediction-sharing message: the client's locally trained model (cached recipe),
    softmax(f(x)/T) on the public pool, sent as ``probs`` in ``dtype``."""
    probs = public_probabilities(trained_local_model(ctx), ctx, temperature)
    return Payload({"probs": probs.numpy().astype(dtype)})


def probabilities_spec(dtype: str = "float32", name: str = "probs") -> PayloadSpec:
    """One ``[N_pub, C]`` array of probability rows (the prediction-sharing message)."""
    return PayloadSpec(arrays=(ArraySpec(name, ("N_pub", "C"), (dtype,), (0.0, 1.0), True),))


class SendsTrainedModel(Method[ConfigT]):
    """The client half shared by model-sharing methods (FedAvg, the ensemble, …): train
    locally with the shared recipe, send the model and the example count n_k."""

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        return PayloadSpec(models=(ModelSpec(),), scalars=(ScalarSpec("n_examples", int, 1),))

    def client_update(self, ctx: ClientContext) -> Payload:
        model = trained_local_model(ctx)
        return model_fields(model.cpu()).merged(Payload({}, {"n_examples": len(ctx.data)}))


def client_embeddings(ctx: ClientContext) -> torch.Tensor:
    """E(x) for the client's training data through the shared frozen encoder, ``[n, d]``
    float32 on the CPU — computed once and cached under the encoder's fingerprint.

    Raises:
        ValueError: when the federation has no shared encoder.
    """
    if ctx.encoder is None:
        raise ValueError("this method needs a shared frozen encoder: set encoder")
    parts = {"recipe": "embed", "encoder": ctx.encoder.fingerprint, "data": ctx.data_fingerprint}

    def make() -> Payload:
        z = ctx.encoder.embed(ctx.data.x, ctx.device)
        return Payload({"z": z.numpy()})

    payload, hit = ctx.store.get_or_make(
        "embeddings", parts, make, label=f"client {ctx.client_id} embeddings"
    )
    ctx.notes["embed_cache_hit"] = hit
    return torch.from_numpy(payload.arrays["z"].copy())
