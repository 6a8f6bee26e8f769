"""FedCVAE: Heinbaugh, Luz-Ricca and Shao (2023), "Data-Free One-Shot Federated Learning Under
Very High Statistical Heterogeneity" (ICLR) — the generative baseline of the FedAGE paper.

Each client trains a conditional VAE on its data — encoder q(z | x, y), decoder p(x | z, y),
the ELBO with a Gaussian likelihood on the (normalised) pixels — and sends its *decoder* and
its label counts n_k,c. No real example leaves a client.

* ``variant=ens`` (FedCVAE-Ens): the server draws synthetic data from every client's decoder —
  labels from that client's own label distribution, z from the prior N(0, I), and client k's
  share of the synthetic set proportional to n_k — and trains the global classifier on it.
* ``variant=kd`` (FedCVAE-KD): the server first distils the client decoders into one server
  decoder (inputs (z, y) drawn per client as above, targets the client decoder's output, MSE),
  then draws the synthetic set from that one decoder with labels from the global label
  distribution Σ_k n_k,c, and trains the classifier.

The reparametrisation noise of client training is drawn from the client's own seeded stream.
(Before this was fixed it came from torch's global RNG, whose seed differs per process in
torch 2.14, so FedCVAE results were not reproducible; rows measured before the fix differ.)

Choices where the paper leaves room (``FedCVAEConfig`` fields): fully connected encoder and
decoder (``hidden`` units, ``latent`` dims), trained with Adam (``lr``) for ``epochs``;
``beta`` weights the KL term; the synthetic set has ``synthetic_size`` images (None = as many
as the clients hold); the classifier is ``server_model`` (else client 0's architecture),
trained with the server training config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.data.types import LabelledData, TaskInfo
from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import shared_initial_model
from oneshotfl.methods.common import BOTH
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, Method, Requires, ServerContext
from oneshotfl.protocol.limits import KnownLimit
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.protocol.spec import ArraySpec, PayloadSpec, WireDims
from oneshotfl.seeding import seeded_torch, torch_generator
from oneshotfl.training.loop import Batch, TrainConfig, fit, train_classifier
from oneshotfl.training.services import client_artefact


@dataclass(frozen=True)
class FedCVAEConfig(Params):
    """FedCVAE hyper-parameters.

    Attributes:
        variant: ``ens`` (sample every client decoder) or ``kd`` (distil them into one).
        latent: latent dimension of the CVAE.
        hidden: hidden units of encoder and decoder.
        epochs: CVAE training epochs on each client (and decoder distillation epochs).
        lr: Adam learning rate of the CVAE.
        beta: weight of the KL term of the ELBO.
        synthetic_size: synthetic images for the classifier (None = the clients' total).
    """

    variant: Literal["ens", "kd"] = "ens"
    latent: int = 16
    hidden: int = 256
    epochs: int = 20
    lr: float = 1e-3
    beta: float = 1.0
    synthetic_size: int | None = None

    def validate(self) -> None:
        require(self.latent >= 1, "latent", ">= 1", self.latent)
        require(self.hidden >= 1, "hidden", ">= 1", self.hidden)
        require(self.epochs >= 1, "epochs", ">= 1", self.epochs)
        require(self.lr > 0, "lr", "> 0", self.lr)
        require(self.beta >= 0, "beta", ">= 0", self.beta)
        size = self.synthetic_size
        require(size is None or size >= 1, "synthetic_size", ">= 1 or None", size)


class CVAE(nn.Module):
    """A fully connected conditional VAE on flattened images; ``decoder`` maps [z, onehot(y)]
    to an image."""

    def __init__(self, pixels: int, num_classes: int, latent: int, hidden: int) -> None:
        super().__init__()
        self.num_classes, self.latent = num_classes, latent
        self.encoder = nn.Sequential(nn.Linear(pixels + num_classes, hidden), nn.ReLU())
        self.mu = nn.Linear(hidden, latent)
        self.logvar = nn.Linear(hidden, latent)
        self.decoder = make_decoder(pixels, num_classes, latent, hidden)

    def forward(
        self, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, ...]:
        """Reconstruction, μ and log σ² of a batch; the reparametrisation noise is drawn
        from ``generator`` (a CPU stream), never from torch's global RNG."""
        onehot = F.one_hot(y, self.num_classes).to(x.dtype)
        h = self.encoder(torch.cat([x.flatten(1), onehot], dim=1))
        mu, logvar = self.mu(h), self.logvar(h).clamp(-10, 10)
        noise = torch.randn(mu.shape, generator=generator, dtype=mu.dtype).to(mu.device)
        z = mu + noise * torch.exp(0.5 * logvar)
        return self.decoder(torch.cat([z, onehot], dim=1)), mu, logvar


def make_decoder(pixels: int, num_classes: int, latent: int, hidden: int) -> nn.Sequential:
    """p(x | z, y): [z, onehot(y)] → hidden → hidden → pixels."""
    return nn.Sequential(
        nn.Linear(latent + num_classes, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, pixels),
    )


def elbo_loss(
    recon: torch.Tensor, x: torch.Tensor, mu: torch.Tensor, logvar: torch.Tensor, beta: float
) -> torch.Tensor:
    """Negative ELBO per example: ½‖x − x̂‖² + β·KL(N(μ, σ²) ‖ N(0, I))."""
    rec = 0.5 * ((recon - x.flatten(1)) ** 2).sum(dim=1)
    kl = -0.5 * (1 + logvar - mu**2 - logvar.exp()).sum(dim=1)
    return (rec + beta * kl).mean()


def allocate(total: int, weights: np.ndarray) -> np.ndarray:
    """Split ``total`` into integer parts proportional to ``weights`` (largest remainders)."""
    w = np.asarray(weights, dtype=np.float64)
    exact = total * w / w.sum()
    parts = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - parts), kind="stable")
    parts[order[: total - int(parts.sum())]] += 1
    return parts


