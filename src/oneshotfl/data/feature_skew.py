"""Feature skew: a per-client input transform, so clients see the same labels in different
domains (FedEOV's appendix B.4 uses Colored MNIST; its code recolours each client's shard).

A skew is registered by name (:data:`FEATURE_SKEWS`) and given as a spec, ``color``,
``rotation:max_degrees=90`` or ``noise:max_std=1.0``. Client ``k`` of ``K`` gets domain
``k`` (``color`` cycles through its palette); the public pool and the test split are a
mixture of the client domains: every example gets the domain of a client drawn at random from
the partition seed's ``("feature_skew", split)`` stream, as the reference code's test shards
are recoloured per client. It is applied in :func:`oneshotfl.data.federated.carve_federated_data`,
so a Flower node, which carves the same federation, applies exactly what the simulation does.

* ``color`` — the image's intensity p ∈ [0, 1] (the dataset's normalisation undone; for RGB the
  channel mean) paints between the domain's background and foreground colours:
  ``bg + p·(fg − bg)`` (``binary``: the reference's ``fg`` where p > 50/255, else ``bg``),
  then normalised with mean 0.5 and std 0.5 to three channels. The 11 (foreground,
  background) pairs are the reference code's ``color_domains``.
* ``rotation`` — client k's images rotated by ``k·max_degrees/(K−1)`` degrees (bilinear).
* ``noise`` — Gaussian noise of standard deviation ``k·max_std/(K−1)`` (normalised units),
  drawn from the stream ``("feature_skew", "noise", split)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from oneshotfl.data.datasets import DATASETS
from oneshotfl.data.user import is_user_spec, user_stats
from oneshotfl.params import Params, coerce_params, require
from oneshotfl.registry import Registry, parse_spec
from oneshotfl.seeding import numpy_rng, torch_generator

RGB = {
    "red": (1.0, 0.0, 0.0), "green": (0.0, 1.0, 0.0), "blue": (0.0, 0.0, 1.0),
    "yellow": (1.0, 1.0, 0.0), "purple": (0.5, 0.0, 0.5), "white": (1.0, 1.0, 1.0),
    "black": (0.0, 0.0, 0.0), "gold": (1.0, 0.84, 0.0), "orange": (1.0, 0.65, 0.0),
    "pink": (1.0, 0.75, 0.8),
}  # fmt: skip
PALETTE = (
    ("red", "blue"), ("green", "yellow"), ("white", "purple"), ("red", "green"),
    ("black", "gold"), ("blue", "red"), ("yellow", "green"), ("purple", "white"),
    ("green", "red"), ("orange", "black"), ("orange", "pink"),
)  # fmt: skip


class FeatureSkewError(ValueError):
    """A feature-skew spec that cannot be built."""


class FeatureSkew:
    """Base of registered feature skews: ``apply(x, where)`` transforms every row ``i`` of
    normalised images into client domain ``where.index[i]``."""

    Config: ClassVar[type] = Params

    def __init__(self, config: Any, spec: str) -> None:
        self.config, self.spec = config, spec

    def channels(self, in_channels: int) -> int:
        """Channels of the transformed images."""
        return in_channels

    def apply(self, x: torch.Tensor, where: Domains) -> torch.Tensor:
        raise NotImplementedError


@dataclass(frozen=True)
class Stats:
    """The dataset's per-channel normalisation, to recover intensities in [0, 1]."""

    mean: Sequence[float]
    std: Sequence[float]


@dataclass(frozen=True)
class Domains:
    """Where a batch goes: row ``i`` into the domain of client ``index[i]`` of ``clients``;
    ``stats`` undo the normalisation; ``stream`` and ``seed`` name the random stream of a
    stochastic skew."""

    index: np.ndarray
    clients: int
    stats: Stats
    stream: str
    seed: int

    def fraction(self) -> np.ndarray:
        """Each row's position k/(K−1) on a skew that grows from client 0 to the last."""
        return self.index / max(1, self.clients - 1)


FEATURE_SKEWS: Registry[type[FeatureSkew]] = Registry("feature skew")


@dataclass(frozen=True)
class ColorConfig(Params):
    """``binary``: the reference's thresholded colouring instead of the intensity blend."""

    binary: bool = False


