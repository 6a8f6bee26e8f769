"""FAFI, "Does One-shot Give the Best Shot? Mitigating Model Inconsistency in One-shot
Federated Learning" (Zeng et al., ICML 2025; authors' code ``zenghui9977/FAFI_ICML25`` @ 26cf90e,
read through notes/issue-52/research-fafi.md): clients learn features and class prototypes
that agree across clients; the server fuses the clients' features and classifies by the
averaged prototypes — no server training, no public data, no generator.

Client k (every client starts from the run's shared initialisation of the same architecture and
the same prototypes P ∈ ℝ^{C×F}, drawn from N(0, ``prototype_std``²): the authors' one random
draw, deep-copied to every client) trains its model on two augmented views of each batch (the
clean batch is never trained on), with ẑ = normalize(f(x)) its features and logits ẑ Pᵀ (no
temperature, no bias: the prototypes' norms are the classes' scales), on

    L = L_ce + L_con + L_pf + L_pp                                       (:func:`fafi_loss`)

* L_ce = CE(ẑ Pᵀ, y) on both views;
* L_con = the supervised contrastive loss of Khosla et al. on ẑ of both views, temperature
  ``temperature`` (0.07; :func:`supcon_loss`) — the "feature alignment" (the authors' code
  passes the labels; no projection head);
* L_pf = CE(ẑ Pᵀ / τ_pf, y), the prototype–feature term, with τ_pf = 1 as theirs — the same
  number as L_ce, so cross-entropy weighs twice, as in their code;
* L_pp = CE(P Pᵀ / τ_pp, I) with τ_pp = 1: each prototype scores itself above the others (their
  diagonal mask is built and not applied; P is never normalised).

The views (:func:`two_views`): a random resized crop of 0.2–1 of the area with a horizontal flip,
then, with probability 0.8, brightness and contrast jitter of ±0.4 (and saturation ±0.4 on
colour images), and grey with probability 0.2 on colour images — drawn once per batch as their
batch-wide torchvision transform draws (``draw=image``: one draw per image). Not here: the hue
jitter (±0.1) on colour images (no HSV round trip in the training layer). Also unlike
torchvision's transforms: the jitter's three factors apply in a fixed order (torchvision
shuffles it), contrast, saturation and grey use the channels' plain mean (torchvision weighs
them 0.299 / 0.587 / 0.114), the views are clamped to [0, 1] once at the end, and a crop can
reach past the image's edge, filled with the border pixels (a random resized crop stays
inside). Their optimiser is rebuilt every round (every epoch on CIFAR-10); ours runs once
over the budget. The client sends its
model; the prototypes are its head's weights (bias 0), so the upload is one model's bytes,
as the plain ensemble's, and no label counts are sent.

The server rebuilds the K models and returns the fused classifier (:class:`FusedPrototypes`):
logits(x) = normalize(Σ_k w_k f_k(x)) P̄ᵀ, with w_k = n_k / Σ n (``weighting=size``, theirs) and
P̄ the clients' prototypes averaged uniformly (theirs) — their ``WEnsembleFeature`` and
``eval_with_proto``. Their "informativeness-aware" fusion (``WEnsembleFeatureNoise``) is never
called in their code, and as written it predicts as the uniform feature sum: not built.

Where this differs from the authors' code: the members are evaluated in eval mode (their fused
model keeps the clients' models in a plain list in training mode, so their reported accuracy
normalises every test batch by its own BatchNorm statistics); training and test inputs are
normalised alike (theirs differ on every dataset); the training budget is the federation's
(epochs, batch size, learning rate; theirs: SGD 0.05 with momentum 0.9 for 300 or 50 epochs on
batches of 512), with their gradient clip of 1.0; no batch is dropped (their ``drop_last``
leaves a client smaller than a batch untrained); the partition is a partition (their Dirichlet
sampler lets shards overlap). Their accuracy is logged every round and none is selected; the
run reports the final model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.data.types import TaskInfo
from oneshotfl.encoders.pretrain import augment
from oneshotfl.functional import client_weights, weighted_member_sum
from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import client_models, initial_model_parts, shared_initial_model
from oneshotfl.methods.common import SendsTrainedModel
from oneshotfl.models.base import ClassifierModel
from oneshotfl.models.generator import input_statistics
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, Requires, ServerContext
from oneshotfl.protocol.fields import model_fields, model_from_fields
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.seeding import seeded_torch, torch_generator
from oneshotfl.training.loop import Batch, fit
from oneshotfl.training.services import client_artefact


@dataclass(frozen=True)
class FafiConfig(Params):
    """FAFI's knobs (names as in the module docs).

    Attributes:
        temperature: τ of the supervised contrastive term.
        prototype_std: the standard deviation the shared prototypes are drawn with.
        grad_clip: the clients' gradient clip (global L2 norm; 0: none).
        crop_area: the smallest crop, as a fraction of the image's area.
        draw: ``batch`` (one augmentation draw per batch, as theirs) or ``image``.
        weighting: the feature fusion's client weights: ``size`` (n_k, theirs) or ``uniform``.
    """

    temperature: float = 0.07
    prototype_std: float = 1.0
    grad_clip: float = 1.0
    crop_area: float = 0.2
    draw: Literal["batch", "image"] = "batch"
    weighting: Literal["size", "uniform"] = "size"

    def validate(self) -> None:
        require(self.temperature > 0, "temperature", "> 0", self.temperature)
        require(self.prototype_std > 0, "prototype_std", "> 0", self.prototype_std)
        require(self.grad_clip >= 0, "grad_clip", ">= 0 (0: none)", self.grad_clip)
        require(0 < self.crop_area <= 1, "crop_area", "in (0, 1]", self.crop_area)


def supcon_loss(z: torch.Tensor, y: torch.Tensor, temperature: float) -> torch.Tensor:
    """The supervised contrastive loss (Khosla et al. 2020, ``contrast_mode='all'``) of the
    normalised features ``z`` ``[M, F]`` with labels ``y``: for each anchor, minus the mean log
    softmax (over every other row, at ``temperature``) of its positives — the other rows of
    its class — averaged over the anchors; an anchor with no positive counts 0, as in their
    code and the authors' (``unsupervised_loss.py`` 88–94)."""
    sim = z @ z.T / temperature
    self_mask = torch.eye(len(z), dtype=torch.bool, device=z.device)
    log_prob = sim - torch.logsumexp(sim.masked_fill(self_mask, float("-inf")), 1, keepdim=True)
    positive = (y[:, None] == y[None, :]) & ~self_mask
    count = positive.sum(1).clamp(min=1)
    return -((log_prob * positive).sum(1) / count).mean()


