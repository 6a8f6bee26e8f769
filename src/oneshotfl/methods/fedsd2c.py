"""FedSD2C, "One-shot Federated Learning via Synthetic Distiller-Distillate Communication"
(Zhang, Liu and Wang, NeurIPS 2024; authors' code ``Carkham/FedSD2C`` @ 5569741, read through
notes/issue-52/research-fedsd2c.md): each client sends a few synthetic *distillates* of its
data as latent codes of a shared autoencoder; the server decodes them and distils a model from
them.

Client k, with its locally trained model f_k (the federation's recipe: the "distiller"), per
class c it holds:

1. **Core-set by V-information** (``coreset=vinfo``): at most ``mipc`` of its examples of c (a
   seeded draw), ``num_crop`` random square crops of each (area in [``crop_scale_min``, 1],
   resized back; the same crop boxes for every example of the class, as their batch-wide
   transform draws), scored by the cross-entropy −log p_{f_k}(c | crop); each example keeps
   its best crop, and the ``ipc`` examples whose best crop scores lowest form the core-set X_s.
   Within a class, ranking by least cross-entropy is ranking by most pointwise V-information
   (the two differ by the class's constant −log g_∅(c)); the authors' code computes the
   cross-entropy (:func:`vinfo_coreset`).
2. **Fourier amplitude perturbation** (``fourier``): each crop x_s gets a donor x_d — the
   class's unselected crops, the highest cross-entropy first, paired in a seeded order and
   recycled — and becomes (per channel, :func:`fourier_amplitude_mix`)

       x_p = Re F⁻¹( ((1 − λ)|F x_s| + λ|F x_d|) · e^{i∠F x_s} ),   λ = ``fourier_lambda``;

   a class with no unselected crop takes its donors from its own core-set.
3. **Distillate synthesis**: z₀ = E(x_p), the shared autoencoder's posterior mean (x_p's
   pixels clamped to [0, 1], their effective clamp), then ``iterations`` AdamW steps on z
   (rate ``syn_lr`` on a cosine to 0, betas (0.5, 0.9), weight decay ``syn_weight_decay``) on

       L_syn = MSE(φ(D(z)), φ(x_s)) + r_c · CE(f_k(D(z)), c)              (:func:`synthesis_loss`)

   with φ the penultimate features of f_k (frozen, eval mode) — the input of its last linear
   layer, which is what the authors' hooks read on their ConvNet and ResNet-18.

The client sends the latents z (the paper's upload; the authors' code sends the decoded images
"to simplify the implementation"), their labels and, with ``labels=logits``, f_k's logits on
D(z) and on its mirror image, plus the autoencoder's fingerprint. The authors' server runs each
client's model live on every batch as the teacher of that client's distillates; on a frozen
teacher in eval mode those are exactly the logits sent, so the model itself never leaves the
client. The server decodes every client's latents with its own copy of the autoencoder (a
client whose fingerprint differs is left out and named), trains the federation's architecture
(``arch`` otherwise) from the run's initialisation for ``server_epochs`` with SGD (``server_lr``
on a cosine over the epochs, momentum, weight decay), batch ``server_batch``, each example
mirrored with probability 1/2 (``server_flip``), on KL(softmax(t/T) ‖ softmax(s/T))·T² with t
the sent logits of the example as used (``labels=hard``: cross-entropy on the labels), and
returns the final model.

The autoencoder (:mod:`oneshotfl.encoders.autoencoder`) is the readings' largest departure:
theirs is Stable Diffusion XL's VAE (8× downsampling, trained on web images), which cannot be
downloaded here and does not fit 28-pixel grey images; ours is a small KL autoencoder of the
same shape (4× on 28-pixel images) pretrained on the public pool (``autoencoder=public``) or
loaded from a file every party holds (``autoencoder=file:ae_path=…``; a deployment across
machines should use one: every party must hold the same weights; the method declares a public
pool, which the file source does not use — a method's needs are declared once, not per knob).
Also not theirs: ``small_classes=keep``, the default (their ``CategoryDataset`` drops a class
with at most ``ipc`` examples, so a client with few examples of every class sends nothing;
``small_classes=drop`` is theirs); their donor filter (meant to keep donors f_k predicts as c)
is broken in their code and not built; they return D(z) after ``iterations − 1`` steps, we
send z after all of them. Their server selects nothing on the test set but logs its best
epoch; we report the final model.

Privacy: the message is data-like — each latent decodes to an image optimised to look, to the
client's model, like one of its own examples, whose phase (its layout) it keeps; the labels
say which classes the client holds and how many of each (at most ``ipc``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.data.types import LabelledData
from oneshotfl.encoders.autoencoder import Autoencoder, build_autoencoder, spec_latent_shape
from oneshotfl.functional import kl_to_student
from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import shared_initial_model, union_arch
from oneshotfl.methods.fedsd2c_config import PREFIX, Distillates, FedSd2cConfig
from oneshotfl.models.base import ClassifierModel
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, Method, Requires, ServerContext
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.protocol.spec import PayloadSpec, ScalarSpec, WireDims
from oneshotfl.seeding import numpy_rng, torch_generator
from oneshotfl.training import optim
from oneshotfl.training.loop import (
    Batch,
    FitHooks,
    TrainConfig,
    fit,
    make_optimizer,
    predict_logits,
)
from oneshotfl.training.services import client_artefact, train_model

log = logging.getLogger(__name__)


def crop_boxes(count: int, scale_min: float, generator: torch.Generator) -> torch.Tensor:
    """``count`` random square crops as affine maps ``[count, 2, 3]`` on the generator's
    device: area uniform in [``scale_min``, 1] of the image's, placed uniformly inside it."""
    at = generator.device
    side = torch.empty(count, device=at).uniform_(scale_min, 1.0, generator=generator).sqrt()
    shift = (1 - side)[:, None] * (2 * torch.rand(count, 2, generator=generator, device=at) - 1)
    theta = torch.zeros(count, 2, 3, device=at)
    theta[:, 0, 0], theta[:, 1, 1] = side, side
    theta[:, :, 2] = shift
    return theta


