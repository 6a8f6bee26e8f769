"""Label-free encoder pretraining on the public pool (SimCLR), and the saved-encoder source.

``oneshotfl encoder pretrain`` trains the registry's small conv encoder (the architecture of
the ``random`` control) with SimCLR (Chen et al. 2020, "A Simple Framework for Contrastive
Learning of Visual Representations", ICML): two random views of every public image — a
random resized crop (scale 0.6–1, aspect 3/4–4/3) with a horizontal flip, then Gaussian pixel
noise — pass through the encoder and a 2-layer projection head; the NT-Xent loss (temperature
``temperature``) pulls the two views of an image together and pushes the other 2B−2 images of
the batch away. Only the public pool's *images* are used: no labels exist there.

The result is a safetensors file holding the encoder's weights and, as metadata, its
architecture, embedding size, objective, the fingerprint of the public pool it saw, and a
SHA-256 ``content_hash`` over the weights. The ``file`` encoder source recomputes that hash
on load and, when the spec names one (``file:path=…:sha256=…``), checks it: every client and
the server then provably hold the same encoder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from oneshotfl.data.types import TaskInfo
from oneshotfl.encoders.base import (
    ENCODERS,
    Encoder,
    EncoderContext,
    EncoderError,
    Preprocess,
    take_options,
)
from oneshotfl.encoders.sources import conv_encoder
from oneshotfl.fingerprints import tensor_fingerprint
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.seeding import seeded_torch, torch_generator
from oneshotfl.training import optim
from oneshotfl.training.artefacts import ArtefactStore
from oneshotfl.training.progress import NullTracker, Tracker


@dataclass(frozen=True)
class PretrainConfig(Params):
    """SimCLR settings.

    Attributes:
        dim: embedding size (a multiple of 4).
        width: channels of the first conv layer.
        epochs: passes over the public pool.
        batch_size: images per batch (2× views).
        lr: Adam learning rate.
        temperature: NT-Xent temperature.
        seed: initialisation and augmentation seed.
    """

    dim: int = 64
    width: int = 32
    epochs: int = 20
    batch_size: int = 256
    lr: float = 1e-3
    temperature: float = 0.5
    seed: int = 0

    def validate(self) -> None:
        require(self.dim >= 4 and self.dim % 4 == 0, "dim", "a positive multiple of 4", self.dim)
        for name in ("width", "epochs"):
            require(getattr(self, name) >= 1, name, ">= 1", getattr(self, name))
        require(self.batch_size >= 2, "batch_size", ">= 2 (negatives)", self.batch_size)
        require(self.lr > 0, "lr", "> 0", self.lr)
        require(self.temperature > 0, "temperature", "> 0", self.temperature)


def augment(
    x: torch.Tensor,
    generator: torch.Generator,
    scale: tuple[float, float] = (0.6, 1.0),
    noise: float = 0.1,
    per_batch: bool = False,
) -> torch.Tensor:
    """A random resized crop with horizontal flip (one affine warp) plus Gaussian noise.

    Args:
        x: images ``[N, C, H, W]``.
        generator: the draws' stream, on its own device (the same stream wherever ``x`` lies);
            the warp and the noise are then moved to ``x``'s device.
        scale: the range of the crop's area as a fraction of the image's.
        noise: the Gaussian noise's standard deviation (0: none, and no draw for it).
        per_batch: one crop and flip for the whole batch (as a batch-wide torchvision
            transform draws), instead of one per image.
    """
    n, at = (1 if per_batch else len(x)), generator.device
    area = torch.empty(n, device=at).uniform_(scale[0], scale[1], generator=generator)
    side = area.sqrt()
    log_aspect = torch.empty(n, device=at).uniform_(
        math.log(3 / 4), math.log(4 / 3), generator=generator
    )
    aspect = torch.exp(log_aspect)
    sx, sy = side * aspect.sqrt(), side / aspect.sqrt()
    tx = (1 - sx) * (2 * torch.rand(n, generator=generator, device=at) - 1)
    ty = (1 - sy) * (2 * torch.rand(n, generator=generator, device=at) - 1)
    flip = torch.where(torch.rand(n, generator=generator, device=at) < 0.5, -1.0, 1.0)
    theta = torch.zeros(n, 2, 3, device=at)
    theta[:, 0, 0], theta[:, 0, 2] = sx * flip, tx
    theta[:, 1, 1], theta[:, 1, 2] = sy, ty
    theta = theta.expand(len(x), 2, 3)
    grid = F.affine_grid(theta.to(x.device), list(x.shape), align_corners=False)
    warped = F.grid_sample(x, grid, padding_mode="border", align_corners=False)
    if noise <= 0:
        return warped
    drawn = torch.randn(x.shape, generator=generator, device=at)
    return warped + noise * drawn.to(x.device)


def nt_xent(a: torch.Tensor, b: torch.Tensor, temperature: float) -> torch.Tensor:
    """SimCLR's NT-Xent loss for the projections ``a``, ``b`` of two views ``[B, k]``."""
    z = F.normalize(torch.cat([a, b]), dim=1)
    sim = z @ z.T / temperature
    sim.fill_diagonal_(float("-inf"))
    n = len(a)
    targets = torch.cat([torch.arange(n, 2 * n, device=a.device), torch.arange(n, device=a.device)])
    return F.cross_entropy(sim, targets)