@FEATURE_SKEWS.register("color", "per-client foreground/background colours (Colored MNIST)")
class Color(FeatureSkew):
    Config = ColorConfig

    def channels(self, in_channels: int) -> int:
        return 3

    def apply(self, x: torch.Tensor, where: Domains) -> torch.Tensor:
        mean = torch.tensor(where.stats.mean, dtype=x.dtype).view(1, -1, 1, 1)
        std = torch.tensor(where.stats.std, dtype=x.dtype).view(1, -1, 1, 1)
        p = (x * std + mean).clamp(0, 1).mean(dim=1, keepdim=True)
        if self.config.binary:
            p = (p > 50 / 255).to(x.dtype)
        pairs = [PALETTE[d % len(PALETTE)] for d in where.index.tolist()]
        fg = torch.tensor([RGB[f] for f, _ in pairs], dtype=x.dtype).view(-1, 3, 1, 1)
        bg = torch.tensor([RGB[b] for _, b in pairs], dtype=x.dtype).view(-1, 3, 1, 1)
        return (bg + p * (fg - bg) - 0.5) / 0.5


@dataclass(frozen=True)
class RotationConfig(Params):
    """``max_degrees``: the last client's rotation."""

    max_degrees: float = 90.0

    def validate(self) -> None:
        require(0 < self.max_degrees <= 360, "max_degrees", "in (0, 360]", self.max_degrees)


@FEATURE_SKEWS.register("rotation", "client k rotated by k·max_degrees/(K−1)")
class Rotation(FeatureSkew):
    Config = RotationConfig

    def apply(self, x: torch.Tensor, where: Domains) -> torch.Tensor:
        degrees = where.fraction() * self.config.max_degrees
        angle = torch.tensor(degrees * math.pi / 180, dtype=torch.float64)
        theta = torch.zeros(len(x), 2, 3, dtype=torch.float64)
        theta[:, 0, 0], theta[:, 0, 1] = angle.cos(), -angle.sin()
        theta[:, 1, 0], theta[:, 1, 1] = angle.sin(), angle.cos()
        grid = F.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)
        background = x.amin(dim=(0, 2, 3), keepdim=True)  # the normalised zero intensity
        out = F.grid_sample(x - background, grid, mode="bilinear", align_corners=False)
        return out + background


@dataclass(frozen=True)
class NoiseConfig(Params):
    """``max_std``: the last client's noise level (normalised units)."""

    max_std: float = 1.0

    def validate(self) -> None:
        require(self.max_std > 0, "max_std", "> 0", self.max_std)


@FEATURE_SKEWS.register("noise", "client k with Gaussian noise of std k·max_std/(K−1)")
class Noise(FeatureSkew):
    Config = NoiseConfig

    def apply(self, x: torch.Tensor, where: Domains) -> torch.Tensor:
        level = torch.tensor(where.fraction() * self.config.max_std, dtype=x.dtype)
        g = torch_generator(where.seed, "feature_skew", "noise", where.stream)
        return x + level.view(-1, 1, 1, 1) * torch.randn(x.shape, generator=g, dtype=x.dtype)


def build_feature_skew(spec: str) -> FeatureSkew:
    """The registered skew named by ``spec`` (``name[:key=value...]``).

    Raises:
        FeatureSkewError: for an unknown name or a bad option.
    """
    try:
        name, options = parse_spec(spec, "feature skew")
        kind = FEATURE_SKEWS.get(name)
        return kind(coerce_params(kind.Config, options), spec)
    except (KeyError, TypeError, ValueError) as exc:
        raise FeatureSkewError(f"feature skew {spec!r}: {exc}") from None


def mixture_domains(n: int, clients: int, seed: int, split: str) -> np.ndarray:
    """Each of ``n`` pool or test examples gets the domain of a random client."""
    return numpy_rng(seed, "feature_skew", split).integers(0, clients, n)


def dataset_stats(name: str) -> Stats | None:
    """The normalisation of a registered dataset, or the declared one of a ``folder:`` or
    ``npz:`` spec (None for one we do not know)."""
    if is_user_spec(name):
        declared = user_stats(name)
        return None if declared is None else Stats(*declared)
    if name not in DATASETS:
        return None
    spec = DATASETS.get(name)
    return Stats(spec.mean, spec.std)
