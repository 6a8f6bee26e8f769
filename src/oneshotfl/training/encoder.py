"""The frozen shared encoder as a service of the training layer: what an encoder is
(:class:`Encoder`: a frozen module, its embedding size, its input preprocessing and a content
fingerprint every party can compare), how images are prepared for it, and the global model
built on it (:class:`EncodedClassifier`). Contexts hand methods an :class:`Encoder`; the
encoders themselves are built from a spec by the registry in :mod:`oneshotfl.encoders`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.data.feature_skew import dataset_stats
from oneshotfl.data.types import TaskInfo


class EncoderError(ValueError):
    """An encoder spec that cannot be built (unknown option, missing weights, bad value)."""


@dataclass(frozen=True)
class Preprocess:
    """What an encoder needs done to dataset-normalised images before its first layer.

    Attributes:
        size: resize (bilinear) to ``size × size``; ``None`` keeps the dataset's size.
        channels: repeat a grey channel to this many (``None`` keeps the dataset's).
        mean, std: renormalise [0, 1] pixels with these per-channel constants (``None``:
            keep the dataset normalisation).
    """

    size: int | None = None
    channels: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None


def _channel_tensor(values: tuple[float, ...], channels: int) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.float32)
    if t.numel() == 1 and channels > 1:
        t = t.repeat(channels)
    return t.view(1, -1, 1, 1)


def preprocess_images(x: torch.Tensor, pre: Preprocess, task: TaskInfo) -> torch.Tensor:
    """Undo the dataset normalisation when the encoder has its own, repeat grey channels,
    resize; returns a new tensor."""
    if pre.mean is not None and pre.std is not None:
        stats = dataset_stats(task.dataset)
        if stats is None:
            raise EncoderError(f"no normalisation known for dataset {task.dataset!r}")
        channels = x.shape[1]
        x = x * _channel_tensor(tuple(stats.std), channels) + _channel_tensor(
            tuple(stats.mean), channels
        )
    if pre.channels is not None and x.shape[1] != pre.channels:
        if x.shape[1] != 1:
            raise EncoderError(
                f"encoder expects {pre.channels} channels; cannot convert {x.shape[1]}"
            )
        x = x.repeat(1, pre.channels, 1, 1)
    if pre.size is not None and x.shape[-1] != pre.size:
        x = F.interpolate(x, size=(pre.size, pre.size), mode="bilinear", align_corners=False)
    if pre.mean is not None and pre.std is not None:
        channels = x.shape[1]
        x = (x - _channel_tensor(pre.mean, channels)) / _channel_tensor(pre.std, channels)
    return x


def module_fingerprint(module: nn.Module, extra: str = "") -> str:
    """SHA-256 over ``extra`` and every parameter and buffer (names, shapes, bytes)."""
    digest = hashlib.sha256(extra.encode())
    for name, tensor in sorted(module.state_dict().items()):
        array = np.ascontiguousarray(tensor.detach().cpu().numpy())
        digest.update(f"{name}:{array.dtype}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


@dataclass
class Encoder:
    """A frozen feature extractor.

    Attributes:
        spec: the spec string it was built from.
        module: the frozen network, images → ``[N, d]``.
        dim: embedding size d.
        preprocess: input preprocessing.
        task: the task whose images it embeds (for the dataset normalisation).
        fingerprint: content hash (spec, preprocessing, weights).
        info: facts for result files (source file, parameter count).
    """

    spec: str
    module: nn.Module
    dim: int
    preprocess: Preprocess
    task: TaskInfo
    fingerprint: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.module.eval()
        for p in self.module.parameters():
            p.requires_grad_(False)
        if not self.fingerprint:
            self.fingerprint = module_fingerprint(self.module, f"{self.spec}|{self.preprocess}")
        self.info.setdefault("parameters", sum(p.numel() for p in self.module.parameters()))

    @torch.no_grad()
    def embed(self, x: torch.Tensor, device: torch.device, batch_size: int = 256) -> torch.Tensor:
        """Embeddings ``[N, d]`` float32 on the CPU."""
        self.module.to(device).eval()
        out = []
        for chunk in x.split(batch_size):
            images = preprocess_images(chunk, self.preprocess, self.task).to(device)
            out.append(self.module(images).flatten(1).float().cpu())
        if not out:
            return torch.empty(0, self.dim)
        z = torch.cat(out)
        if z.shape[1] != self.dim:
            raise EncoderError(f"encoder {self.spec}: expected {self.dim}-d output, got {z.shape}")
        return z


class EncodedClassifier(nn.Module):
    """The global model M_s(x) = C_s(E(x)): the frozen encoder (with its preprocessing) and a
    head on its embeddings."""

    def __init__(self, encoder: Encoder, head: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder.module
        self.head = head
        self._preprocess, self._task = encoder.preprocess, encoder.task

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        images = preprocess_images(x.cpu(), self._preprocess, self._task).to(x.device)
        with torch.no_grad():
            z = self.encoder(images).flatten(1)
        out: torch.Tensor = self.head(z)
        return out
