"""Registered encoder sources: a random frozen control and ImageNet torchvision backbones."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from oneshotfl.encoders.base import (
    ENCODERS,
    Encoder,
    EncoderContext,
    EncoderError,
    Preprocess,
    take_options,
)
from oneshotfl.seeding import seeded_torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def conv_encoder(in_channels: int, dim: int, width: int) -> nn.Module:
    """The small conv encoder of the ``random`` control and of ``encoder pretrain``: two 3×3
    convs (``width``, then ``dim``/4 channels) with ReLU and a max-pool between them, then
    average pooling to 2×2 and flattening to ``dim``."""
    return nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, dim // 4, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
    )


@ENCODERS.register("random", "a randomly initialised 2-conv net, frozen (the control)")
def random_encoder(options: Mapping[str, str], ctx: EncoderContext) -> Encoder:
    """Two 3×3 conv layers (``width`` then ``dim``/4 channels) with ReLU and max-pooling
    between them, then average pooling to a 2×2 grid: a d = ``dim`` embedding that keeps
    coarse spatial layout but knows nothing of any data. Its weights come from the model
    seed, so every party derives the same ones."""
    task, seed, spec = ctx.task, ctx.seed, ctx.spec
    opts = take_options(spec, options, {"dim": int, "width": int})
    dim, width = int(opts.get("dim", 64)), int(opts.get("width", 32))
    if dim < 4 or dim % 4 or width < 1:
        raise EncoderError(
            f"encoder {spec!r}: expected dim a positive multiple of 4 and width >= 1, "
            f"got dim={dim}, width={width}"
        )
    with seeded_torch(seed, "encoder", "random", dim, width):
        module = conv_encoder(task.in_channels, dim, width)
    return Encoder(spec, module, dim, Preprocess(), task)


@ENCODERS.register("identity", "the flattened image (positive control of the inversion audit)")
def identity_encoder(options: Mapping[str, str], ctx: EncoderContext) -> Encoder:
    """z = x flattened (d = C·H·W): trivially invertible, so an inversion attack that fails
    on it is broken. Not for learning — for auditing the attack."""
    task, spec = ctx.task, ctx.spec
    take_options(spec, options, {})
    dim = task.in_channels * task.image_size * task.image_size
    return Encoder(spec, nn.Flatten(), dim, Preprocess(), task)


#: The backbones of FedAGE's Table 3: embedding size and how to cut the classifier off.
TORCHVISION_BACKBONES: dict[str, int] = {
    "resnet18": 512,
    "mobilenet_v2": 1280,
    "squeezenet1_1": 512,
    "vgg19": 512,
}


def feature_extractor(arch: str, model: nn.Module) -> nn.Module:
    """The convolutional part of a torchvision classifier ``model``: images → ``[N, d]``."""
    if arch == "resnet18":  # every block up to and including the global average pool
        return nn.Sequential(*list(model.children())[:-1], nn.Flatten())
    features = model.features  # mobilenet_v2, squeezenet1_1, vgg19
    if not isinstance(features, nn.Module):
        raise EncoderError(f"torchvision {arch}: expected a 'features' module")
    return nn.Sequential(features, nn.AdaptiveAvgPool2d(1), nn.Flatten())


def imagenet_preprocess(size: int) -> Preprocess:
    """Resize to ``size`` px, repeat grey to 3 channels, normalise with ImageNet's constants."""
    return Preprocess(size=size, channels=3, mean=IMAGENET_MEAN, std=IMAGENET_STD)


def cached_weights_path(arch: str) -> Path:
    """Where ``torchvision`` keeps the ImageNet weights of ``arch`` (the torch hub cache,
    ``$TORCH_HOME/hub/checkpoints``)."""
    import torchvision  # here: its import (≈ 1.3 s) is paid by torchvision encoders only

    url = torchvision.models.get_model_weights(arch).DEFAULT.url
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(url)


@ENCODERS.register(
    "torchvision", "ImageNet backbone (resnet18, mobilenet_v2, squeezenet1_1, vgg19), frozen"
)
def torchvision_encoder(options: Mapping[str, str], ctx: EncoderContext) -> Encoder:
    """The convolutional part of an ImageNet-pretrained torchvision backbone.

    Options: ``arch`` (one of :data:`TORCHVISION_BACKBONES`), ``weights`` (a local state-dict
    file; default: the torch hub cache, see :func:`cached_weights_path`), ``size`` (input
    resize, default 224), ``project`` (a random, never-trained linear map of the features to
    this many dimensions — what FedAGE's authors put after ResNet-18, ``backbones.py``:
    ``nn.Linear(512, 64)`` — seeded by the model seed, so every party builds the same one).
    Grey images are repeated to 3 channels; pixels are renormalised from the dataset's
    constants to ImageNet's. Nothing is downloaded.
    """
    task, spec = ctx.task, ctx.spec
    opts = take_options(spec, options, {"arch": str, "weights": str, "size": int, "project": int})
    arch = str(opts.get("arch", "resnet18"))
    if arch not in TORCHVISION_BACKBONES:
        raise EncoderError(
            f"encoder {spec!r}: expected arch in {sorted(TORCHVISION_BACKBONES)}, got {arch!r}"
        )
    path = Path(opts["weights"]).expanduser() if "weights" in opts else cached_weights_path(arch)
    if not path.is_file():
        raise EncoderError(
            f"encoder {spec!r}: ImageNet weights for {arch} not found at {path}. Pass "
            f"weights=PATH to a state-dict file, or place torchvision's file there (on a "
            f"machine with a network: torchvision.models.{arch}(weights='DEFAULT') fills "
            f"the cache {path.parent})"
        )
    import torchvision

    model = torchvision.models.get_model(arch, weights=None)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except (RuntimeError, OSError, KeyError, TypeError) as exc:
        raise EncoderError(
            f"encoder {spec!r}: {path} is not a {arch} state dict ({exc.__class__.__name__}: "
            f"{str(exc)[:200]})"
        ) from None
    size = int(opts.get("size", 224))
    if size < 16:
        raise EncoderError(f"encoder {spec!r}: expected size >= 16, got {size}")
    pre = imagenet_preprocess(size)
    module, dim = feature_extractor(arch, model), TORCHVISION_BACKBONES[arch]
    if "project" in opts:
        module, dim = random_projection(module, dim, int(opts["project"]), ctx.seed, spec)
    encoder = Encoder(spec, module, dim, pre, task)
    encoder.info["weights"] = str(path)
    return encoder


def random_projection(
    module: nn.Module, dim: int, out: int, seed: int, spec: str
) -> tuple[nn.Module, int]:
    """``module`` followed by a random ``Linear(dim, out)`` (PyTorch's default
    initialisation from the seeded stream ``("encoder", "project", dim, out)``; never
    trained: the encoder stays frozen).

    Raises:
        EncoderError: for ``out < 1``.
    """
    if out < 1:
        raise EncoderError(f"encoder {spec!r}: expected project >= 1, got {out}")
    with seeded_torch(seed, "encoder", "project", dim, out):
        projection = nn.Linear(dim, out)
    return nn.Sequential(module, projection), out
