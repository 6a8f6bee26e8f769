"""Iterative magnitude pruning inside a client's fixed epoch budget (FedEOV's pruned variant).

The budget is ``E = S·e_p + e_f`` epochs: ``S`` stages of ``e_p`` epochs, each ending with a
pruning step, then ``e_f`` fine-tuning epochs. Stage ``k`` (1-based) prunes after 0-based epoch
``k·e_p - 1`` to a target sparsity of ``1 - (1-s)^(k/S)`` (``geometric``: every stage removes
the same fraction of the remaining weights, the classic iterative magnitude pruning) or
``s·k/S`` (``linear``); after stage ``S`` both reach ``s`` exactly.

Prunable weights are the ``weight`` parameters of ``Conv1d/2d/3d`` and ``Linear`` modules;
biases, normalisation layers and embeddings are never pruned. Masks are plain boolean tensors
kept beside the model (``True`` = kept): the module is never reparametrised, so its
``state_dict`` keys and shapes stay as they were. Call :meth:`MagnitudePruner.apply` after every
optimizer step (momentum and weight decay would otherwise revive pruned weights) and
:meth:`MagnitudePruner.on_epoch_end` after every epoch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from oneshotfl.params import Params, is_int, is_number, require

PRUNABLE = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


class PruningError(ValueError):
    """A pruning schedule, stage or model that cannot be pruned as asked."""


@dataclass(frozen=True)
class PruningSchedule(Params):
    """When and how far a client model is pruned within its epoch budget.

    Attributes:
        stages: pruning stages ``S`` (>= 1).
        epochs_per_stage: training epochs before each pruning step, ``e_p`` (>= 1).
        finetune_epochs: epochs after the last pruning step, ``e_f`` (>= 0).
        sparsity: fraction ``s`` of prunable weights that are zero after stage ``S``, in [0, 1).
        schedule: ``geometric`` (``1 - (1-s)^(k/S)`` after stage ``k``) or ``linear`` (``s·k/S``).
        scope: ``global`` (one magnitude ranking over all prunable weights) or ``layer`` (the
            same fraction pruned in every layer).
        rewind: after each pruning step, reset the kept weights (every parameter) to their
            initial values and the BatchNorm statistics (FedEOV's Algorithm 2, line 16: the
            lottery-ticket rewind); needs ``finetune_epochs >= 1``.
        keep_head: never prune the classifier ``head`` (the FedEOV code's choice).
    """

    stages: int
    epochs_per_stage: int
    finetune_epochs: int
    sparsity: float
    schedule: Literal["geometric", "linear"] = "geometric"
    scope: Literal["global", "layer"] = "global"
    rewind: bool = False
    keep_head: bool = False

    def validate(self) -> None:
        require(is_int(self.stages, 1), "stages", "an int >= 1", self.stages)
        e_p, e_f, s = self.epochs_per_stage, self.finetune_epochs, self.sparsity
        require(is_int(e_p, 1), "epochs_per_stage", "an int >= 1", e_p)
        require(is_int(e_f, 0), "finetune_epochs", "an int >= 0", e_f)
        require(is_number(s) and 0 <= s < 1, "sparsity", "a number in [0, 1)", s)
        ok = not self.rewind or e_f >= 1
        require(ok, "finetune_epochs", ">= 1 with rewind (else the rewound model is sent)", e_f)

    @property
    def total_epochs(self) -> int:
        """The whole epoch budget ``S·e_p + e_f``."""
        return self.stages * self.epochs_per_stage + self.finetune_epochs

    def sparsity_after(self, stage: int) -> float:
        """Target fraction of zero prunable weights after ``stage`` (1..S)."""
        S = self.stages
        require(is_int(stage) and 1 <= stage <= S, "stage", f"an int in 1..{S}", stage)
        if stage == S:
            return float(self.sparsity)
        if self.schedule == "geometric":
            return 1.0 - (1.0 - self.sparsity) ** (stage / S)
        return self.sparsity * stage / S

    def prune_after_epoch(self, epoch: int) -> int | None:
        """The stage whose pruning step ends 0-based ``epoch``, or None (stage k: ``k·e_p - 1``)."""
        require(is_int(epoch, 0), "epoch", "an int >= 0", epoch)
        stage, rest = divmod(epoch + 1, self.epochs_per_stage)
        return stage if rest == 0 and 1 <= stage <= self.stages else None


class MagnitudePruner:
    """Masks of the smallest-magnitude weights of a model, grown stage by stage.

    Args:
        model: the model to prune; its modules are never changed, only weight values.
        schedule: when and how far to prune.

    Attributes:
        masks: ``state_dict`` key of each prunable weight → boolean mask (``True`` = kept).
        stage: the last stage pruned (0 before the first).
    """

    def __init__(self, model: nn.Module, schedule: PruningSchedule) -> None:
        self.model = model
        self.schedule = schedule
        self._modules: dict[str, nn.Module] = {}
        seen: set[int] = set()
        for name, module in model.named_modules():
            weight = getattr(module, "weight", None)
            tied = id(weight) in seen  # a weight shared by two modules is pruned once
            head = schedule.keep_head and (name == "head" or name.startswith("head."))
            if isinstance(module, PRUNABLE) and isinstance(weight, nn.Parameter) and not tied:
                if head:
                    continue
                seen.add(id(weight))
                self._modules[f"{name}.weight" if name else "weight"] = module
        if not self._modules:
            raise PruningError("pruning model: expected a Conv1d/2d/3d or Linear weight, got none")
        self.masks = {name: torch.ones_like(w, dtype=torch.bool) for name, w in self._weights()}
        self.stage = 0
        self.initial = (
            {k: v.detach().clone() for k, v in model.named_parameters()} if schedule.rewind else {}
        )

    def _weights(self) -> list[tuple[str, torch.Tensor]]:
        """The prunable weights, looked up afresh (the model may have moved device)."""
        return [(name, _weight(module, name)) for name, module in self._modules.items()]

    def _mask(self, name: str, weight: torch.Tensor) -> torch.Tensor:
        mask = self.masks[name]
        shape, expected = tuple(weight.shape), f"the mask's shape {tuple(mask.shape)}"
        require(shape == tuple(mask.shape), f"weight {name}", expected, shape)
        if mask.device != weight.device:
            mask = self.masks[name] = mask.to(weight.device)
        return mask

    @torch.no_grad()
    def prune(self, stage: int) -> None:
        """Prune to ``schedule.sparsity_after(stage)``, then zero the pruned weights.

        Exactly ``round(target·N)`` weights end up masked (N over all prunable weights, or per
        layer in ``layer`` scope): the smallest ``|w|`` among those still kept are added, ties
        going to the lower index; masked weights stay masked, so an earlier stage after a
        later one changes nothing.
        """
        target = self.schedule.sparsity_after(stage)
        weights = self._weights()
        groups = [weights] if self.schedule.scope == "global" else [[item] for item in weights]
        for group in groups:
            device = group[0][1].device
            keep = torch.cat([self._mask(n, w).flatten().to(device) for n, w in group])
            extra = round(target * keep.numel()) - int((~keep).sum())
            if extra <= 0:
                continue
            dtype = functools.reduce(
                torch.promote_types, [w.dtype for _, w in group], torch.float32
            )
            scores = torch.cat([w.abs().flatten().to(device, dtype) for _, w in group])
            scores.masked_fill_(~keep, math.inf)
            keep[torch.sort(scores, stable=True).indices[:extra]] = False
            pieces = keep.split([w.numel() for _, w in group])
            for (name, w), piece in zip(group, pieces, strict=True):
                self.masks[name] = piece.view_as(w).to(w.device)
        self.stage = max(self.stage, stage)
        if self.schedule.rewind:
            self._rewind()
        self.apply()

    @torch.no_grad()
    def _rewind(self) -> None:
        """Every parameter back to its initial value, BatchNorm statistics reset."""
        for name, param in self.model.named_parameters():
            param.copy_(self.initial[name].to(param.device, param.dtype))
        for module in self.model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.reset_running_stats()

    @torch.no_grad()
    def apply(self) -> None:
        """Re-zero the pruned weights in place (call after every optimizer step)."""
        if self.stage == 0:  # masks only change in prune(), so nothing is masked yet
            return
        for name, weight in self._weights():
            weight.masked_fill_(~self._mask(name, weight), 0)

    def on_epoch_end(self, epoch: int) -> int | None:
        """Prune if 0-based ``epoch`` ends a stage; return that stage, else None."""
        stage = self.schedule.prune_after_epoch(epoch)
        if stage is not None:
            self.prune(stage)
        return stage

    def _zeros(self) -> dict[str, tuple[int, int]]:
        return {n: (w.numel() - int(torch.count_nonzero(w)), w.numel()) for n, w in self._weights()}

    def sparsity(self) -> float:
        """Measured fraction of exactly-zero prunable weights (kept weights at 0 count too)."""
        counts = self._zeros().values()
        return sum(z for z, _ in counts) / sum(n for _, n in counts)

    def report(self) -> dict[str, Any]:
        """Target and measured sparsity, per-layer sparsity and parameter counts (JSON-able)."""
        zeros = self._zeros()
        params = list(self.model.parameters())
        return {
            "schedule": self.schedule.schedule,
            "scope": self.schedule.scope,
            "stage": self.stage,
            "target": float(self.schedule.sparsity),
            "stage_target": self.schedule.sparsity_after(self.stage) if self.stage else 0.0,
            "sparsity": self.sparsity(),
            "layers": {name: z / n for name, (z, n) in zeros.items()},
            "prunable_params": sum(n for _, n in zeros.values()),
            "total_params": sum(p.numel() for p in params),
            "nonzero_params": sum(int(torch.count_nonzero(p)) for p in params),
        }


def _weight(module: nn.Module, name: str) -> torch.Tensor:
    weight = module.weight
    if not isinstance(weight, torch.Tensor):
        raise PruningError(f"pruning {name}: expected a tensor, got {type(weight).__name__}")
    return weight
