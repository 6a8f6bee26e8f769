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

On a CPU the models run one at a time: PyTorch's CPU kernels for a mapped (grouped)
convolution and pooling were measured slower than the plain ones — a LeNet over 500 images,
83 µs per image one model at a time against 158 µs stacked 64 at once, one thread (AMD EPYC,
torch 2.14.1) — so stacking pays on a GPU, where one small model leaves the device idle.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

log = logging.getLogger(__name__)


def signature(model: nn.Module) -> tuple[object, ...]:
    """What two models must share to be stacked: class, parameter and buffer layouts."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    return (type(model), tuple((n, tuple(t.shape), t.dtype) for n, t in tensors))


@torch.no_grad()
def _one(model: nn.Module, x: torch.Tensor, device: torch.device, batch: int) -> torch.Tensor:
    model.to(device).eval()
    outs = [model(c.to(device)).float().cpu() for c in x.split(batch)]
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


def stacked_logits(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    device: torch.device,
    batch_size: int = 1024,
    models_per_pass: int = 64,
) -> list[torch.Tensor]:
    """Each model's logits on ``x`` (eval mode, on the CPU), in the order of ``models``;
    models of one signature share vectorised passes (see the module docs)."""
    if device.type == "cpu":  # measured slower than one model at a time on a CPU (module docs)
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


__all__ = ["signature", "stacked_logits"]
