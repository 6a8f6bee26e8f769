"""A shared frozen image autoencoder: a registry of sources, a small convolutional KL
autoencoder, its pretraining on the public pool, and its saved file.

Methods that send latent codes instead of images (FedSD2C: clients optimise a latent ``z`` so
that the decoded image matches what their model sees, and upload ``z``; the server decodes it)
need an encoder ``E`` and a decoder ``D`` every party holds identically. This is the layer's
second kind of shared artefact, next to the frozen feature encoders of :mod:`.base`, built
from a spec string the same way:

* ``public[:channels=4:downsample=4:width=32:epochs=5:min_steps=500:batch_size=64:…]``
  (also ``lr``, ``kl``) — pretrained on the federation's public pool (its images, no labels)
  from the model seed, computed once per pool and settings and kept in the artefact cache
  (under the store's :meth:`~oneshotfl.training.artefacts.ArtefactStore.public` view: a party
  finds on disk the one another party computed);
* ``file:path=FILE[:sha256=HASH]`` — a file written by ``oneshotfl encoder autoencoder`` (or
  :func:`save_autoencoder`), its content hash recomputed on load and checked.

The model (:class:`ConvAutoencoder`) is shaped like Stable Diffusion's KL autoencoder at a
small scale: the encoder halves the side ``log2(downsample)`` times with stride-2 4×4 convs
(SiLU between) and outputs a diagonal Gaussian posterior, mean and log-variance, of
``channels`` latent maps; the decoder mirrors it with transposed convs and a sigmoid. It reads
and writes the task's *normalised* inputs and works in pixel space ``[0, 1]`` inside, as the
VAE of FedSD2C's authors is fed pixels; the latent of an image is the posterior mean. Its
pretraining minimises the pixel MSE of a sampled reconstruction plus ``kl`` × the KL to N(0, I)
(Stable Diffusion also uses a perceptual and an adversarial loss; neither is available here).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.data.types import TaskInfo
from oneshotfl.encoders.base import EncoderError, parse_encoder_spec, registered, take_options
from oneshotfl.encoders.pretrain import checked_file, content_hash, read_metadata, save_encoder
from oneshotfl.fingerprints import tensor_fingerprint
from oneshotfl.models.generator import input_statistics
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.registry import Registry
from oneshotfl.seeding import seeded_torch, torch_generator
from oneshotfl.training import optim
from oneshotfl.training.artefacts import ArtefactStore
from oneshotfl.training.progress import NullTracker, Tracker

ARCH = "conv-kl-autoencoder"


@dataclass(frozen=True)
class AutoencoderConfig(Params):
    """The autoencoder's shape and its pretraining.

    Attributes:
        channels: latent maps.
        downsample: how many times smaller the latent's side is than the image's (a power
            of 2; the image side must be a multiple of it).
        width: channels of every hidden conv layer.
        epochs: pretraining passes over the public pool, at least.
        min_steps: the fewest optimiser steps: a small pool gets more passes (as the
            federation's ``min_steps`` floor does for a small client).
        batch_size: images per pretraining step.
        lr: Adam's learning rate.
        kl: the weight of the KL term.
        seed: initialisation and batch-order seed.
    """

    channels: int = 4
    downsample: int = 4
    width: int = 32
    epochs: int = 5
    min_steps: int = 500
    batch_size: int = 64
    lr: float = 1e-3
    kl: float = 1e-6
    seed: int = 0

    def validate(self) -> None:
        require(1 <= self.channels <= 64, "channels", "in [1, 64]", self.channels)
        power = self.downsample >= 1 and self.downsample & (self.downsample - 1) == 0
        require(power and self.downsample <= 16, "downsample", "1, 2, 4, 8 or 16", self.downsample)
        require(1 <= self.width <= 512, "width", "in [1, 512]", self.width)
        require(self.epochs >= 0, "epochs", ">= 0", self.epochs)
        require(self.min_steps >= 0, "min_steps", ">= 0", self.min_steps)
        require(self.batch_size >= 1, "batch_size", ">= 1", self.batch_size)
        require(self.lr > 0, "lr", "> 0", self.lr)
        require(self.kl >= 0, "kl", ">= 0", self.kl)


class ConvAutoencoder(nn.Module):
    """Normalised images ``[N, CH, H, W]`` ⇄ latents ``[N, channels, H/downsample, W/downsample]``
    (see the module docs)."""

    def __init__(self, task: TaskInfo, cfg: AutoencoderConfig) -> None:
        super().__init__()
        stages, ch, w = cfg.downsample.bit_length() - 1, task.in_channels, cfg.width
        down: list[nn.Module] = [nn.Conv2d(ch, w, 3, padding=1)]
        up: list[nn.Module] = [nn.Conv2d(cfg.channels, w, 3, padding=1)]
        for _ in range(stages):
            down += [nn.SiLU(), nn.Conv2d(w, w, 4, stride=2, padding=1)]
            up += [nn.SiLU(), nn.ConvTranspose2d(w, w, 4, stride=2, padding=1)]
        self.encoder = nn.Sequential(*down, nn.SiLU(), nn.Conv2d(w, 2 * cfg.channels, 3, padding=1))
        self.decoder = nn.Sequential(*up, nn.SiLU(), nn.Conv2d(w, ch, 3, padding=1))
        stats = input_statistics(task)
        self.mean: torch.Tensor
        self.std: torch.Tensor
        # the task's normalisation, not weights: never saved, never part of the content hash
        self.register_buffer("mean", torch.tensor(stats.mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(stats.std).view(1, -1, 1, 1), persistent=False)

    def to_pixels(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised inputs → pixels, clamped to [0, 1]."""
        return (x * self.std + self.mean).clamp(0, 1)

    def from_pixels(self, p: torch.Tensor) -> torch.Tensor:
        """Pixels → normalised inputs."""
        return (p - self.mean) / self.std

    def posterior(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The posterior's (mean, log-variance) of normalised inputs ``x``."""
        mean, logvar = self.encoder(self.to_pixels(x)).chunk(2, dim=1)
        return mean, logvar.clamp(-30.0, 20.0)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The latent of ``x``: its posterior's mean."""
        return self.posterior(x)[0]

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Latents → normalised images (decoded pixels in (0, 1), renormalised)."""
        return self.from_pixels(torch.sigmoid(self.decoder(z)))


def autoencoder_loss(
    model: ConvAutoencoder, x: torch.Tensor, noise: torch.Tensor, kl: float
) -> torch.Tensor:
    """MSE(pixels of D(μ + σ·ε), pixels of x) + kl · mean KL(N(μ, σ²) ‖ N(0, I))."""
    mean, logvar = model.posterior(x)
    z = mean + torch.exp(0.5 * logvar) * noise
    recon = torch.sigmoid(model.decoder(z))
    divergence = 0.5 * (mean.square() + logvar.exp() - 1 - logvar).mean()
    return F.mse_loss(recon, model.to_pixels(x)) + kl * divergence


def pretrain_autoencoder(
    images: torch.Tensor,
    task: TaskInfo,
    cfg: AutoencoderConfig,
    device: torch.device,
    tracker: Tracker | None = None,
) -> tuple[ConvAutoencoder, list[float]]:
    """Train the autoencoder on ``images`` (normalised, no labels) with Adam; returns it (CPU,
    eval, frozen) and the mean loss of every epoch."""
    check_side(task, cfg.downsample, "autoencoder")
    if len(images) < 1:
        raise ValueError("autoencoder pretraining needs at least 1 public image, got 0")
    with seeded_torch(cfg.seed, "autoencoder", "init"):
        model = ConvAutoencoder(task, cfg)
    model.to(device).train()
    optimizer = optim.Adam(list(model.parameters()), lr=cfg.lr)
    order_gen = torch_generator(cfg.seed, "autoencoder", "batches")
    noise_gen = torch_generator(cfg.seed, "autoencoder", "noise")
    batch = min(cfg.batch_size, len(images))
    steps = max(1, len(images) // batch)
    epochs = max(cfg.epochs, -(-cfg.min_steps // steps))
    losses: list[float] = []
    progress = (tracker or NullTracker()).task("autoencoder pretraining", epochs * steps)
    with progress as advance:
        for _ in range(epochs):
            order = torch.randperm(len(images), generator=order_gen)
            total = 0.0
            for s in range(steps):
                x = images[order[s * batch : (s + 1) * batch]].to(device)
                side = task.image_size // cfg.downsample
                noise = torch.randn(len(x), cfg.channels, side, side, generator=noise_gen)
                loss = autoencoder_loss(model, x, noise.to(device), cfg.kl)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                total += float(loss.detach())
                advance(1)
            losses.append(total / steps)
    return frozen(model.cpu()), losses


def frozen(model: ConvAutoencoder) -> ConvAutoencoder:
    """``model`` in eval mode with no parameter requiring gradients."""
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


def auto_downsample(side: int) -> int:
    """The largest of 8, 4, 2 and 1 that divides ``side`` and leaves a latent side of 4 or
    more: 4 for 28-pixel images (7 × 7 latents), 8 for 32 (4 × 4), 2 for 8 (4 × 4)."""
    return next((d for d in (8, 4, 2) if side % d == 0 and side // d >= 4), 1)


def check_side(task: TaskInfo, downsample: int, spec: str) -> None:
    """Raise :class:`EncoderError` unless the task's images can be downsampled so."""
    if task.image_size % downsample:
        raise EncoderError(
            f"autoencoder {spec!r}: expected an image side that is a multiple of downsample="
            f"{downsample}, got {task.image_size}"
        )


@dataclass(frozen=True)
class Autoencoder:
    """A built autoencoder and what identifies it.

    Attributes:
        spec: the spec string it was built from.
        model: the frozen module (CPU, eval).
        config: its shape (and, for ``public``, its pretraining).
        fingerprint: SHA-256 over its weights (:func:`~.pretrain.content_hash`): every party
            must hold the same.
        info: provenance for the run's record.
    """

    spec: str
    model: ConvAutoencoder
    config: AutoencoderConfig
    fingerprint: str
    info: dict[str, object] = field(default_factory=dict)

    def decoded(self, z: torch.Tensor, device: torch.device, batch: int = 512) -> torch.Tensor:
        """The normalised images of latents ``z``, decoded on ``device`` ``batch`` at a time
        without gradients, on the CPU."""
        coder = self.model.to(device)
        with torch.no_grad():
            parts = [coder.decode(chunk.to(device)).cpu() for chunk in z.split(batch)]
        return torch.cat(parts) if parts else torch.empty(0)

    def latent_shape(self, image_size: int) -> tuple[int, int, int]:
        """``(channels, side, side)`` of one image's latent."""
        side = image_size // self.config.downsample
        return self.config.channels, side, side


@dataclass(frozen=True)
class AutoencoderContext:
    """What a source may use: the task, the model seed, the public pool's images (or
    ``None``), the artefact cache and the device."""

    task: TaskInfo
    seed: int
    spec: str
    public: torch.Tensor | None
    store: ArtefactStore | None
    device: torch.device


AUTOENCODERS: Registry[Callable[[Mapping[str, str], AutoencoderContext], Autoencoder]] = Registry(
    "autoencoder"
)

SHAPE_OPTIONS: dict[str, Callable[[str], object]] = {
    "channels": int,
    "downsample": int,
    "width": int,
}


def build_autoencoder(
    spec: str,
    task: TaskInfo,
    seed: int,
    *,
    public: torch.Tensor | None = None,
    store: ArtefactStore | None = None,
    device: torch.device | None = None,
) -> Autoencoder:
    """Build the autoencoder ``spec`` names (raises :class:`EncoderError`)."""
    factory, options = registered(AUTOENCODERS, spec, "autoencoder")
    ctx = AutoencoderContext(task, seed, spec, public, store, device or torch.device("cpu"))
    return factory(options, ctx)


def spec_latent_shape(spec: str, image_size: int) -> tuple[int, int, int]:
    """``(channels, side, side)`` of the latent of one image under the autoencoder ``spec``
    names, without building it (a ``file`` source's shape is read from its file's header), so
    a payload of latents can be specified exactly.

    Raises:
        EncoderError: for a spec that names no autoencoder, or a file that cannot be read.
    """
    name, options = parse_encoder_spec(spec)
    if name == "file":
        path = Path(options.get("path", "")).expanduser()
        try:
            meta = read_metadata(path)
        except Exception as exc:  # safetensors raises its own error types
            raise EncoderError(f"autoencoder {spec!r}: cannot read {path} ({exc})") from None
        shape = {k: meta.get(k) for k in ("channels", "downsample")}
    elif name == "public":
        shape = {k: options.get(k) for k in ("channels", "downsample") if k in options}
    else:
        raise EncoderError(
            f"unknown autoencoder {name!r}; expected one of: {', '.join(AUTOENCODERS.names())}"
        )
    try:
        cfg = AutoencoderConfig(**{k: int(str(v)) for k, v in shape.items()})
    except (TypeError, ValueError) as exc:
        raise EncoderError(f"autoencoder {spec!r}: {exc}") from None
    side = image_size // cfg.downsample
    return cfg.channels, side, side


def _config(spec: str, values: Mapping[str, object], seed: int) -> AutoencoderConfig:
    try:
        return AutoencoderConfig(**values, seed=seed)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise EncoderError(f"autoencoder {spec!r}: {exc}") from None


@AUTOENCODERS.register("public", "pretrained on the federation's public pool (cached)")
def public_autoencoder(options: Mapping[str, str], ctx: AutoencoderContext) -> Autoencoder:
    """Options: the :class:`AutoencoderConfig` fields but ``seed`` (the model seed)."""
    allowed: dict[str, Callable[[str], object]] = {
        **SHAPE_OPTIONS,
        **{"epochs": int, "min_steps": int, "batch_size": int, "lr": float, "kl": float},
    }
    cfg = _config(ctx.spec, take_options(ctx.spec, options, allowed), ctx.seed)
    check_side(ctx.task, cfg.downsample, ctx.spec)
    if ctx.public is None or len(ctx.public) < 1:
        raise EncoderError(
            f"autoencoder {ctx.spec!r}: it pretrains on the public pool; expected "
            f"public_size >= 1, got 0 (or give a file: file:path=…)"
        )
    images = ctx.public
    parts = {
        "recipe": "conv-kl-autoencoder-v1",
        "public": tensor_fingerprint(images),
        "task": [ctx.task.in_channels, ctx.task.image_size, ctx.task.dataset],
        **dataclasses.asdict(cfg),
    }

    def make() -> Payload:
        model, losses = pretrain_autoencoder(images, ctx.task, cfg, ctx.device)
        state = {k: v.numpy() for k, v in model.state_dict().items()}
        return Payload(state, {"losses": json.dumps([round(v, 6) for v in losses])})

    store = ctx.store.public() if ctx.store is not None else ArtefactStore()
    payload, hit = store.get_or_make("autoencoder", parts, make, "autoencoder")
    model = ConvAutoencoder(ctx.task, cfg)
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in payload.arrays.items()})
    losses = json.loads(str(payload.scalars["losses"]))
    info = {
        "public_fingerprint": parts["public"],
        "pretrain_losses_first_last": losses[:1] + losses[-1:],
        "cache_hit": hit,
    }
    return Autoencoder(ctx.spec, frozen(model), cfg, content_hash(model.state_dict()), info)


