"""Many models of one architecture evaluated in one vectorised pass.

An ensemble's members, a federation's local models checked on the test split: the same input
through ``k`` models of one architecture. :func:`stacked_logits` stacks their parameters and
buffers along a leading model axis (:func:`torch.func.stack_module_state`) and maps
:func:`torch.func.functional_call` over it with :func:`torch.func.vmap`, so ``k`` small models
cost a few large batched kernels instead of ``k`` times the Python and dispatch overhead of a
small one. Models are grouped by *signature* (class, and the names, shapes and dtypes of their
parameters and buffers); each group runs in chunks of at most ``models_per_pass`` models and
``batch_size`` inputs, so memory is bounded whatever ``k`` is. A model alone in its group, or
one whose forward pass cannot be mapped, runs as itself. Eval mode throughout: the outputs are
the models' own, up to the floating-point order of a batched kernel.

On a CPU the models run one at a time, each with its convolution weights in channels-last
layout for the call (:func:`channels_last_weights`; the module itself is left as it is):
PyTorch's CPU kernels for a mapped (grouped) convolution and pooling were measured slower than
the plain ones, and the channels-last kernels faster than the default layout (`make
bench-ensemble-eval`, docs/benchmarks/scale.md: a LeNet over the 10,000 Fashion-MNIST test
images, one thread) — so stacking pays on a GPU, where one small model leaves the device idle.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from oneshotfl.models.base import on_device

log = logging.getLogger(__name__)


def signature(model: nn.Module) -> tuple[object, ...]:
    """What two models must share to be stacked: class, parameter and buffer layouts."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    return (type(model), tuple((n, tuple(t.shape), t.dtype) for n, t in tensors))


def channels_last_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of ``model``'s 2-d convolution weights in channels-last layout, keyed by their
    parameter names: what :func:`torch.func.functional_call` takes to run the model with them
    (every other parameter and buffer its own). A weight of one input channel is strided as
    channels-last too (``.contiguous`` would leave it, and the kernel would pick the default
    layout). Empty for a model without convolutions."""
    params = dict(model.named_parameters())
    out: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        key = f"{name}.weight" if name else "weight"
        if isinstance(module, nn.Conv2d) and key in params:  # a parametrised weight: as it is
            weight = params[key].detach()
            out[key] = torch.empty_like(weight, memory_format=torch.channels_last).copy_(weight)
    return out


@torch.no_grad()
def _one(model: nn.Module, x: torch.Tensor, device: torch.device, batch: int) -> torch.Tensor:
    """``model``'s logits on ``x`` in chunks of ``batch``; on a CPU, for images, with its
    convolutions in channels-last layout (module docs)."""
    on_device(model, device).eval()
    state = channels_last_weights(model) if device.type == "cpu" and x.dim() == 4 else {}

    def run(chunk: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = functional_call(model, state, (chunk,)) if state else model(chunk)
        return out

    outs = [run(c.to(device)).float().cpu() for c in x.split(batch)]
    return torch.cat(outs) if outs else torch.empty(0)


@torch.no_grad()
def _group(
    models: Sequence[nn.Module], x: torch.Tensor, device: torch.device, batch: int
) -> torch.Tensor:
    """``[k, N, C]`` logits of ``k`` models of one signature on ``x``."""
    for m in models:
        m.eval()
    params, buffers = stack_module_state(list(models))  # copies, detached
    params = {k: v.to(device) for k, v in params.items()}
    buffers = {k: v.to(device) for k, v in buffers.items()}
    base = copy.deepcopy(models[0]).to("meta")

    def call(
        p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], xs: torch.Tensor
    ) -> torch.Tensor:
        return functional_call(base, (p, b), (xs,))

    mapped = vmap(call, in_dims=(0, 0, None))
    outs = [mapped(params, buffers, c.to(device)).float().cpu() for c in x.split(batch)]
    return torch.cat(outs, dim=1)


def pass_kind(device: torch.device, stack: bool) -> str:
    """How :func:`stacked_logits` runs models on ``device``: ``stacked`` (shared vectorised
    passes), ``channels_last`` (one at a time, a CPU's layout) or ``each`` (one at a time) —
    part of a memo key, since the three agree only up to the floating-point order."""
    if device.type == "cpu":
        return "channels_last"
    return "stacked" if stack else "each"


def stacked_logits(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    device: torch.device,
    batch_size: int = 1024,
    models_per_pass: int = 64,
    stack: bool = True,
) -> list[torch.Tensor]:
    """Each model's logits on ``x`` (eval mode, on the CPU), in the order of ``models``;
    with ``stack``, models of one signature share vectorised passes on a GPU (module docs);
    otherwise, and on a CPU, they run one at a time."""
    if not stack or device.type == "cpu":  # on a CPU: slower stacked (module docs)
        return [_one(m, x, device, batch_size) for m in models]
    out: list[torch.Tensor | None] = [None] * len(models)
    groups: dict[tuple[object, ...], list[int]] = {}
    for i, m in enumerate(models):
        groups.setdefault(signature(m), []).append(i)
    for members in groups.values():
        for start in range(0, len(members), models_per_pass):
            chunk = members[start : start + models_per_pass]
            if len(chunk) == 1:
                out[chunk[0]] = _one(models[chunk[0]], x, device, batch_size)
                continue
            # a smaller input chunk keeps k × batch activations at one model's × batch
            per = max(16, batch_size // len(chunk) * 4)
            try:
                logits = _group([models[i] for i in chunk], x, device, per)
            except (RuntimeError, NotImplementedError) as exc:  # a forward vmap cannot map
                log.debug("stacked evaluation fell back to one model at a time: %s", exc)
                logits = torch.stack([_one(models[i], x, device, batch_size) for i in chunk])
            for j, i in enumerate(chunk):
                out[i] = logits[j]
    return [o if o is not None else torch.empty(0) for o in out]


__all__ = ["channels_last_weights", "pass_kind", "signature", "stacked_logits"]
