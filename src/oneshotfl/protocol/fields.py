"""Models as payload fields: ``<prefix>.arch`` (a model registry name) and the state dict,
and the model rebuilt from them on receipt (after :func:`~oneshotfl.protocol.spec.validate_payload`
checked both against a reference of the federation's shapes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from oneshotfl.models import create_model
from oneshotfl.payload import Payload

if TYPE_CHECKING:  # the spec module imports this one
    from oneshotfl.protocol.spec import WireDims


def model_fields(model: nn.Module, prefix: str = "model") -> Payload:
    """A model as payload fields: ``<prefix>.arch`` and its float32/int state dict."""
    arch = getattr(model, "arch", None)
    if not isinstance(arch, str):
        raise TypeError("only models built by oneshotfl.models.create_model can be sent")
    arrays = {
        f"{prefix}.{k}": v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()
    }
    return Payload(arrays, {f"{prefix}.arch": arch})


def model_from_fields(
    payload: Payload, dims: WireDims, prefix: str = "model", extra_outputs: int = 0
) -> nn.Module:
    """Rebuild the model a payload carries (after :func:`validate_payload`)."""
    arch = str(payload.scalars[f"{prefix}.arch"])
    with torch.random.fork_rng(devices=[]):  # the weights are overwritten: leave no RNG trace
        model = create_model(
            arch, dims.in_channels, dims.num_classes + extra_outputs, dims.image_size
        )
    start = len(prefix) + 1
    state = {
        k[start:]: torch.from_numpy(np.array(v))
        for k, v in payload.arrays.items()
        if k.startswith(prefix + ".")
    }
    model.load_state_dict(state, strict=True)
    return model