def save_autoencoder(auto: Autoencoder, path: Path, metadata: Mapping[str, object]) -> str:
    """Write the autoencoder's weights with its shape and ``metadata``; returns its hash."""
    shape = {k: getattr(auto.config, k) for k in SHAPE_OPTIONS}
    task = auto.model.mean.shape[1]
    meta = {**metadata, "arch": ARCH, "in_channels": task, **shape}
    return save_encoder(auto.model, path, meta)


@AUTOENCODERS.register("file", "saved by `oneshotfl encoder autoencoder` (hash-checked)")
def file_autoencoder(options: Mapping[str, str], ctx: AutoencoderContext) -> Autoencoder:
    """Options: ``path`` (required), ``sha256`` (the expected content hash; checked)."""
    spec = ctx.spec
    path, meta, state, actual = checked_file(spec, options, "autoencoder", ARCH)
    if meta.get("in_channels") != ctx.task.in_channels:
        raise EncoderError(
            f"autoencoder {spec!r}: built for {meta.get('in_channels')!r} input channels, the "
            f"task has {ctx.task.in_channels}"
        )
    shape = {k: meta.get(k) for k in SHAPE_OPTIONS}
    if not all(isinstance(v, int) for v in shape.values()):
        raise EncoderError(f"autoencoder {spec!r}: expected integer {sorted(shape)}, got {shape}")
    cfg = _config(spec, shape, ctx.seed)
    check_side(ctx.task, cfg.downsample, spec)
    model = ConvAutoencoder(ctx.task, cfg)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:  # missing, unexpected or wrongly shaped tensors
        first = str(exc).strip().splitlines()[-1].strip()
        raise EncoderError(
            f"autoencoder {spec!r}: {path} does not fit its shape ({first})"
        ) from None
    return Autoencoder(spec, frozen(model), cfg, actual, {"file": str(path)})
