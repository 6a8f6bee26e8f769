"""Shared frozen encoders (FedAGE) and autoencoders (FedSD2C): a registry of each, built from a
spec string (:mod:`oneshotfl.encoders.autoencoder` for the second).

``build_encoder("random:dim=64", task, seed)`` or
``build_encoder("torchvision:arch=resnet18:weights=/path/resnet18.pth", task, seed)`` returns an
:class:`Encoder`: a frozen module, its embedding size, the input preprocessing it needs, and a
content fingerprint every party can compare.
"""

from oneshotfl.encoders import autoencoder as _autoencoder  # noqa: F401  (importing registers)
from oneshotfl.encoders import pretrain as _pretrain  # noqa: F401  (importing registers)
from oneshotfl.encoders import sources as _sources  # noqa: F401  (importing registers)
from oneshotfl.encoders.base import (
    ENCODERS,
    Encoder,
    EncoderError,
    build_encoder,
    parse_encoder_spec,
)

__all__ = ["ENCODERS", "Encoder", "EncoderError", "build_encoder", "parse_encoder_spec"]
