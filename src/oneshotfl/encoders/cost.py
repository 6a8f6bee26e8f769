"""Client cost, measured: FLOPs counted by ``torch.utils.flop_counter.FlopCounterMode`` (FLOPs,
not MACs: one multiply-add counts 2) and trainable parameters.

FedAGE's claim (its Fig. 2 and Appendix B.7) is that a client running a frozen encoder once
and training a light head spends far less than one training the full model. These functions
count what a client actually executes on a batch, divided by the batch size:

* :func:`forward_flops` — inference, e.g. the encoder pass (done once per sample);
* :func:`train_step_flops` — forward, cross-entropy and backward of one training step (the
  optimiser update itself is not counted: it is per parameter, not per sample);
* :func:`client_gflops_curve` — cumulative GFLOPs per sample after each epoch for FedAGE
  (encoder once + head steps) and for full-model training (full steps every epoch);
* :func:`client_cost` — all of the above for one encoder, head and set of full models, as
  ``oneshotfl encoder cost`` writes it; :func:`backbone_forward_flops` prices a torchvision
  backbone from its architecture alone (FLOPs do not depend on weights).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.data.types import TaskInfo
from oneshotfl.encoders.base import Encoder, preprocess_images
from oneshotfl.encoders.sources import TORCHVISION_BACKBONES, feature_extractor, imagenet_preprocess
from oneshotfl.models import create_model

if TYPE_CHECKING:
    from torch.utils.flop_counter import FlopCounterMode


def _flop_counter() -> FlopCounterMode:
    """A silent ``FlopCounterMode`` (its module, which loads triton where installed, is
    imported here and not with this module: every Flower node imports this one)."""
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False)


def trainable_parameters(module: nn.Module) -> int:
    """Parameters that require gradients."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def forward_flops(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> float:
    """FLOPs per sample of ``fn(x)`` without gradients (``x`` is a batch)."""
    with _flop_counter() as counter, torch.no_grad():
        fn(x)
    return counter.get_total_flops() / len(x)


def sparse_forward_flops(model: nn.Module, x: torch.Tensor) -> tuple[float, float]:
    """FLOPs per sample of one forward pass of ``model`` on the batch ``x``: ``(dense,
    sparse)``. Dense is what a dense kernel executes (``FlopCounterMode``'s count, zeros
    included); sparse scales each convolution's and linear layer's count by the fraction of
    its weights that are non-zero — what an ideal sparse kernel would execute (FedEOV's
    appendix C.2 with efficiency 1)."""
    with _flop_counter() as counter, torch.no_grad():
        model(x)
    counts = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
    dense = float(counter.get_total_flops())
    saved = 0.0
    prefix = type(model).__name__
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, nn.Conv2d | nn.Linear) and isinstance(weight, torch.Tensor):
            zero = 1.0 - float(torch.count_nonzero(weight)) / weight.numel()
            saved += zero * counts.get(f"{prefix}.{name}" if name else prefix, 0)
    return dense / len(x), (dense - saved) / len(x)


def inference_latency_ms(
    predict: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, repeats: int = 3
) -> float:
    """Measured wall-clock milliseconds per image of ``predict(x)`` (the best of ``repeats``
    passes after one warm-up): a fact about this machine, reported, never asserted."""
    with torch.no_grad():
        predict(x)
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            predict(x)
            best = min(best, time.perf_counter() - start)
    return 1000.0 * best / len(x)


def train_step_flops(model: nn.Module, x: torch.Tensor, num_classes: int) -> float:
    """FLOPs per sample of forward + cross-entropy + backward on the batch ``x``."""
    y = torch.arange(len(x)) % num_classes
    was_training = model.training
    model.train()
    with _flop_counter() as counter:
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


def encoder_forward_flops(encoder: Encoder, x: torch.Tensor) -> float:
    """FLOPs per sample of the frozen encoder on raw images ``x`` (its preprocessing — resize,
    channel repeat, normalisation — is applied first and not counted)."""
    images = preprocess_images(x, encoder.preprocess, encoder.task)
    return forward_flops(lambda b: encoder.module(b), images)


def backbone_forward_flops(arch: str, size: int, task: TaskInfo, x: torch.Tensor) -> float:
    """FLOPs per sample of a torchvision backbone's feature extractor at ``size`` px.

    FLOPs do not depend on weight values, so the architecture is built without weights:
    this prices the paper's ImageNet encoders where their weights cannot be loaded.
    """
    if arch not in TORCHVISION_BACKBONES:
        raise ValueError(f"backbone: expected one of {sorted(TORCHVISION_BACKBONES)}, got {arch!r}")
    import torchvision  # here: its import (≈ 1.3 s) is paid where a backbone is priced

    module = feature_extractor(arch, torchvision.models.get_model(arch, weights=None)).eval()
    images = preprocess_images(x, imagenet_preprocess(size), task)
    return forward_flops(lambda b: module(b), images)


def client_cost(
    encoder: Encoder,
    head_arch: str,
    full_archs: Sequence[str],
    x: torch.Tensor,
    head_epochs: int,
    full_epochs: int,
) -> dict[str, Any]:
    """What one client executes per training sample: FedAGE (encoder once, then
    ``head_epochs`` head steps) against training each of ``full_archs`` for ``full_epochs``.

    Args:
        encoder: the shared frozen encoder.
        head_arch: the client head's registered architecture.
        full_archs: registered client models trained end to end by the other methods.
        x: a batch of real images (the counts are per sample of this batch).
        head_epochs: epochs of FedAGE's head training.
        full_epochs: epochs of full-model local training.

    Returns:
        FLOPs per sample (forward of the encoder, one train step of head and of each full
        model), trainable parameters, the cumulative GFLOPs-per-sample curve over epochs
        1 … max(head_epochs, full_epochs), and the totals at the configured epochs.
    """
    task = encoder.task
    enc = encoder_forward_flops(encoder, x)
    head = create_model(head_arch, encoder.dim, task.num_classes, 1)
    z = encoder.embed(x, torch.device("cpu"))
    head_step = train_step_flops(head, z, task.num_classes)
    full: dict[str, dict[str, float]] = {}
    epochs = max(head_epochs, full_epochs)
    curves: dict[str, list[dict[str, float]]] = {}
    for arch in full_archs:
        model = create_model(arch, task.in_channels, task.num_classes, task.image_size)
        step = train_step_flops(model, x, task.num_classes)
        full[arch] = {
            "train_step_flops_per_sample": step,
            "trainable_parameters": trainable_parameters(model),
            "total_gflops_per_sample": full_epochs * step / 1e9,
        }
        curves[arch] = client_gflops_curve(enc, head_step, step, epochs)
    fedage_total = (enc + head_epochs * head_step) / 1e9
    return {
        "unit": "FLOPs (a multiply-add counts 2), per training sample",
        "encoder": {
            "spec": encoder.spec,
            "forward_flops_per_sample": enc,
            "trainable_parameters": trainable_parameters(encoder.module),
            "parameters": int(sum(p.numel() for p in encoder.module.parameters())),
        },
        "head": {
            "arch": head_arch,
            "train_step_flops_per_sample": head_step,
            "trainable_parameters": trainable_parameters(head),
        },
        "fedage": {"epochs": head_epochs, "total_gflops_per_sample": fedage_total},
        "full": {"epochs": full_epochs, "models": full},
        "ratio_full_over_fedage": {
            arch: v["total_gflops_per_sample"] / fedage_total for arch, v in full.items()
        },
        "curves": curves,
    }
