"""The head baselines of the FedAGE paper, on the same shared frozen encoder.

Every client embeds its data with the shared encoder and trains the same light head as in
FedAGE (:func:`~oneshotfl.methods.fedage.train_client_head`); what it sends and what the
server builds differ:

* ``head_avg`` — the paper's Table 6 "Simple Averaging" (``weighting=uniform``) and
  "Weighted Averaging" (``weighting=size``, McMahan et al. 2017): clients send their head and
  example count; the server averages the head parameters. Identical head architectures only.
* ``head_ensemble`` — clients send their head; the server predicts with the mean of the
  heads' softmaxes on E(x) (the ensemble FedAGE's phase 2 distils).
* ``pseudo_head`` — the control FedAGE's readings are measured against: FedAGE's clients,
  and a server that trains one head with CE on all latents and each latent's own-client
  pseudo-label (what the authors' phase 2 hands the server), on the reading's phase-2 budget.
* ``centralized_head`` — the upper bound for this encoder: clients upload their embeddings
  *and labels* (bytes counted; this is a reference, not a private method) and the server
  trains one head on their union, in client-id order, with the same recipe; its step floor
  (``steps`` unset) is the clients' ``local_steps`` times their number, the federation's total,
  as ``centralized``'s is — an undertrained bound would excuse methods it bounds.

Choices: head architecture ``head`` (one for all clients here), ``epochs`` and ``lr`` as in
FedAGE (Adam; Table 5's Fashion-MNIST values by default).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from oneshotfl.data.types import LabelledData
from oneshotfl.functional import Weighting, client_weights, weighted_average
from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import seeded_head
from oneshotfl.methods.common import (
    BOTH,
    SKEW,
    client_embeddings,
    encoded_head,
    head_from_payload,
    head_train_config,
    trained_client_head,
)
from oneshotfl.methods.fedage import FedAGE
from oneshotfl.methods.fedage_server import probabilities
from oneshotfl.models import MODELS
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.privacy import latent_privacy_report
from oneshotfl.protocol.contract import ClientContext, Method, Requires, ServerContext
from oneshotfl.protocol.fields import model_fields
from oneshotfl.protocol.limits import KnownLimit
from oneshotfl.protocol.outcome import Ensemble, GlobalModel, Outcome
from oneshotfl.protocol.spec import ArraySpec, ModelSpec, PayloadSpec, WireDims, n_examples_spec
from oneshotfl.seeding import torch_generator
from oneshotfl.training.loop import train_classifier


@dataclass(frozen=True)
class HeadConfig(Params):
    """Hyper-parameters of the head baselines.

    Attributes:
        head: the head architecture (a registered model built on embeddings).
        epochs: head training epochs.
        steps: a floor in head optimiser steps: the fewest whole epochs, at least
            ``epochs``, that make this many steps over the head's data (0: exactly
            ``epochs``; None: the federation's ``local_steps``); FedAGE's ``steps``.
        lr: Adam learning rate.
        weighting: ``head_avg`` only: ``uniform`` (simple), ``size`` (by n_k) or ``clipped``
            (n_k capped at twice the median).
    """

    head: str = "head_mlp"
    epochs: int = 7
    steps: int | None = None
    lr: float = 1e-3
    weighting: Weighting = "uniform"

    def validate(self) -> None:
        require(self.head in MODELS, "head", "a registered model", self.head)
        require(self.epochs >= 1, "epochs", ">= 1", self.epochs)
        require(self.steps is None or self.steps >= 0, "steps", ">= 0 or None", self.steps)
        require(self.lr > 0, "lr", "> 0", self.lr)


class SendsHead(Method[HeadConfig]):
    """Client half shared by the head baselines: train the head, send it and n_k."""

    cost = (
        "clients: embed their shard once and train a head (O(N)); server: n heads combined "
        "(O(n·|head|)); evaluation of an ensemble of heads O(n·|test|)"
    )

    Config = HeadConfig
    requires = Requires(shared_encoder=True)

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        return PayloadSpec(
            models=(
                ModelSpec(
                    "head", archs=(self.config.head,), input_dims=(dims.extra.get("D", 0), 1)
                ),
            ),
            scalars=(n_examples_spec(),),
        )

    def _head(self, ctx: ClientContext) -> tuple[nn.Module, torch.Tensor]:
        cfg = self.config
        steps = ctx.train_config.min_steps if cfg.steps is None else cfg.steps
        return trained_client_head(ctx, cfg.head, cfg.epochs, cfg.lr, steps=steps)

    def client_update(self, ctx: ClientContext) -> Payload:
        head, z = self._head(ctx)
        return model_fields(head, "head").merged(Payload({}, {"n_examples": len(z)}))

    def local_model(self, ctx: ClientContext) -> nn.Module:
        """The client's head on the shared encoder."""
        return encoded_head(ctx, self._head(ctx)[0])

    def heads(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> list[nn.Module]:
        return [head_from_payload(payloads[c], ctx.dims) for c in sorted(payloads)]


@register_method("head_avg", "heads on the shared encoder, parameter-averaged (uniform|size)")
class HeadAverage(SendsHead):
    """FedAGE's Table 6 parameter-averaging baselines."""

    known_limits = (
        KnownLimit(
            "averages heads each client initialised and trained on its own: near chance in "
            "every setting, as the FedAGE paper's Table 6 reports for its parameter-averaging "
            "baselines (12.7-25.8% on CIFAR-10)",
            below=BOTH,
        ),
    )

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        ids = sorted(payloads)
        archs = sorted({str(payloads[c].scalars["head.arch"]) for c in ids})
        if len(archs) != 1:
            raise ValueError(f"head_avg: expected one head architecture, got {archs}")
        states = [
            {k[5:]: v for k, v in payloads[c].arrays.items() if k.startswith("head.")} for c in ids
        ]
        sizes = [float(payloads[c].scalars["n_examples"]) for c in ids]
        weights = client_weights(sizes, self.config.weighting).tolist()
        head = self.heads({ids[0]: payloads[ids[0]]}, ctx)[0]
        averaged = weighted_average(states, weights)
        head.load_state_dict({k: torch.from_numpy(v) for k, v in averaged.items()})
        return GlobalModel(encoded_head(ctx, head))


@register_method("head_ensemble", "heads on the shared encoder, mean of their softmaxes")
class HeadEnsemble(SendsHead):
    """The ensemble of client heads on E(x)."""

    known_limits = (
        *FedAGE.known_limits,
        KnownLimit(
            "the plain ensemble's label-skew weakness on weaker features: each head knows only "
            "its client's classes, as each model of `ensemble` does, but sits on the frozen "
            "encoder rather than features learned end to end, so under skew it falls below "
            "the ensemble of full models even where one head on all labels is above it",
            below=BOTH,
            partitions=SKEW,
        ),
    )

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        return Ensemble([encoded_head(ctx, h) for h in self.heads(payloads, ctx)])


@register_method(
    "centralized_head", "upper bound: one head on every client's uploaded embeddings + labels"
)
class CentralizedHead(Method[HeadConfig]):
    """One head trained on the union of all clients' embeddings and labels."""

    cost = (
        "clients: embed their shard once (O(N)); server: one head on all N embeddings, "
        "independent of n"
    )

    known_limits = (
        KnownLimit(
            "the encoder's ceiling: one head on every client's embeddings and true labels is "
            "as good as the shared encoder's features allow - in the matrix a small SimCLR "
            "encoder pretrained on the 300-image pool (near chance on the RGB shapes), against "
            "models trained on the images themselves",
            below=BOTH,
        ),
    )

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
        if ctx.encoder is None:
            raise ValueError("centralized_head needs the shared frozen encoder: set encoder")
        encoder, ids = ctx.encoder, sorted(payloads)
        z = torch.cat([torch.from_numpy(np.asarray(payloads[c].arrays["latents"])) for c in ids])
        y = torch.cat([torch.from_numpy(np.asarray(payloads[c].arrays["labels"])) for c in ids])
        head = seeded_head(ctx, self.config.head, encoder.dim, "centralized_head")
        cfg, client = self.config, ctx.client_train_config
        # the federation's total: one client's floor times the clients, as `centralized` has
        steps = client.min_steps * len(ids) if cfg.steps is None else cfg.steps
        train_classifier(
            head,
            LabelledData(z, y),
            head_train_config(cfg.epochs, cfg.lr, client.batch_size, steps, client.floor_epochs),
            torch_generator(ctx.seed, "centralized_head"),
            ctx.device,
            tracker=ctx.tracker,
            description="centralized head",
        )
        return GlobalModel(encoded_head(ctx, head.cpu().eval()))


@register_method(
    "pseudo_head", "control: one head on all latents with their own-client pseudo-labels"
)
class PseudoLabelHead(FedAGE):
    """FedAGE's clients, and a server that trains one head with cross-entropy on all latents
    and each latent's own-client pseudo-label — supervised training on what the authors'
    phase 2 gives the server; the reading's phase-2 budget (epochs, lr scale, batch)."""

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        if ctx.encoder is None:
            raise ValueError("pseudo_head needs the shared frozen encoder: set encoder")
        cfg, ids = self.config, sorted(payloads)
        latents = [torch.from_numpy(np.asarray(payloads[c].arrays["latents"])) for c in ids]
        heads = [head_from_payload(payloads[c], ctx.dims) for c in ids]
        own = torch.cat(  # each latent's pseudo-label from its own client's head
            [probabilities(h, z, cfg.tau).argmax(-1) for h, z in zip(heads, latents, strict=True)]
        )
        z = torch.cat(latents)
        head = seeded_head(ctx, cfg.server_head, ctx.encoder.dim, "fedage", "server")
        lr = cfg.lr * cfg.setting("ensemble_lr_scale")
        train_classifier(
            head,
            LabelledData(z, own),
            head_train_config(cfg.setting("ensemble_epochs"), lr, cfg.batch_size),
            torch_generator(ctx.seed, "pseudo_head"),
            ctx.device,
            tracker=ctx.tracker,
            description="pseudo-label head",
        )
        info = {"latents": len(z), "privacy": latent_privacy_report(cfg)}
        return GlobalModel(encoded_head(ctx, head.cpu().eval()), info)