@register_method("fedcvae", "FedCVAE: clients send CVAE decoders; server trains on samples")
class FedCVAE(Method[FedCVAEConfig]):
    """FedCVAE-Ens / FedCVAE-KD (Heinbaugh et al. 2023)."""

    cost = (
        "clients: one CVAE and classifier each (O(N)); server: samples from n decoders (O(n) "
        "per synthetic batch)"
    )

    known_limits = (
        KnownLimit(
            "trains the server's classifier on samples of CVAE decoders each client fits to "
            "its 450-550 images in the matrix: the samples are blurry (worst on the 16x16 RGB "
            "shapes), so the classifier stays below models trained on the real images",
            below=BOTH,
        ),
    )

    Config = FedCVAEConfig
    requires = Requires()

    def _decoder(self, task: TaskInfo) -> nn.Sequential:
        pixels = task.in_channels * task.image_size**2
        cfg = self.config
        return make_decoder(pixels, task.num_classes, cfg.latent, cfg.hidden)

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        task = TaskInfo("", dims.num_classes, dims.in_channels, dims.image_size)
        with torch.device("meta"):
            state = self._decoder(task).state_dict()
        arrays = tuple(ArraySpec(f"decoder.{k}", tuple(v.shape)) for k, v in state.items())
        most = dims.max_examples or 2**31  # N_max: no client holds more than the pool
        counts = ArraySpec("label_counts", ("C",), ("int64",), (0, most), min_sum=1, max_sum=most)
        return PayloadSpec(arrays=(*arrays, counts))

    def client_update(self, ctx: ClientContext) -> Payload:
        """The client's CVAE decoder and label counts; the CVAE is trained once per client
        and cached (both variants send the same decoder)."""
        cfg = self.config
        parts = {
            "cvae": [cfg.latent, cfg.hidden, cfg.epochs, cfg.lr, cfg.beta],
            "batch_size": ctx.train_config.batch_size,
        }
        return client_artefact(
            ctx, "cvae_decoder", parts, lambda: self._train_cvae(ctx), "CVAE decoder"
        )

    def _train_cvae(self, ctx: ClientContext) -> Payload:
        cfg, task = self.config, ctx.task
        with seeded_torch(ctx.seed, "fedcvae", ctx.client_id):
            pixels = task.in_channels * task.image_size**2
            cvae = CVAE(pixels, task.num_classes, cfg.latent, cfg.hidden)
        beta = cfg.beta
        noise = torch_generator(ctx.seed, "fedcvae", "client", ctx.client_id, "noise")

        def loss_fn(model: nn.Module, batch: Batch) -> torch.Tensor:
            x, y = batch
            recon, mu, logvar = model(x, y, noise)
            return elbo_loss(recon, x, mu, logvar, beta)

        fit(
            cvae,
            (ctx.data.x, ctx.data.y),
            loss_fn,
            TrainConfig(cfg.epochs, ctx.train_config.batch_size, cfg.lr, "adam"),
            torch_generator(ctx.seed, "fedcvae", "client", ctx.client_id),
            ctx.device,
            ctx.tracker,
            f"client {ctx.client_id} CVAE",
        )
        counts = torch.bincount(ctx.data.y, minlength=task.num_classes).numpy().astype(np.int64)
        state = cvae.decoder.state_dict()
        arrays = {f"decoder.{k}": v.detach().cpu().numpy() for k, v in state.items()}
        return Payload({**arrays, "label_counts": counts})

    def _load_decoder(self, payload: Payload, task: TaskInfo) -> nn.Sequential:
        with torch.random.fork_rng(devices=[]):  # the weights are overwritten: no RNG trace
            decoder = self._decoder(task)
        state = {
            k[len("decoder.") :]: torch.from_numpy(np.asarray(v))
            for k, v in payload.arrays.items()
            if k.startswith("decoder.")
        }
        decoder.load_state_dict(state)
        return decoder.eval()

    def _sample(
        self, decoder: nn.Module, counts: np.ndarray, n: int, task: TaskInfo, gen: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` images from ``decoder``: labels from ``counts``, z from the prior."""
        probs = torch.from_numpy(counts.astype(np.float64))
        y = torch.multinomial(probs / probs.sum(), n, replacement=True, generator=gen)
        z = torch.randn(n, self.config.latent, generator=gen, device=gen.device)
        onehot = F.one_hot(y, task.num_classes).float()
        with torch.no_grad():
            x = decoder(torch.cat([z, onehot], dim=1).to(next(decoder.parameters()).device))
        return x.view(n, task.in_channels, task.image_size, task.image_size), y

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        cfg, task, ids = self.config, ctx.task, sorted(payloads)
        decoders = {c: self._load_decoder(payloads[c], task) for c in ids}
        counts = {c: np.asarray(payloads[c].arrays["label_counts"], np.int64) for c in ids}
        sizes = np.array([counts[c].sum() for c in ids], dtype=np.float64)
        total = cfg.synthetic_size or int(sizes.sum())
        gen = torch_generator(ctx.seed, "fedcvae", "sample")
        if cfg.variant == "ens":
            parts = [
                self._sample(decoders[c], counts[c], int(n), task, gen)
                for c, n in zip(ids, allocate(total, sizes), strict=True)
                if n > 0
            ]
        else:
            server_decoder = self._distil(decoders, counts, sizes, ctx, gen)
            overall = np.sum([counts[c] for c in ids], axis=0)
            parts = [self._sample(server_decoder, overall, total, task, gen)]
        x = torch.cat([p[0] for p in parts])
        y = torch.cat([p[1] for p in parts])
        arch = ctx.server_arch or ctx.client_archs[0]
        classifier = shared_initial_model(ctx, arch)
        train_classifier(
            classifier,
            LabelledData(x, y),
            ctx.train_config,
            torch_generator(ctx.seed, "fedcvae", "classifier"),
            ctx.device,
            tracker=ctx.tracker,
            description=f"fedcvae-{cfg.variant} classifier",
        )
        info = {"variant": cfg.variant, "synthetic": len(x), "classifier": arch}
        return GlobalModel(classifier.eval(), info)

    def _distil(
        self,
        decoders: Mapping[int, nn.Module],
        counts: Mapping[int, np.ndarray],
        sizes: np.ndarray,
        ctx: ServerContext,
        gen: torch.Generator,
    ) -> nn.Module:
        """FedCVAE-KD: one server decoder trained to reproduce every client decoder on
        (z, y) drawn from the prior and that client's label distribution (MSE)."""
        task, cfg = ctx.task, self.config
        total = cfg.synthetic_size or int(sizes.sum())
        inputs, targets = [], []
        for c, n in zip(sorted(decoders), allocate(total, sizes), strict=True):
            if n == 0:
                continue
            probs = torch.from_numpy(counts[c].astype(np.float64))
            y = torch.multinomial(probs / probs.sum(), int(n), replacement=True, generator=gen)
            z = torch.randn(int(n), cfg.latent, generator=gen)
            zy = torch.cat([z, F.one_hot(y, task.num_classes).float()], dim=1)
            with torch.no_grad():
                targets.append(decoders[c](zy))
            inputs.append(zy)
        with seeded_torch(ctx.seed, "fedcvae", "server-decoder"):
            student = self._decoder(task)

        def loss_fn(model: nn.Module, batch: Batch) -> torch.Tensor:
            zy, target = batch
            return F.mse_loss(model(zy), target)

        fit(
            student,
            (torch.cat(inputs), torch.cat(targets)),
            loss_fn,
            TrainConfig(cfg.epochs, ctx.train_config.batch_size, cfg.lr, "adam"),
            torch_generator(ctx.seed, "fedcvae", "distil"),
            ctx.device,
            ctx.tracker,
            "fedcvae-kd server decoder",
        )
        return student.cpu().eval()
