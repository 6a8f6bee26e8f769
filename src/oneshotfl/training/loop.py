"""The single mini-batch training loop, and batched inference.

Data sit in memory as tensors; batches are index slices drawn with a caller-owned
``torch.Generator``, so the same generator seed gives the same batches on every device.
Every method's training — client ERM, FedProx's proximal term, distillation on the server —
goes through :func:`fit` with its own loss function.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import clip_grad_norm_

from oneshotfl.data.types import LabelledData
from oneshotfl.models.base import INITS, Init, on_device
from oneshotfl.models.stacked import pass_kind, stacked_logits
from oneshotfl.params import Params, require
from oneshotfl.training import memo, optim
from oneshotfl.training.progress import NullTracker, Tracker, report_scalar

Batch = tuple[torch.Tensor, ...]
LossFn = Callable[[nn.Module, Batch], torch.Tensor]


@dataclass(frozen=True)
class TrainConfig(Params):
    """Hyper-parameters of one training run.

    Attributes:
        epochs: passes over the data.
        batch_size: examples per step.
        lr: learning rate.
        optimizer: ``sgd`` (with momentum), ``adam`` (L2 weight decay) or ``adamw``
            (decoupled weight decay).
        momentum: SGD momentum.
        weight_decay: L2 penalty.
        min_steps: a floor in optimiser steps: training runs the fewest whole epochs, and at
            least ``epochs``, that make this many steps over its data (:func:`budget_epochs`),
            so a small dataset trains as far as a large one; 0: exactly ``epochs``.
        init: how a model this training starts from is initialised when its architecture
            is unnormalised (:func:`oneshotfl.models.base.init_weights`). A run-wide
            setting: every model a method builds for the run starts this way.
        grad_clip: clip every step's gradients to this global L2 norm (0: no clipping).
        floor_epochs: the most epochs the ``min_steps`` floor may raise training to (0: no
            bound), so that what the floor costs is at most this many passes over the data
            however the data are split.

    This is the one object run-wide training settings reach methods through (a context's
    ``train_config``); adding a setting touches the config that fills it, this class and
    its test.
    """

    epochs: int = 5
    batch_size: int = 64
    lr: float = 0.01
    optimizer: Literal["sgd", "adam", "adamw"] = "sgd"
    momentum: float = 0.9
    weight_decay: float = 0.0
    min_steps: int = 0
    init: Init = "he"
    grad_clip: float = 0.0
    floor_epochs: int = 0

    def validate(self) -> None:
        require(self.grad_clip >= 0, "grad_clip", ">= 0 (0: no clipping)", self.grad_clip)
        require(self.init in INITS, "init", f"one of {', '.join(INITS)}", self.init)
        require(self.epochs >= 0, "epochs", ">= 0", self.epochs)
        require(self.min_steps >= 0, "min_steps", ">= 0", self.min_steps)
        require(self.floor_epochs >= 0, "floor_epochs", ">= 0 (0: no bound)", self.floor_epochs)
        require(self.batch_size >= 1, "batch_size", ">= 1", self.batch_size)
        require(self.lr > 0, "lr", "> 0", self.lr)
        require(0 <= self.momentum < 1, "momentum", "in [0, 1)", self.momentum)
        require(self.weight_decay >= 0, "weight_decay", ">= 0", self.weight_decay)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class FitHooks:
    """Callbacks of :func:`fit` (each optional).

    Attributes:
        epoch_start: called with the 0-based epoch before its first step.
        step_end: called after every optimiser step (e.g. re-applying pruning masks).
        epoch_end: called with the 0-based epoch after its last step.
    """

    epoch_start: Callable[[int], None] | None = None
    step_end: Callable[[], None] | None = None
    epoch_end: Callable[[int], object] | None = None


@dataclass(frozen=True)
class FitStats:
    """What a training run did."""

    steps: int
    final_loss: float
    seconds: float


def make_optimizer(
    params: Sequence[torch.Tensor],
    cfg: TrainConfig,
    betas: tuple[float, float] = (0.9, 0.999),
) -> torch.optim.Optimizer:
    """The optimizer ``cfg`` names, over ``params`` (``betas``: Adam's)."""
    if cfg.optimizer == "adam":
        return optim.Adam(params, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return optim.AdamW(params, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay)
    return optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def steps_per_epoch(n: int, batch_size: int) -> int:
    """Optimiser steps of one epoch over ``n`` examples (as :func:`batch_indices` batches
    them: a trailing batch of one joins the previous one)."""
    if n <= 0:
        return 0
    steps = -(-n // batch_size)
    last = n - (steps - 1) * batch_size
    return steps - 1 if steps > 1 and last == 1 else steps


def budget_epochs(cfg: TrainConfig, n: int) -> int:
    """The epochs ``cfg`` trains over ``n`` examples: ``max(epochs, min(⌈min_steps / steps per
    epoch⌉, floor_epochs))`` — whole epochs, so epoch-windowed schedules (curricula, pruning)
    keep their meaning; the floor's epochs bounded by ``floor_epochs`` (0: unbounded), so the
    floor never costs more than that many passes over the data, however finely they are
    split; ``epochs`` alone when ``min_steps`` is 0 or there are no examples (and 0 epochs
    stay 0: a switched-off training)."""
    per_epoch = steps_per_epoch(n, cfg.batch_size)
    if cfg.min_steps == 0 or per_epoch == 0 or cfg.epochs == 0:
        return cfg.epochs
    floor = -(-cfg.min_steps // per_epoch)
    if cfg.floor_epochs > 0:
        floor = min(floor, cfg.floor_epochs)
    return max(cfg.epochs, floor)


def resolve_budget(cfg: TrainConfig, n: int) -> TrainConfig:
    """``cfg`` with the epochs it trains over ``n`` examples (:func:`budget_epochs`); resolving
    again with the same ``n`` changes nothing."""
    epochs = budget_epochs(cfg, n)
    return cfg if epochs == cfg.epochs else replace(cfg, epochs=epochs)


def batch_indices(n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """One epoch of shuffled index batches; a trailing batch of one joins the previous one.

    BatchNorm cannot train on a batch of one example, so such a remainder is merged.
    """
    order = torch.randperm(n, generator=generator)
    batches = list(order.split(batch_size))
    if len(batches) > 1 and len(batches[-1]) == 1:
        last = batches.pop()
        batches[-1] = torch.cat([batches[-1], last])
    return batches


def fit(
    model: nn.Module,
    tensors: Batch,
    loss_fn: LossFn,
    cfg: TrainConfig,
    generator: torch.Generator,
    device: torch.device,
    tracker: Tracker | None = None,
    description: str = "training",
    hooks: FitHooks | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> FitStats:
    """Train ``model`` in place on ``tensors`` (aligned along dim 0) with ``loss_fn``.

    Args:
        model: the module to train (moved to ``device``; left there in eval mode).
        tensors: aligned tensors, sliced together per batch (e.g. ``(x, y)``, ``(x, soft)``).
        loss_fn: ``loss_fn(model, batch_on_device) -> scalar loss``.
        cfg: optimiser settings; its ``min_steps`` floor is resolved over ``tensors``
            (:func:`budget_epochs`), so a loop that calls ``fit`` once per epoch should pass
            ``min_steps=0``.
        generator: the shuffling stream.
        device: where to compute.
        tracker: progress display (steps).
        description: progress label.
        hooks: callbacks at epoch and step boundaries.
        optimizer: an optimiser over ``model``'s parameters whose state carries over from an
            earlier call (default: a fresh one from ``cfg``).
    """
    n = int(tensors[0].shape[0])
    if any(int(t.shape[0]) != n for t in tensors):
        raise ValueError(f"tensors differ in length: {[int(t.shape[0]) for t in tensors]}")
    on_device(model, device)
    start = time.perf_counter()
    cfg = resolve_budget(cfg, n)
    if n == 0 or cfg.epochs == 0:
        model.eval()
        return FitStats(0, math.nan, 0.0)
    if optimizer is None:
        optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad], cfg)
    per_epoch = steps_per_epoch(n, cfg.batch_size)
    steps, loss_value = 0, math.nan
    hooks = hooks or FitHooks()
    resident = tuple(t.to(device) for t in tensors)  # once, not a copy per step
    every_step = device.type == "cpu"  # where reading a loss costs no device sync
    model.train()
    with (tracker or NullTracker()).task(description, cfg.epochs * per_epoch) as advance:
        for epoch in range(cfg.epochs):
            if hooks.epoch_start is not None:
                hooks.epoch_start(epoch)
            values: list[float] = []
            pending: list[torch.Tensor] = []  # losses not read yet
            for idx in epoch_batches(n, cfg.batch_size, generator, device):
                batch = tuple(t[idx] for t in resident)
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(model, batch)
                pending.append(loss.detach())
                if every_step:
                    values += _check_finite(pending, steps, description)
                    pending = []
                loss.backward()
                if cfg.grad_clip > 0:
                    clip_grad_norm_(model.parameters(), cfg.grad_clip)
                optimizer.step()
                if hooks.step_end is not None:
                    hooks.step_end()
                steps += 1
                advance(1)
            values += _check_finite(pending, steps - len(pending), description)
            loss_value = values[-1]
            report_scalar(tracker, f"loss/{description}", epoch, sum(values) / len(values))
            if hooks.epoch_end is not None:
                hooks.epoch_end(epoch)
    model.eval()
    return FitStats(steps, loss_value, time.perf_counter() - start)


def epoch_batches(
    n: int, batch_size: int, generator: torch.Generator, device: torch.device
) -> list[torch.Tensor]:
    """:func:`batch_indices` on ``device``: drawn from ``generator`` as on the CPU, then moved
    in one copy per epoch."""
    batches = batch_indices(n, batch_size, generator)
    if device.type == "cpu":
        return batches
    return list(torch.cat(batches).to(device).split([len(b) for b in batches]))


def _check_finite(losses: Sequence[torch.Tensor], first_step: int, description: str) -> list[float]:
    """The values of ``losses`` (read in one transfer), or FloatingPointError at the first
    that is not finite — per step on the CPU, per epoch on a device (a step's loss read on
    a GPU would wait for it)."""
    if not losses:
        return []
    values = [float(v) for v in torch.stack([v.reshape(()) for v in losses]).tolist()]
    for i, value in enumerate(values):
        if not math.isfinite(value):
            raise FloatingPointError(
                f"{description}: loss became {value} at step {first_step + i}; "
                "lower the learning rate"
            )
    return values


def cross_entropy_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Plain supervised loss on an ``(x, y)`` batch."""
    x, y = batch
    return F.cross_entropy(model(x), y)


def train_classifier(
    model: nn.Module,
    data: LabelledData,
    cfg: TrainConfig,
    generator: torch.Generator,
    device: torch.device,
    regulariser: Callable[[nn.Module], torch.Tensor] | None = None,
    tracker: Tracker | None = None,
    description: str = "training",
) -> FitStats:
    """Supervised training with cross-entropy, plus an optional regulariser on the model."""

    def loss_fn(m: nn.Module, batch: Batch) -> torch.Tensor:
        loss = cross_entropy_loss(m, batch)
        return loss if regulariser is None else loss + regulariser(m)

    return fit(model, (data.x, data.y), loss_fn, cfg, generator, device, tracker, description)


@torch.no_grad()
def predict_logits(
    model: nn.Module, x: torch.Tensor, device: torch.device, batch_size: int = 1024
) -> torch.Tensor:
    """Logits of ``model`` on ``x`` in eval mode, returned on the CPU (memoised inside
    :func:`~oneshotfl.training.memo.memoised_logits` over ``x``)."""

    def compute() -> torch.Tensor:
        on_device(model, device).eval()
        outs = [model(chunk.to(device)).float().cpu() for chunk in x.split(batch_size)]
        if not outs:
            return torch.empty(0)
        return torch.cat(outs)

    return memo.lookup(model, x, f"{device}/{batch_size}", compute)


def many_logits(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    device: torch.device,
    batch_size: int = 1024,
    stack: bool = True,
) -> list[torch.Tensor]:
    """Each model's logits on ``x`` (eval mode, on the CPU), as an outcome is evaluated
    (:func:`oneshotfl.models.stacked.stacked_logits`): on a CPU one model at a time with its
    convolutions in channels-last layout; on a GPU, with ``stack``, the models of one
    architecture in shared vectorised passes. Memoised as :func:`predict_logits` is, apart
    from it: they agree up to the floating-point order of the kernels."""

    def compute(some: list[nn.Module]) -> list[torch.Tensor]:
        return stacked_logits(some, x, device, batch_size, stack=stack)

    how = f"{device}/{batch_size}/{pass_kind(device, stack)}"
    return memo.lookup_many(list(models), x, how, compute)


def accuracy(probs_or_logits: torch.Tensor, y: torch.Tensor) -> float:
    """Top-1 accuracy of class scores against labels."""
    if len(y) == 0:
        return math.nan
    return float((probs_or_logits.argmax(dim=1) == y).float().mean())
