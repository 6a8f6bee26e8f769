"""Server-side distillation: a student learns a teacher's outputs on unlabelled inputs.

One function, :func:`distil`, serves every method that distils (FedOL, FedHKT, FedDF, FedET,
FedKD, FedAGE's ensemble phase): it minimises ``mean_i w_i · ℓ(f_s(x_i), t_i)`` over the
inputs with the one training loop, where ``ℓ`` is a per-sample loss of the student's logits
and the targets (:func:`oneshotfl.functional.kl_to_student` and friends) and ``w`` optional
per-sample weights. Targets are either

* **fixed** (``targets``): tensors aligned with the inputs, computed once before training —
  the teacher's outputs on a public pool — and sliced with every batch; or
* **live** (``teacher``): a function of the input batch, evaluated without gradients at
  every step — the teacher for inputs that change (synthetic data, augmentation).

Generated inputs that are drawn afresh every step go through
:mod:`oneshotfl.training.synthesis` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from oneshotfl.training.loop import Batch, FitStats, TrainConfig, fit
from oneshotfl.training.progress import Tracker

RowLoss = Callable[..., torch.Tensor]
"""``loss(student_logits, *targets) -> [B]`` per-sample losses."""

TeacherFn = Callable[[torch.Tensor], torch.Tensor]
"""An input batch (on the device) → the teacher's targets for it."""


def distil(
    student: nn.Module,
    x: torch.Tensor,
    loss: RowLoss,
    cfg: TrainConfig,
    generator: torch.Generator,
    device: torch.device,
    *,
    targets: Sequence[torch.Tensor] = (),
    teacher: TeacherFn | None = None,
    weights: torch.Tensor | None = None,
    tracker: Tracker | None = None,
    description: str = "distillation",
) -> FitStats:
    """Train ``student`` in place so its outputs on ``x`` match the teacher's.

    Args:
        student: the model to train (left on ``device`` in eval mode).
        x: the inputs ``[N, ...]``.
        loss: per-sample loss ``loss(student(x_b), *targets_b) -> [B]``.
        cfg: optimiser settings (epochs are passes over ``x``).
        generator: the shuffling stream.
        device: where to compute.
        targets: fixed targets aligned with ``x`` (sliced per batch).
        teacher: live targets, ``teacher(x_b)``, appended after the fixed ones.
        weights: per-sample weights ``[N]``: the batch loss is ``mean(w · ℓ)``, else
            ``mean(ℓ)``.
        tracker: progress display.
        description: progress label.

    Raises:
        ValueError: when neither ``targets`` nor ``teacher`` is given.
    """
    if not targets and teacher is None:
        raise ValueError("distil: expected fixed targets or a teacher function, got neither")
    tensors: tuple[torch.Tensor, ...] = (x, *targets)
    weighted = weights is not None
    if weights is not None:
        tensors = (*tensors, weights)

    def loss_fn(model: nn.Module, batch: Batch) -> torch.Tensor:
        xb, *rest = batch
        w = rest.pop() if weighted else None
        if teacher is not None:
            with torch.no_grad():
                rest.append(teacher(xb))
        rows = loss(model(xb), *rest)
        return rows.mean() if w is None else (w * rows).mean()

    return fit(student, tensors, loss_fn, cfg, generator, device, tracker, description)