def prototype_logits(features: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
    """normalize(f) Pᵀ: the cosine to each prototype times its norm."""
    return F.normalize(features, dim=1) @ prototypes.T


def fafi_loss(
    model: ClassifierModel, views: torch.Tensor, y: torch.Tensor, temperature: float
) -> torch.Tensor:
    """L_ce + L_con + L_pf + L_pp on the two views stacked ``[2B, ...]`` (labels ``y`` twice)."""
    z = F.normalize(model.forward_features(views), dim=1)
    prototypes = model.head.weight
    logits = z @ prototypes.T
    ce = F.cross_entropy(logits, y)
    pf = F.cross_entropy(logits / 1.0, y)  # the authors' prototype-feature term, τ = 1
    pp_logits = prototypes @ prototypes.T
    pp = F.cross_entropy(pp_logits, torch.arange(len(prototypes), device=pp_logits.device))
    return ce + supcon_loss(z, y, temperature) + pf + pp


def two_views(
    x: torch.Tensor, task: TaskInfo, generator: torch.Generator, cfg: FafiConfig
) -> torch.Tensor:
    """Two augmented views of the batch ``x`` (normalised inputs), stacked ``[2B, ...]``."""
    stats = input_statistics(task)
    mean = torch.tensor(stats.mean, device=x.device).view(1, -1, 1, 1)
    std = torch.tensor(stats.std, device=x.device).view(1, -1, 1, 1)
    views = []
    for _ in range(2):
        per_batch = cfg.draw == "batch"
        n, at = (1 if per_batch else len(x)), generator.device
        v = augment(x, generator, (cfg.crop_area, 1.0), 0.0, per_batch) * std + mean  # [0, 1]
        jitter = (torch.rand(n, generator=generator, device=at) < 0.8).float()
        factors = 1 + 0.8 * torch.rand(n, 3, generator=generator, device=at) - 0.4
        factors = (1 - jitter[:, None]) + jitter[:, None] * factors
        grey = torch.rand(n, generator=generator, device=at) < 0.2
        f = factors.to(x.device).view(n, 3, 1, 1, 1)
        v = v * f[:, 0]  # brightness
        mean_v = v.mean(dim=(1, 2, 3), keepdim=True)
        v = (v - mean_v) * f[:, 1] + mean_v  # contrast
        if task.in_channels == 3:
            luma = v.mean(1, keepdim=True)
            v = (v - luma) * f[:, 2] + luma  # saturation
            v = torch.where(grey.to(x.device).view(n, 1, 1, 1), v.mean(1, keepdim=True), v)
        views.append((v.clamp(0, 1) - mean) / std)
    return torch.cat(views)


class FusedPrototypes(nn.Module):
    """The server's classifier: normalize(Σ_k w_k f_k(x)) P̄ᵀ over the clients' models (held
    in a module list, so ``eval()`` and ``to()`` reach them)."""

    def __init__(
        self, members: list[ClassifierModel], weights: torch.Tensor, prototypes: torch.Tensor
    ) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)
        self.weights: torch.Tensor
        self.prototypes: torch.Tensor
        weights = (weights / weights.sum()).float().to(prototypes.device)
        self.register_buffer("weights", weights)
        self.register_buffer("prototypes", prototypes.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = torch.stack([cast(ClassifierModel, m).forward_features(x) for m in self.members])
        fused = weighted_member_sum(self.weights, features)
        return prototype_logits(fused, self.prototypes)


@register_method(
    "fafi", "FAFI: aligned features and shared prototypes; fused features at the server"
)
class Fafi(SendsTrainedModel[FafiConfig]):
    """FAFI's clients and feature-fusing, prototype-classifying server (see the module docs)."""

    cost = (
        "clients: one local training each on two augmented views a step (about twice an "
        "ERM step, plus a 2B×2B similarity); server: an average of C×F prototypes; every "
        "prediction runs all n models (O(n·|test|))"
    )

    Config = FafiConfig
    # images of side 8 at least: a crop of a fifth of the area leaves ~3.6 pixels a side
    requires = Requires(data_free=True, same_architecture=True, images=8)

    def client_recipe(self, ctx: ClientContext) -> None:
        return None

    def trained(self, ctx: ClientContext) -> nn.Module:
        cfg = self.config
        train = ctx.train_config
        parts = {
            "fafi": [cfg.temperature, cfg.prototype_std, cfg.grad_clip, cfg.crop_area, cfg.draw],
            "train": [train.epochs, train.batch_size, train.lr, train.optimizer, train.momentum,
                      train.weight_decay],
            **initial_model_parts(ctx),
        }  # fmt: skip

        def make() -> Payload:
            return model_fields(self._train(ctx))

        payload = client_artefact(ctx, "fafi_model", parts, make, "FAFI model")
        return model_from_fields(payload, ctx.dims).eval()

    def _train(self, ctx: ClientContext) -> nn.Module:
        cfg, task = self.config, ctx.task
        model = cast(ClassifierModel, shared_initial_model(ctx))
        with seeded_torch(ctx.seed, "init", ctx.arch, "fafi prototypes"):
            prototypes = torch.randn(model.head.weight.shape) * cfg.prototype_std
        with torch.no_grad():
            model.head.weight.copy_(prototypes)
            if model.head.bias is not None:
                model.head.bias.zero_()
                model.head.bias.requires_grad_(False)
        views = torch_generator(ctx.seed, "fafi", "client", ctx.client_id, "views")

        def loss_fn(net: nn.Module, batch: Batch) -> torch.Tensor:
            x, y = batch
            pair = two_views(x, task, views, cfg)
            return fafi_loss(cast(ClassifierModel, net), pair, torch.cat([y, y]), cfg.temperature)

        train = ctx.train_config
        settings = dataclasses.replace(train, grad_clip=cfg.grad_clip, min_steps=0)
        fit(
            model,
            (ctx.data.x, ctx.data.y),
            loss_fn,
            settings,
            torch_generator(ctx.seed, "fafi", "client", ctx.client_id),
            ctx.device,
            ctx.tracker,
            f"client {ctx.client_id} FAFI",
        )
        return model.cpu().eval()

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        members = [
            cast(ClassifierModel, m) for m in client_models(payloads, ctx.dims, device=ctx.device)
        ]
        sizes = [int(payloads[c].scalars["n_examples"]) for c in sorted(payloads)]
        weights = client_weights(sizes, self.config.weighting)
        prototypes = torch.stack([m.head.weight.detach() for m in members]).mean(0)
        fused = FusedPrototypes(members, weights, prototypes).eval()
        norms = prototypes.norm(dim=1)
        info = {
            "experts": float(len(members)),
            "prototype_norm_min": float(norms.min()),
            "prototype_norm_max": float(norms.max()),
        }
        return GlobalModel(fused, info=info)
