"""The head baselines of the FedAGE paper, on the same shared frozen encoder.

Every client embeds its data with the shared encoder and trains the same light head as in
FedAGE (:func:`~oneshotfl.methods.fedage.train_client_head`); what it sends and what the
server builds differ:

* ``head_avg`` — the paper's Table 6 "Simple Averaging" (``weighting=uniform``) and
  "Weighted Averaging" (``weighting=size``, McMahan et al. 2017): clients send their head and
  example count; the server averages the head parameters. Identical head architectures only.
* ``head_ensemble`` — clients send their head; the server predicts with the mean of the
  heads' softmaxes on E(x) (the ensemble FedAGE's phase 2 distils).
* ``centralized_head`` — the upper bound for this encoder: clients upload their embeddings
  *and labels* (bytes counted; this is a reference, not a private method) and the server
  trains one head on their union, in client-id order, with the same recipe.

Choices: head architecture ``head`` (one for all clients here), ``epochs`` and ``lr`` as in
FedAGE (Adam; Table 5's Fashion-MNIST values by default).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from oneshotfl.data.types import LabelledData
from oneshotfl.encoders.base import Encoder
from oneshotfl.federation.contract import ClientContext, Method, Requires, ServerContext
from oneshotfl.federation.outcome import Ensemble, GlobalModel, Outcome
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
from oneshotfl.methods.base import register_method
from oneshotfl.methods.fedage import (
    EncodedClassifier,
    head_dims,
    head_train_config,
    train_client_head,
)
from oneshotfl.methods.fedavg import weighted_average
from oneshotfl.methods.recipes import client_embeddings
from oneshotfl.models import MODELS, create_model
from oneshotfl.seeding import seeded_torch, torch_generator
from oneshotfl.training.loop import train_classifier


@dataclass(frozen=True)
class HeadConfig:
    """Hyper-parameters of the head baselines.

    Attributes:
        head: the head architecture (a registered model built on embeddings).
        epochs: head training epochs.
        lr: Adam learning rate.
        weighting: ``head_avg`` only: ``uniform`` (simple) or ``size`` (by n_k).
    """

    head: str = "head_mlp"
    epochs: int = 7
    lr: float = 1e-3
    weighting: Literal["uniform", "size"] = "uniform"

    def __post_init__(self) -> None:
        if self.head not in MODELS:
            raise ValueError(f"head: expected a registered model, got {self.head!r}")
        if self.epochs < 1:
            raise ValueError(f"epochs: expected >= 1, got {self.epochs!r}")
        if not self.lr > 0:
            raise ValueError(f"lr: expected > 0, got {self.lr!r}")
        if self.weighting not in ("uniform", "size"):
            raise ValueError(f"weighting: expected uniform|size, got {self.weighting!r}")


def _encoder(ctx: ServerContext) -> Encoder:
    if ctx.encoder is None:
        raise ValueError("this method needs the shared frozen encoder: set encoder")
    encoder: Encoder = ctx.encoder
    return encoder


class SendsHead(Method[HeadConfig]):
    """Client half shared by the head baselines: train the head, send it and n_k."""

    Config = HeadConfig
    requires = Requires(shared_encoder=True)

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        return PayloadSpec(
            models=(ModelSpec("head", input_dims=(dims.extra.get("D", 0), 1)),),
            scalars=(ScalarSpec("n_examples", int, 1),),
        )

    def client_update(self, ctx: ClientContext) -> Payload:
        head, z = train_client_head(ctx, self.config.head, self.config.epochs, self.config.lr)
        return model_fields(head, "head").merged(Payload({}, {"n_examples": len(z)}))

    def heads(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> list[torch.nn.Module]:
        dims = head_dims(ctx.dims, _encoder(ctx).dim)
        return [model_from_fields(payloads[c], dims, "head").eval() for c in sorted(payloads)]


@register_method("head_avg", "heads on the shared encoder, parameter-averaged (uniform|size)")
class HeadAverage(SendsHead):
    """FedAGE's Table 6 parameter-averaging baselines."""

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        ids = sorted(payloads)
        archs = sorted({str(payloads[c].scalars["head.arch"]) for c in ids})
        if len(archs) != 1:
            raise ValueError(f"head_avg: expected one head architecture, got {archs}")
        states = [
            {k[5:]: v for k, v in payloads[c].arrays.items() if k.startswith("head.")} for c in ids
        ]
        sizes = [float(payloads[c].scalars["n_examples"]) for c in ids]
        weights = sizes if self.config.weighting == "size" else [1.0] * len(ids)
        head = self.heads({ids[0]: payloads[ids[0]]}, ctx)[0]
        averaged = weighted_average(states, weights)
        head.load_state_dict({k: torch.from_numpy(v) for k, v in averaged.items()})
        return GlobalModel(EncodedClassifier(_encoder(ctx), head).eval())


@register_method("head_ensemble", "heads on the shared encoder, mean of their softmaxes")
class HeadEnsemble(SendsHead):
    """The ensemble of client heads on E(x)."""

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        encoder = _encoder(ctx)
        members = [EncodedClassifier(encoder, h).eval() for h in self.heads(payloads, ctx)]
        return Ensemble(members)


@register_method(
    "centralized_head", "upper bound: one head on every client's uploaded embeddings + labels"
)
class CentralizedHead(Method[HeadConfig]):
    """One head trained on the union of all clients' embeddings and labels."""

    Config = HeadConfig
    requires = Requires(shared_encoder=True)

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        classes = (0, dims.num_classes - 1)
        labels = ArraySpec("labels", ("N",), ("int64",), classes)
        return PayloadSpec(arrays=(ArraySpec("latents", ("N", "D")), labels))

    def client_update(self, ctx: ClientContext) -> Payload:
        z = client_embeddings(ctx)
        return Payload({"latents": z.numpy(), "labels": ctx.data.y.numpy().astype(np.int64)})

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        encoder, ids = _encoder(ctx), sorted(payloads)
        z = torch.cat([torch.from_numpy(np.asarray(payloads[c].arrays["latents"])) for c in ids])
        y = torch.cat([torch.from_numpy(np.asarray(payloads[c].arrays["labels"])) for c in ids])
        with seeded_torch(ctx.seed, "centralized_head"):
            head = create_model(self.config.head, encoder.dim, ctx.task.num_classes, 1)
        cfg = self.config
        train_classifier(
            head,
            LabelledData(z, y),
            head_train_config(cfg.epochs, cfg.lr, ctx.client_train_config.batch_size),
            torch_generator(ctx.seed, "centralized_head"),
            ctx.device,
            tracker=ctx.tracker,
            description="centralized head",
        )
        return GlobalModel(EncodedClassifier(encoder, head.cpu().eval()).eval())