def apply_crops(x: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """Every box of ``boxes`` cut from every image of ``x`` and resized back (bilinear):
    ``[N, K, C, H, W]``."""
    n, k = len(x), len(boxes)
    theta = boxes.to(x.device).repeat(n, 1, 1)
    many = x.unsqueeze(1).expand(n, k, *x.shape[1:]).reshape(n * k, *x.shape[1:])
    grid = F.affine_grid(theta, list(many.shape), align_corners=False)
    return F.grid_sample(many, grid, align_corners=False).view(n, k, *x.shape[1:])


def vinfo_coreset(ce: torch.Tensor, ipc: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The V-information core-set from the cross-entropies ``ce`` ``[N, K]`` of K crops of N
    examples of one class: (the ``ipc`` examples of least best-crop cross-entropy, in that
    order; every example's best crop; its cross-entropy)."""
    best_ce, best_crop = ce.min(dim=1)
    order = torch.argsort(best_ce, stable=True)
    return order[:ipc], best_crop, best_ce


def fourier_amplitude_mix(x_s: torch.Tensor, x_d: torch.Tensor, lam: float) -> torch.Tensor:
    """x_p = Re F⁻¹(((1 − λ)|F x_s| + λ|F x_d|) e^{i∠F x_s}) over the last two axes."""
    spectrum_s, spectrum_d = torch.fft.fft2(x_s), torch.fft.fft2(x_d)
    amplitude = (1 - lam) * spectrum_s.abs() + lam * spectrum_d.abs()
    return torch.fft.ifft2(torch.polar(amplitude, spectrum_s.angle())).real


def synthesis_loss(
    model: ClassifierModel,
    decoded: torch.Tensor,
    target_features: torch.Tensor,
    y: torch.Tensor,
    r_c: float,
) -> torch.Tensor:
    """L_syn = MSE(φ(x̂), φ(x_s)) + r_c · CE(f(x̂), y), with φ the penultimate features."""
    features = model.forward_features(decoded)
    loss = F.mse_loss(features, target_features)
    if r_c > 0:
        loss = loss + r_c * F.cross_entropy(model.head(features), y)
    return loss


def cosine_rate(base: float, step: int, total: int) -> float:
    """½ · base · (1 + cos(π · step / total)): from ``base`` at step 0 towards 0."""
    return 0.5 * base * (1 + math.cos(math.pi * step / max(total, 1)))


def synthesize(
    model: ClassifierModel,
    auto: Autoencoder,
    x_p: torch.Tensor,
    x_s: torch.Tensor,
    y: torch.Tensor,
    cfg: FedSd2cConfig,
    device: torch.device,
) -> tuple[torch.Tensor, list[float]]:
    """The latents of the distillates (step 3 of the module docs), on the CPU, and the
    synthesis loss at the first and the last step (one chunk of 256 at a time: the loss is a
    mean of per-example terms, so chunking moves only AdamW's ε)."""
    coder = auto.model.to(device)
    latents, first, last = [], 0.0, 0.0
    for start in range(0, len(x_p), 256):
        part = slice(start, start + 256)
        xs, yy = x_s[part].to(device), y[part].to(device)
        with torch.no_grad():
            z = coder.encode(x_p[part].to(device))
            target = model.forward_features(xs)
        z.requires_grad_(True)
        opt = optim.AdamW(
            [z], lr=cfg.syn_lr, betas=(0.5, 0.9), eps=1e-8, weight_decay=cfg.syn_weight_decay
        )
        for step in range(cfg.iterations):
            for group in opt.param_groups:
                group["lr"] = cosine_rate(cfg.syn_lr, step, cfg.iterations)
            loss = synthesis_loss(model, coder.decode(z), target, yy, cfg.r_c)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            weight = len(xs) / len(x_p)
            first += float(loss.detach()) * weight if step == 0 else 0.0
            last += float(loss.detach()) * weight if step == cfg.iterations - 1 else 0.0
        latents.append(z.detach().cpu())
    return torch.cat(latents), [first, last]


@register_method("fedsd2c", "FedSD2C: core-set distillates sent as autoencoder latents")
class FedSd2c(Method[FedSd2cConfig]):
    """FedSD2C (see the module docs)."""

    cost = (
        "clients: one local training, num_crop forwards of up to mipc examples a class, then "
        "iterations × (decoder + model) forward and backward passes over ≤ ipc·C distillates; "
        "server: decode ≤ n·ipc·C latents, one model trained on them for server_epochs"
    )

    Config = FedSd2cConfig
    requires = Requires(public_data=True, images=8)  # its crops need images

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        latent = spec_latent_shape(self.config.autoencoder_spec(dims.image_size), dims.image_size)
        group = Distillates(PREFIX, latent, self.config.ipc, self.config.labels == "logits")
        return PayloadSpec(scalars=(ScalarSpec("autoencoder", str),), groups=(group,))

    def autoencoder(self, ctx: ClientContext | ServerContext) -> Autoencoder:
        """The shared autoencoder the spec names, on this party."""
        public = None if ctx.public is None else ctx.public.x
        return build_autoencoder(
            self.config.autoencoder_spec(ctx.task.image_size),
            ctx.task,
            ctx.seed,
            public=public,
            store=ctx.store,
            device=ctx.device,
        )

    def local_model(self, ctx: ClientContext) -> nn.Module | None:
        return train_model(ctx, ctx.recipe())

    def client_update(self, ctx: ClientContext) -> Payload:
        auto, cfg = self.autoencoder(ctx), self.config
        distiller = train_model(ctx, ctx.recipe())
        key = {
            "fedsd2c": dataclasses.asdict(cfg),
            "autoencoder": auto.fingerprint,
            "distiller": ctx.recipe().key(),
        }
        made = client_artefact(
            ctx, "fedsd2c", key, lambda: self._distil(ctx, distiller, auto), "FedSD2C distillates"
        )
        return Payload(made.arrays, {"autoencoder": auto.fingerprint})

    def _distil(self, ctx: ClientContext, distiller: nn.Module, auto: Autoencoder) -> Payload:
        cfg, device = self.config, ctx.device
        model = distiller.to(device).eval()
        assert isinstance(model, ClassifierModel)
        for p in model.parameters():
            p.requires_grad_(False)
        x_s, x_p, y = core_set(model, ctx.data, cfg, ctx, device)
        if len(y) == 0:
            raise ValueError(
                f"fedsd2c: client {ctx.client_id} holds no class with more than ipc={cfg.ipc} "
                "examples (small_classes=drop); expected at least one"
            )
        z, losses = synthesize(model, auto, x_p, x_s, y, cfg, device)
        arrays = {"latents": z.numpy(), "y": y.numpy().astype(np.int64)}
        if cfg.labels == "logits":
            decoded = auto.decoded(z, device)
            both = [predict_logits(model, v, device) for v in (decoded, decoded.flip(-1))]
            arrays["logits"] = torch.stack(both, dim=1).numpy()
        out = {f"{PREFIX}.{k}": v for k, v in arrays.items()}
        return Payload(out, {"synthesis_loss_first": losses[0], "synthesis_loss_last": losses[1]})

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        cfg, auto = self.config, self.autoencoder(ctx)
        left_out = {
            f"client {c}": f"latents of another autoencoder ({str(p.scalars['autoencoder'])[:12]}…,"
            f" this run's {auto.fingerprint[:12]}…)"
            for c, p in sorted(payloads.items())
            if p.scalars["autoencoder"] != auto.fingerprint
        }
        for who, why in left_out.items():
            log.warning("fedsd2c: left out %s: %s", who, why)
        used = sorted(c for c in payloads if f"client {c}" not in left_out)
        if not used:
            raise ValueError(
                f"fedsd2c: no client sent latents of this run's autoencoder: {left_out}"
            )
        arrays = {
            k: np.concatenate([payloads[c].arrays[f"{PREFIX}.{k}"] for c in used])
            for k in ("latents", "y", *(("logits",) if cfg.labels == "logits" else ()))
        }
        x = auto.decoded(torch.from_numpy(arrays["latents"]), ctx.device)
        y = torch.from_numpy(arrays["y"])
        soft = torch.from_numpy(arrays["logits"]) if "logits" in arrays else None
        model = self._train_server(ctx, LabelledData(x, y), soft)
        info: dict[str, object] = {"distillates": float(len(y)), "clients_used": float(len(used))}
        return GlobalModel(model, info | ({"left_out": left_out} if left_out else {}))

    def _train_server(
        self, ctx: ServerContext, data: LabelledData, logits: torch.Tensor | None
    ) -> nn.Module:
        cfg = self.config
        model = shared_initial_model(ctx, union_arch(ctx, "fedsd2c", cfg.arch))
        train = TrainConfig(
            epochs=cfg.server_epochs,
            batch_size=cfg.server_batch,
            lr=cfg.server_lr,
            momentum=cfg.server_momentum,
            weight_decay=cfg.server_weight_decay,
            init=ctx.train_config.init,
        )
        flips = torch_generator(ctx.seed, "fedsd2c", "server", "flip")
        temperature = cfg.temperature

        def loss_fn(net: nn.Module, batch: Batch) -> torch.Tensor:
            x, y, *rest = batch
            flip = torch.rand(len(x), generator=flips) < 0.5 if cfg.server_flip else None
            if flip is not None:
                x = torch.where(flip.to(x.device).view(-1, 1, 1, 1), x.flip(-1), x)
            out = net(x)
            if not rest:
                return F.cross_entropy(out, y)
            rows = torch.arange(len(x), device=x.device)
            side = flip.long().to(x.device) if flip is not None else torch.zeros_like(rows)
            teacher = rest[0][rows, side]
            target = torch.softmax(teacher / temperature, dim=-1)
            return kl_to_student(out, target, temperature).mean() * temperature**2

        opt = make_optimizer([p for p in model.parameters() if p.requires_grad], train)

        def anneal(epoch: int) -> None:
            for group in opt.param_groups:
                group["lr"] = cosine_rate(cfg.server_lr, epoch, cfg.server_epochs)

        tensors = (data.x, data.y) if logits is None else (data.x, data.y, logits)
        order = torch_generator(ctx.seed, "fedsd2c", "server", "order")
        fit(
            model,
            tensors,
            loss_fn,
            train,
            order,
            ctx.device,
            ctx.tracker,
            "FedSD2C server",
            FitHooks(epoch_start=anneal),
            opt,
        )
        return model.eval()


def core_set(
    model: ClassifierModel,
    data: LabelledData,
    cfg: FedSd2cConfig,
    ctx: ClientContext,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Steps 1–2 of the module docs on one client: (core-set crops x_s, their perturbed
    versions x_p, labels), class by class."""
    rng = numpy_rng(ctx.seed, "fedsd2c", ctx.client_id, "coreset")
    crops_gen = torch_generator(ctx.seed, "fedsd2c", ctx.client_id, "crops")
    x_s, x_p, labels = [], [], []
    y_all = data.y.numpy()
    for c in np.unique(y_all):
        members = np.flatnonzero(y_all == c)
        if len(members) <= cfg.ipc and cfg.small_classes == "drop":
            continue
        members = rng.permutation(members)[: cfg.mipc]
        crops = apply_crops(
            data.x[members], crop_boxes(cfg.num_crop, cfg.crop_scale_min, crops_gen)
        )
        logits = predict_logits(model, crops.flatten(0, 1), device)
        target = torch.full((len(logits),), int(c), device=logits.device)
        ce = F.cross_entropy(logits, target, reduction="none").view(len(members), -1)
        if cfg.coreset == "vinfo":
            chosen, best_crop, best_ce = vinfo_coreset(ce, cfg.ipc)
        else:  # random examples (already a seeded order), their first crop
            chosen = torch.arange(min(cfg.ipc, len(members)))
            best_crop, best_ce = torch.zeros(len(members), dtype=torch.long), ce[:, 0]
        best = crops[torch.arange(len(members)), best_crop]
        rest = torch.ones(len(members), dtype=torch.bool)
        rest[chosen] = False
        pool = torch.nonzero(rest).flatten() if bool(rest.any()) else chosen
        donors = pool[torch.argsort(best_ce[pool], descending=True, stable=True)]
        donors = donors[torch.arange(len(chosen)) % len(donors)]
        paired = torch.from_numpy(rng.permutation(len(chosen)))
        core = best[chosen]
        perturbed = core.clone()
        if cfg.fourier:
            perturbed[paired] = fourier_amplitude_mix(
                core[paired], best[donors], cfg.fourier_lambda
            )
        x_s.append(core)
        x_p.append(perturbed)
        labels.append(torch.full((len(chosen),), int(c), dtype=torch.long))
    if not labels:
        empty = torch.empty(0, *data.x.shape[1:])
        return empty, empty, torch.empty(0, dtype=torch.long)
    return torch.cat(x_s), torch.cat(x_p), torch.cat(labels)
