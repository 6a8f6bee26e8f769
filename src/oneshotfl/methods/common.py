"""Building blocks shared by many methods: the client halves that recur (send the trained
model; send predictions on the public pool; embed with the shared encoder and train a head)
and the server-side readers of those payloads.

A client's model comes from its recipe (:meth:`ClientContext.train`), cached under a key of
everything that determines it, so every method in a sweep that needs "the client's locally
trained model" gets the same one, trained once.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from oneshotfl.data.types import LabelledData
from oneshotfl.encoders.base import EncodedClassifier
from oneshotfl.fingerprints import tensor_fingerprint
from oneshotfl.functional import Weighting, client_weights, weighted_average
from oneshotfl.methods.builders import seeded_head
from oneshotfl.methods.folds import ModelAverage, held_weights, model_state
from oneshotfl.models.base import on_device
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, ConfigT, Method, ServerContext
from oneshotfl.protocol.fields import model_fields, model_from_fields
from oneshotfl.protocol.layer_stats import LayerStatistics
from oneshotfl.protocol.limits import KnownLimit, Reference
from oneshotfl.protocol.spec import ArraySpec, ModelSpec, PayloadSpec, WireDims, n_examples_spec
from oneshotfl.robust import (
    Aggregation,
    coordinate_median,
    norm_clipped_average,
    trimmed_mean,
)
from oneshotfl.seeding import torch_generator
from oneshotfl.training.loop import TrainConfig, predict_logits, train_classifier
from oneshotfl.training.recipe import ClientRecipe, initial_model
from oneshotfl.training.services import client_artefact, train_model

__all__ = [
    "SendsModelAndStatistics",
    "SendsTrainedModel",
    "SharesPredictions",
    "average_models",
    "client_embeddings",
    "client_shares",
    "encoded_head",
    "head_from_payload",
    "head_train_config",
    "held_out",
    "initial_model",
    "probabilities_payload",
    "probabilities_spec",
    "public_probabilities",
    "stack_probabilities",
    "trained_client_head",
]


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
    """The prediction-sharing message: the client's locally trained model (its recipe),
    softmax(f(x)/T) on the public pool, sent as ``probs`` in ``dtype``."""
    probs = public_probabilities(train_model(ctx, ctx.recipe()), ctx, temperature)
    return Payload({"probs": probs.numpy().astype(dtype)})


def probabilities_spec(dtype: str = "float32", name: str = "probs") -> PayloadSpec:
    """One ``[N_pub, C]`` array of probability rows (the prediction-sharing message)."""
    return PayloadSpec(arrays=(ArraySpec(name, ("N_pub", "C"), (dtype,), (0.0, 1.0), True),))


def stack_probabilities(payloads: Mapping[int, Payload], key: str = "probs") -> torch.Tensor:
    """Client probability payloads as float32 ``[K, N, C]`` in client-id order, rows
    re-normalised (float16 payloads do not sum to exactly 1)."""
    probs = torch.stack(
        [
            torch.from_numpy(np.asarray(payloads[c].arrays[key], np.float32))
            for c in sorted(payloads)
        ]
    )
    return probs / probs.sum(-1, keepdim=True)


class SharesPredictions(Method[ConfigT]):
    """The client half of prediction-sharing methods (FedOL, FedHKT, MinE, …): train locally
    with the federation's recipe, send softmax(f(x)/T) on the public pool and nothing else.
    Override :meth:`prediction_format` to change T or the wire dtype."""

    cost = (
        "clients: one local training and one prediction on the public pool each (O(N + n·|P|) "
        "for N examples split n ways); server: n soft labels per pool example to combine, "
        "distillation O(|P|) an epoch"
    )

    def prediction_format(self) -> tuple[float, str]:
        """``(temperature, dtype)`` of the predictions on the wire."""
        return 1.0, "float32"

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        return probabilities_spec(self.prediction_format()[1])

    def client_update(self, ctx: ClientContext) -> Payload:
        temperature, dtype = self.prediction_format()
        return probabilities_payload(ctx, temperature, dtype)

    def local_model(self, ctx: ClientContext) -> nn.Module | None:
        return train_model(ctx, ctx.recipe())

    def client_recipe(self, ctx: ClientContext) -> ClientRecipe | None:
        return ctx.recipe()


class SendsTrainedModel(Method[ConfigT]):
    """The client half shared by model-sharing methods (FedAvg, the ensemble, …): train
    locally with the federation's recipe, send the model and the example count n_k."""

    cost = (
        "clients: one local training each (O(N) at a fixed dataset of N examples, however "
        "split); server: n models decoded (O(n·|θ|))"
    )

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        return PayloadSpec(models=(ModelSpec(),), scalars=(n_examples_spec(),))

    def trained(self, ctx: ClientContext) -> nn.Module:
        """The model the client sends: its recipe's (default: the federation's plain one)."""
        recipe = self.client_recipe(ctx)
        assert recipe is not None
        return train_model(ctx, recipe)

    def client_recipe(self, ctx: ClientContext) -> ClientRecipe | None:
        return ctx.recipe()

    def client_update(self, ctx: ClientContext) -> Payload:
        model = on_device(self.trained(ctx), "cpu")
        return model_fields(model).merged(Payload({}, {"n_examples": len(ctx.data)}))

    def local_model(self, ctx: ClientContext) -> nn.Module | None:
        return self.trained(ctx)


