"""The encoder contract and registry.

An encoder maps a batch of (dataset-normalised) images ``[N, C, H, W]`` to embeddings
``[N, d]``. It is frozen everywhere: parameters never require gradients, it always runs in
eval mode, and its :attr:`Encoder.fingerprint` — a SHA-256 over its spec, preprocessing and
every parameter and buffer — lets clients and the server check they hold the same one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.artefacts import ArtefactStore
from oneshotfl.data.feature_skew import dataset_stats
from oneshotfl.data.types import TaskInfo
from oneshotfl.registry import Registry, parse_spec


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


@dataclass(frozen=True)
class EncoderContext:
    """What an encoder source may use to build the encoder.

    Attributes:
        task: the task whose images it embeds.
        seed: the model seed (random and pretrained encoders derive their weights from it).
        spec: the spec string (for messages and fingerprints).
        public: the public pool's images, for sources that learn from them without labels
            (``simclr``); ``None`` when the federation has no pool.
        store: the artefact cache (a pretrained encoder is computed once per pool).
        device: where to compute.
    """

    task: TaskInfo
    seed: int
    spec: str
    public: torch.Tensor | None = None
    store: ArtefactStore | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))


#: Builds an encoder from its options and the :class:`EncoderContext`.
EncoderFactory = Callable[[Mapping[str, str], EncoderContext], Encoder]

ENCODERS: Registry[EncoderFactory] = Registry("encoder")


def parse_encoder_spec(text: str) -> tuple[str, dict[str, str]]:
    """``name`` or ``name:key=value:...`` → (name, options).

    Raises:
        EncoderError: for an empty name or an option without ``=``.
    """
    try:
        return parse_spec(text, "encoder")
    except ValueError as exc:
        raise EncoderError(str(exc)) from None


def build_encoder(
    spec: str,
    task: TaskInfo,
    seed: int,
    *,
    public: torch.Tensor | None = None,
    store: ArtefactStore | None = None,
    device: torch.device | None = None,
) -> Encoder:
    """Build the encoder ``spec`` names for ``task`` (raises :class:`EncoderError`).

    ``public``, ``store`` and ``device`` serve sources that learn from the public pool's
    images (``simclr``); the others ignore them."""
    name, options = parse_encoder_spec(spec)
    if name not in ENCODERS:
        raise EncoderError(
            f"unknown encoder {name!r}; expected one of: {', '.join(ENCODERS.names())}"
        )
    context = EncoderContext(task, seed, spec, public, store, device or torch.device("cpu"))
    return ENCODERS.get(name)(options, context)


def take_options(
    spec: str, options: Mapping[str, str], allowed: Mapping[str, Callable[[str], Any]]
) -> dict[str, Any]:
    """Convert ``options`` with the converters in ``allowed``; unknown keys and bad values
    raise :class:`EncoderError` naming what was expected."""
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise EncoderError(
            f"encoder {spec!r}: unknown option(s) {unknown}; expected some of {sorted(allowed)}"
        )
    values: dict[str, Any] = {}
    for key, raw in options.items():
        try:
            values[key] = allowed[key](raw)
        except ValueError:
            raise EncoderError(f"encoder {spec!r}: option {key}={raw!r} is not valid") from None
    return values


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
