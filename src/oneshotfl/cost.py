"""Client cost, measured: FLOPs counted by ``torch.utils.flop_counter.FlopCounterMode`` (FLOPs,
not MACs: one multiply-add counts 2) and trainable parameters.

FedAGE's claim (its Fig. 2 and Appendix B.7) is that a client running a frozen encoder once
and training a light head spends far less than one training the full model. These functions
count what a client actually executes on a batch, divided by the batch size:

* :func:`forward_flops` — inference, e.g. the encoder pass (done once per sample);
* :func:`train_step_flops` — forward, cross-entropy and backward of one training step (the
  optimiser update itself is not counted: it is per parameter, not per sample);
* :func:`client_gflops_curve` — cumulative GFLOPs per sample after each epoch for FedAGE
  (encoder once + head steps) and for full-model training (full steps every epoch).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


def trainable_parameters(module: nn.Module) -> int:
    """Parameters that require gradients."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def forward_flops(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> float:
    """FLOPs per sample of ``fn(x)`` without gradients (``x`` is a batch)."""
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        fn(x)
    return counter.get_total_flops() / len(x)


def train_step_flops(model: nn.Module, x: torch.Tensor, num_classes: int) -> float:
    """FLOPs per sample of forward + cross-entropy + backward on the batch ``x``."""
    y = torch.arange(len(x)) % num_classes
    was_training = model.training
    model.train()
    with FlopCounterMode(display=False) as counter:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return counter.get_total_flops() / len(x)


def client_gflops_curve(
    encoder_flops: float, head_step_flops: float, full_step_flops: float, epochs: int
) -> list[dict[str, float]]:
    """Cumulative GFLOPs per sample after epochs 1…E: FedAGE = encoder once + E head steps;
    full training = E full-model steps."""
    return [
        {
            "epoch": e,
            "fedage_gflops": (encoder_flops + e * head_step_flops) / 1e9,
            "full_gflops": e * full_step_flops / 1e9,
        }
        for e in range(1, epochs + 1)
    ]