class SendsModelAndStatistics(SendsTrainedModel[ConfigT]):
    """A model-sharing method whose clients also send per-layer statistics of their trained
    model (:mod:`oneshotfl.protocol.layer_stats`: FedFisher's Fisher diagonal, RegMean's
    input Grams), computed by :meth:`statistics` on the first :meth:`statistics_examples`
    of the client's data and cached with the model's recipe and :meth:`statistics_key`."""

    statistics_group: LayerStatistics

    def statistics(
        self, model: nn.Module, data: LabelledData, device: torch.device
    ) -> dict[str, torch.Tensor]:
        """The statistics by key (without the group's prefix), float32 on the CPU."""
        raise NotImplementedError

    def statistics_examples(self) -> int:
        """The most examples the statistics use (0: all)."""
        return 0

    def statistics_key(self) -> dict[str, object]:
        """What else the statistics depend on (the knobs that change them)."""
        return {}

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        base = super().payload_spec(dims)
        return PayloadSpec(
            models=base.models, scalars=base.scalars, groups=(self.statistics_group,)
        )

    def client_update(self, ctx: ClientContext) -> Payload:
        model, data, limit = self.trained(ctx), ctx.data, self.statistics_examples()
        if limit and len(data) > limit:
            data = data.subset(list(range(limit)))
        prefix = self.statistics_group.prefix

        def make() -> Payload:
            stats = self.statistics(model, data, ctx.device)
            return Payload({f"{prefix}.{k}": v.numpy() for k, v in stats.items()})

        recipe = self.client_recipe(ctx)
        assert recipe is not None
        key = {"recipe": recipe.key(), "examples": len(data), **self.statistics_key()}
        stats = client_artefact(ctx, f"layer_{prefix}", key, make, f"{prefix} statistics")
        return super().client_update(ctx).merged(stats)


def client_shares(payloads: Mapping[int, Payload], weighting: Weighting) -> list[float]:
    """p_k = a_k / Σ a, in client-id order, from each payload's reported ``n_examples``
    (a_k from :func:`~oneshotfl.functional.client_weights`)."""
    sizes = [float(payloads[c].scalars["n_examples"]) for c in sorted(payloads)]
    weights = client_weights(sizes, weighting)
    return (weights / weights.sum()).tolist()


def average_models(
    payloads: Mapping[int, Payload],
    dims: WireDims,
    weighting: Weighting = "size",
    aggregation: Aggregation = "mean",
    trim: float = 0.2,
    reference: nn.Module | None = None,
) -> nn.Module:
    """The weighted average Σ_k (a_k/Σa)·w_k of the models in ``payloads`` (each with an
    ``n_examples`` scalar; a_k from :func:`~oneshotfl.functional.client_weights`, n_k by
    default), built as the architecture of the lowest client id — or, with ``aggregation``,
    a robust rule of :mod:`oneshotfl.robust` (``norm_clip`` needs ``reference``, the shared
    initial model the updates are measured from)."""
    ids = sorted(payloads)
    if aggregation == "mean":  # the fold the server streams (clipped: over the held sizes)
        fold = ModelAverage(dims, weighting, weights=held_weights(payloads, weighting))
        for cid in ids:
            fold.add(cid, payloads[cid])
        return fold.averaged()
    states = [model_state(payloads[c]) for c in ids]
    sizes = [float(payloads[c].scalars["n_examples"]) for c in ids]
    if aggregation != "mean" and weighting == "size":  # a robust mode never trusts raw sizes
        weighting = "clipped"
    weights = client_weights(sizes, weighting).tolist()
    if aggregation == "median":
        averaged = coordinate_median(states)
    elif aggregation == "trimmed_mean":
        averaged = trimmed_mean(states, trim)
    elif aggregation == "norm_clip":
        if reference is None:
            raise ValueError("average_models: norm_clip needs the shared initial model")
        initial = {k: v.detach().cpu().numpy() for k, v in reference.state_dict().items()}
        averaged = norm_clipped_average(states, weights, initial)
    else:
        averaged = weighted_average(states, weights)
    model = model_from_fields(payloads[ids[0]], dims)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in averaged.items()})
    return model


BOTH: tuple[Reference, ...] = ("ensemble", "local")
SKEW = ("dirichlet", "disjoint")

