"""A model as plain arrays and back: its registry name and its state dict as numpy arrays
keyed ``<prefix>.<state-dict key>``, not tied to the wire (payload fields use it, and so can
anything that stores a model as arrays).

Building a module costs more than running a small one on a few examples (a LeNet: about 3 ms
of Python against 0.4 ms to load its state), so a state that is only *run* — a payload's
outputs probed on receipt — is run in one module per architecture, thread and process
(:func:`shared_module`, :func:`forward_with_state`): its weights are the state's own arrays
for the call, and no module is built per use.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from oneshotfl.models.base import MODELS, create_model


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


_SHARED: dict[tuple[object, ...], tuple[nn.Module, frozenset[str]]] = {}


def shared_module(arch: str, in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    """The one ``arch`` module of these sizes that this thread of this process runs states in
    (built on first use, on the CPU, in eval mode, without touching the global RNG). Its own
    weights mean nothing: run it only through :func:`forward_with_state`, never keep it."""
    return _shared(arch, in_channels, num_classes, image_size)[0]


def _shared(
    arch: str, in_channels: int, num_classes: int, image_size: int
) -> tuple[nn.Module, frozenset[str]]:
    key = (arch, MODELS.get(arch), in_channels, num_classes, image_size, threading.get_ident())
    entry = _SHARED.get(key)
    if entry is None:
        with torch.random.fork_rng(devices=[]):
            module = create_model(arch, in_channels, num_classes, image_size).eval()
        module.requires_grad_(False)
        if len(_SHARED) >= 64:  # bounded: a process meets a few architectures and threads
            _SHARED.pop(next(iter(_SHARED)))
        entry = _SHARED[key] = (module, frozenset(module.state_dict()))
    return entry


def forward_with_state(
    arch: str,
    arrays: Mapping[str, np.ndarray],
    in_channels: int,
    num_classes: int,
    image_size: int,
    x: torch.Tensor,
    prefix: str = "model",
) -> torch.Tensor:
    """The eval-mode outputs on ``x`` (on the CPU) of the ``arch`` model whose state is the
    ``<prefix>.``-keyed entries of ``arrays`` — what :func:`model_from_state` would build,
    run in the :func:`shared_module` with the arrays as its weights for the call (no module
    built, no copy of a writable array).

    Raises:
        KeyError: when an entry of the architecture's state is not among the arrays.
    """
    module, keys = _shared(arch, in_channels, num_classes, image_size)
    start = len(prefix) + 1
    state = {
        k[start:]: torch.from_numpy(v if v.flags.writeable else np.array(v))
        for k, v in arrays.items()
        if k.startswith(prefix + ".")
    }
    missing = sorted(keys - set(state))
    if missing:
        raise KeyError(f"{arch}: the state has no {', '.join(missing)}")
    with torch.no_grad():
        out: torch.Tensor = functional_call(module, state, (x,), strict=False)
    return out