def content_hash(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over names, shapes, dtypes and bytes of a state dict."""
    digest = hashlib.sha256()
    for name in sorted(state):
        array = np.ascontiguousarray(state[name].detach().cpu().numpy())
        digest.update(f"{name}:{array.dtype}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def pretrain_encoder(
    images: torch.Tensor,
    task: TaskInfo,
    cfg: PretrainConfig,
    device: torch.device,
    tracker: Tracker | None = None,
) -> tuple[nn.Module, list[float]]:
    """Train the conv encoder with SimCLR on ``images`` (no labels); returns it (CPU, eval)
    and the mean loss of every epoch."""
    if len(images) < 2:
        raise ValueError(f"pretraining needs at least 2 public images, got {len(images)}")
    with seeded_torch(cfg.seed, "pretrain", "init"):
        encoder = conv_encoder(task.in_channels, cfg.dim, cfg.width)
        projector = nn.Sequential(nn.Linear(cfg.dim, 128), nn.ReLU(), nn.Linear(128, 64))
    encoder.to(device).train()
    projector.to(device).train()
    params = [*encoder.parameters(), *projector.parameters()]
    optimizer = optim.Adam(params, lr=cfg.lr)
    generator = torch_generator(cfg.seed, "pretrain", "batches")
    augment_gen = torch_generator(cfg.seed, "pretrain", "augment")
    batch = min(cfg.batch_size, len(images))
    steps = len(images) // batch
    losses: list[float] = []
    progress = (tracker or NullTracker()).task("encoder pretraining (SimCLR)", cfg.epochs * steps)
    with progress as advance:
        for _ in range(cfg.epochs):
            order = torch.randperm(len(images), generator=generator)
            total = 0.0
            for s in range(steps):
                x = images[order[s * batch : (s + 1) * batch]]
                a, b = augment(x, augment_gen).to(device), augment(x, augment_gen).to(device)
                loss = nt_xent(projector(encoder(a)), projector(encoder(b)), cfg.temperature)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                total += float(loss.detach())
                advance(1)
            losses.append(total / steps)
    return encoder.cpu().eval(), losses


def save_encoder(module: nn.Module, path: Path, metadata: Mapping[str, Any]) -> str:
    """Write the encoder weights and metadata as safetensors; returns the content hash."""
    state = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    digest = content_hash(state)
    meta = {k: json.dumps(v) for k, v in {**metadata, "content_hash": digest}.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path), metadata=meta)
    return digest


def read_metadata(path: Path) -> dict[str, Any]:
    """The metadata of a saved encoder file."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        raw = handle.metadata() or {}
    return {k: json.loads(v) for k, v in raw.items()}


def checked_file(
    spec: str, options: Mapping[str, str], what: str, arch: str
) -> tuple[Path, dict[str, Any], dict[str, torch.Tensor], str]:
    """The saved weights a ``file`` source names (options ``path``, required, and ``sha256``):
    ``(path, metadata, state, content hash)``, the hash recomputed and checked against the
    stored and the requested one, and the metadata's ``arch`` against ``arch``.

    Raises:
        EncoderError: naming ``what`` ("encoder", "autoencoder") and what was expected.
    """
    opts = take_options(spec, options, {"path": str, "sha256": str})
    if "path" not in opts:
        raise EncoderError(f"{what} {spec!r}: expected path=FILE")
    path = Path(opts["path"]).expanduser()
    if not path.is_file():
        raise EncoderError(f"{what} {spec!r}: no {what} file at {path}")
    try:
        meta = read_metadata(path)
        state = load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types
        raise EncoderError(f"{what} {spec!r}: {path} is not an {what} file ({exc})") from None
    if meta.get("arch") != arch:
        raise EncoderError(f"{what} {spec!r}: expected arch {arch!r}, got {meta.get('arch')!r}")
    actual = content_hash(state)
    for name, wanted in (("stored", meta.get("content_hash")), ("requested", opts.get("sha256"))):
        if wanted is not None and wanted != actual:
            raise EncoderError(
                f"{what} {spec!r}: content hash {actual[:16]}… does not match the {name} "
                f"hash {str(wanted)[:16]}… (a different or corrupted file)"
            )
    return path, meta, state, actual


@ENCODERS.register("file", "an encoder saved by `oneshotfl encoder pretrain` (hash-checked)")
def file_encoder(options: Mapping[str, str], ctx: EncoderContext) -> Encoder:
    """Options: ``path`` (required), ``sha256`` (the expected content hash; checked)."""
    task, spec = ctx.task, ctx.spec
    path, meta, state, actual = checked_file(spec, options, "encoder", "conv")
    if int(meta.get("in_channels", -1)) != task.in_channels:
        raise EncoderError(
            f"encoder {spec!r}: built for {meta.get('in_channels')} input channels, the task "
            f"has {task.in_channels}"
        )
    try:
        dim, width = int(meta["dim"]), int(meta["width"])
    except (KeyError, TypeError, ValueError):
        raise EncoderError(
            f"encoder {spec!r}: {path} lacks integer 'dim' and 'width' metadata (got "
            f"dim={meta.get('dim')!r}, width={meta.get('width')!r}); write it with "
            "`oneshotfl encoder pretrain`"
        ) from None
    module = conv_encoder(task.in_channels, dim, width)
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:  # missing, unexpected or wrongly shaped tensors
        first = str(exc).strip().splitlines()[-1].strip()
        raise EncoderError(
            f"encoder {spec!r}: {path} does not hold a conv encoder of dim {dim} and width "
            f"{width} ({first})"
        ) from None
    encoder = Encoder(spec, module, dim, Preprocess(), task, fingerprint=actual)
    encoder.info.update({"file": str(path), "objective": meta.get("objective")})
    return encoder


@ENCODERS.register(
    "simclr", "the conv encoder pretrained with SimCLR on this federation's public pool (cached)"
)
def simclr_encoder(options: Mapping[str, str], ctx: EncoderContext) -> Encoder:
    """The conv encoder trained by :func:`pretrain_encoder` on the federation's public pool —
    its images only, no labels — from the model seed; computed once per pool and settings
    and kept in the artefact cache. Options: the :class:`PretrainConfig` fields ``dim``,
    ``width``, ``epochs``, ``batch_size``, ``lr``, ``temperature``.

    Every party can derive the same encoder from the public pool and the seed; in a
    deployment, ship the file of ``oneshotfl encoder pretrain`` instead (``file`` source).
    """
    fields = {"dim": int, "width": int, "epochs": int, "batch_size": int}
    opts = take_options(ctx.spec, options, {**fields, "lr": float, "temperature": float})
    if ctx.public is None or len(ctx.public) < 2:
        raise EncoderError(
            f"encoder {ctx.spec!r}: SimCLR pretrains on the public pool; expected "
            f"public_size >= 2, got {0 if ctx.public is None else len(ctx.public)}"
        )
    try:
        cfg = PretrainConfig(**opts, seed=ctx.seed)
    except ValueError as exc:
        raise EncoderError(f"encoder {ctx.spec!r}: {exc}") from None
    images = ctx.public
    parts = {
        "recipe": "simclr-conv-v1",
        "public": tensor_fingerprint(images),
        "in_channels": ctx.task.in_channels,
        **dataclasses.asdict(cfg),
    }

    def make() -> Payload:
        module, losses = pretrain_encoder(images, ctx.task, cfg, ctx.device)
        state = {k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}
        return Payload(state, {"losses": json.dumps([round(v, 5) for v in losses])})

    store = ctx.store if ctx.store is not None else ArtefactStore()
    payload, hit = store.get_or_make("encoder", parts, make, "SimCLR encoder")
    module = conv_encoder(ctx.task.in_channels, cfg.dim, cfg.width)
    module.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in payload.arrays.items()})
    digest = content_hash(module.state_dict())
    encoder = Encoder(ctx.spec, module, cfg.dim, Preprocess(), ctx.task, fingerprint=digest)
    losses = json.loads(str(payload.scalars["losses"]))
    encoder.info.update(
        {
            "objective": "simclr",
            "public_fingerprint": parts["public"],
            "pretrain_loss_first_last": [losses[0], losses[-1]],
            "pretrain_cache_hit": hit,
        }
    )
    return encoder