AVERAGING_LIMIT = KnownLimit(
    "one round of parameter averaging: models trained apart from one initialisation for the "
    "whole local budget (300 steps by default, 200 in the matrix) drift apart, so their "
    "average is below the ensemble of the same models in the matrix, most under label skew, "
    "and can fall below a client's own "
    "model - one-shot FedAvg's known failure, which the FedOL, FedEOV and IntactOFL tables "
    "report too",
    below=BOTH,
)
STUDENT_LIMIT = KnownLimit(
    "distils into one server model on the public pool (300 images in the matrix): the student "
    "is bounded by its teacher - the clients' ensemble or vote, which the `ensemble` row is "
    "or comes close to - and by a pool smaller than one client's data, so it can also fall "
    "below a client's own model where clients hold every class; it buys one model at "
    "inference instead of K",
    below=BOTH,
)
DATA_FREE_LIMIT = KnownLimit(
    "data-free: the student (or IntactOFL's gate) learns only from inputs a generator "
    "synthesises against the frozen client models (in the matrix IntactOFL, DENSE, "
    "Co-Boosting and F-DAFL run a sixth of their rounds, a third in the full-budget matrix, "
    "for CPU time); at full rounds the "
    "IntactOFL benchmark also puts every data-free method below "
    "the probability ensemble, DENSE and Co-Boosting near chance",
    below=BOTH,
)
IID_OPEN_SET_LIMIT = KnownLimit(
    "built for label skew: on IID data every client holds every class, the abstention "
    "weighting has no unknown classes to filter, and training the extra 'unknown' class on "
    "negatives costs known-class accuracy, so the plain ensemble of ERM models is ahead",
    below=BOTH,
    partitions=("iid",),
)


def held_out(ctx: ClientContext) -> LabelledData:
    """The client's validation split, or its training split when it had too few to split."""
    return ctx.val if ctx.val is not None and len(ctx.val) else ctx.data


def client_embeddings(ctx: ClientContext) -> torch.Tensor:
    """E(x) for the client's training data through the shared frozen encoder, ``[n, d]``
    float32 on the CPU — computed once and cached under the encoder's fingerprint.

    Raises:
        ValueError: when the federation has no shared encoder.
    """
    encoder = ctx.encoder
    if encoder is None:
        raise ValueError("this method needs a shared frozen encoder: set encoder")

    def make() -> Payload:
        return Payload({"z": encoder.embed(ctx.data.x, ctx.device).numpy()})

    payload = client_artefact(
        ctx, "embeddings", {"encoder": encoder.fingerprint}, make, "embeddings"
    )
    return torch.from_numpy(payload.arrays["z"].copy())


def head_train_config(
    epochs: int, lr: float, batch_size: int, steps: int = 0, floor_epochs: int = 0
) -> TrainConfig:
    """Adam for heads and server heads (FedAGE's optimiser); ``steps``: a floor in
    optimiser steps (``TrainConfig.min_steps``), raising the epochs to at most
    ``floor_epochs`` (0: unbounded)."""
    return TrainConfig(epochs, batch_size, lr, "adam", min_steps=steps, floor_epochs=floor_epochs)


def trained_client_head(
    ctx: ClientContext,
    arch: str,
    epochs: int,
    lr: float,
    latents: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    batch: int | None = None,
    steps: int = 0,
) -> tuple[nn.Module, torch.Tensor]:
    """FedAGE's Algorithm 2 (and its head baselines' client): embed the client's data once
    (cached) and train the head ``arch`` on (E(x), y) with cross-entropy — or on
    ``latents`` / ``labels`` when given (noised latents, randomized-response labels), in
    batches of ``batch`` (default: the client training config's), for ``epochs`` and at
    least ``steps`` optimiser steps. The head is cached under what it was trained on.
    Returns the head (CPU, eval mode) and the latents."""
    z = client_embeddings(ctx) if latents is None else latents
    y = ctx.data.y if labels is None else labels
    d = int(z.shape[1])
    client = ctx.train_config
    train = head_train_config(epochs, lr, batch or client.batch_size, steps, client.floor_epochs)

    def make() -> Payload:
        head = seeded_head(ctx, arch, d, "fedage", "head", ctx.client_id)
        train_classifier(
            head,
            LabelledData(z, y),
            train,
            torch_generator(ctx.seed, "fedage", "client", ctx.client_id),
            ctx.device,
            tracker=ctx.tracker,
            description=f"client {ctx.client_id} head ({arch})",
        )
        return model_fields(head.cpu(), "head")

    key = {"arch": arch, "train": train.as_dict(), "trained_on": tensor_fingerprint(z, y)}
    payload = client_artefact(ctx, "head", key, make, f"head ({arch})")
    dims = WireDims(ctx.task.num_classes, d, 1)
    return model_from_fields(payload, dims, "head").eval(), z


def head_from_payload(payload: Payload, dims: WireDims, prefix: str = "head") -> nn.Module:
    """A head on ``D``-dimensional embeddings rebuilt from its payload fields."""
    head_dims = ModelSpec(prefix, input_dims=(dims.extra["D"], 1)).model_dims(dims)
    return model_from_fields(payload, head_dims, prefix).eval()


def encoded_head(ctx: ClientContext | ServerContext, head: nn.Module) -> EncodedClassifier:
    """E followed by ``head``, evaluated on images (needs the context's shared encoder)."""
    if ctx.encoder is None:
        raise ValueError("this method needs the shared frozen encoder: set encoder")
    return EncodedClassifier(ctx.encoder, head).eval()
