"""A model as plain arrays and back: its registry name and its state dict as numpy arrays
keyed ``<prefix>.<state-dict key>``, not tied to the wire (payload fields use it, and so can
anything that stores a model as arrays)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from oneshotfl.models.base import create_model


def model_state(model: nn.Module, prefix: str = "model") -> tuple[dict[str, np.ndarray], str]:
    """``model``'s state dict as arrays keyed ``<prefix>.<key>`` (copies, on the CPU, in their
    own dtypes: float32 weights, int64 counters) and its architecture name.

    Raises:
        TypeError: for a model not built by :func:`~oneshotfl.models.create_model` (it has no
            ``arch``).
    """
    arch = getattr(model, "arch", None)
    if not isinstance(arch, str):
        raise TypeError("only models built by oneshotfl.models.create_model can be sent")
    arrays = {
        f"{prefix}.{k}": v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()
    }
    return arrays, arch


def model_from_state(
    arch: str,
    arrays: Mapping[str, np.ndarray],
    in_channels: int,
    num_classes: int,
    image_size: int,
    prefix: str = "model",
) -> nn.Module:
    """The ``arch`` model built for these inputs and outputs, with the state held by the
    ``<prefix>.``-keyed entries of ``arrays`` (other keys are ignored) loaded strictly; the
    global RNG is left as it was (the weights drawn when building are overwritten)."""
    with torch.device("meta"):  # the weights are replaced: no memory, no init, no RNG draw
        model = create_model(arch, in_channels, num_classes, image_size)
    start = len(prefix) + 1
    state = {
        k[start:]: torch.from_numpy(np.array(v))
        for k, v in arrays.items()
        if k.startswith(prefix + ".")
    }
    model.load_state_dict(state, strict=True, assign=True)  # the arrays' copies become it
    if any(t.is_meta for t in model.buffers()):  # a buffer outside the state (non-persistent)
        with torch.random.fork_rng(devices=[]):
            model = create_model(arch, in_channels, num_classes, image_size)
        model.load_state_dict(state, strict=True)
    return model
