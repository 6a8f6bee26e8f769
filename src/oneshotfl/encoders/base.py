"""The encoder registry: building a shared frozen encoder from its spec (the encoder itself,
:class:`~oneshotfl.training.encoder.Encoder`, is a service of the training layer).

An encoder maps a batch of (dataset-normalised) images ``[N, C, H, W]`` to embeddings
``[N, d]``. It is frozen everywhere: parameters never require gradients, it always runs in
eval mode, and its :attr:`Encoder.fingerprint` — a SHA-256 over its spec, preprocessing and
every parameter and buffer — lets clients and the server check they hold the same one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from oneshotfl.data.types import TaskInfo
from oneshotfl.registry import Registry, parse_spec
from oneshotfl.training.artefacts import ArtefactStore
from oneshotfl.training.encoder import (
    EncodedClassifier,
    Encoder,
    EncoderError,
    Preprocess,
    module_fingerprint,
    preprocess_images,
)

__all__ = [
    "ENCODERS",
    "EncodedClassifier",
    "Encoder",
    "EncoderContext",
    "EncoderError",
    "Preprocess",
    "build_encoder",
    "module_fingerprint",
    "parse_encoder_spec",
    "preprocess_images",
    "take_options",
]


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

F = TypeVar("F")


def parse_encoder_spec(text: str) -> tuple[str, dict[str, str]]:
    """``name`` or ``name:key=value:...`` → (name, options).

    Raises:
        EncoderError: for an empty name or an option without ``=``.
    """
    try:
        return parse_spec(text, "encoder")
    except ValueError as exc:
        raise EncoderError(str(exc)) from None


def registered(registry: Registry[F], spec: str, what: str) -> tuple[F, dict[str, str]]:
    """The factory ``spec``'s name has in ``registry``, and its options.

    Raises:
        EncoderError: for a malformed spec or a name ``registry`` lacks, naming ``what`` and
            the names it has.
    """
    name, options = parse_encoder_spec(spec)
    if name not in registry:
        raise EncoderError(
            f"unknown {what} {name!r}; expected one of: {', '.join(registry.names())}"
        )
    return registry.get(name), options


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
    factory, options = registered(ENCODERS, spec, "encoder")
    context = EncoderContext(task, seed, spec, public, store, device or torch.device("cpu"))
    return factory(options, context)


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
