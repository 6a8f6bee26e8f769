"""Models as payload fields: ``<prefix>.arch`` (a model registry name) and the state dict,
and the model rebuilt from them on receipt (after
:func:`~oneshotfl.protocol.validate.validate_payload` checked both against a reference of the
federation's shapes). The encoding itself is :mod:`oneshotfl.models.state`'s."""

from __future__ import annotations

from torch import nn

from oneshotfl.models.state import model_from_state, model_state
from oneshotfl.payload import Payload
from oneshotfl.protocol.spec import WireDims


def model_fields(model: nn.Module, prefix: str = "model") -> Payload:
    """A model as payload fields: ``<prefix>.arch`` and its float32/int state dict."""
    arrays, arch = model_state(model, prefix)
    return Payload(arrays, {f"{prefix}.arch": arch})


def model_from_fields(
    payload: Payload, dims: WireDims, prefix: str = "model", extra_outputs: int = 0
) -> nn.Module:
    """Rebuild the model a payload carries (after :func:`validate_payload`)."""
    arch = str(payload.scalars[f"{prefix}.arch"])
    return model_from_state(
        arch,
        payload.arrays,
        dims.in_channels,
        dims.num_classes + extra_outputs,
        dims.image_size,
        prefix,
    )
