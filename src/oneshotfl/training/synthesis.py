"""Server-side synthesis: train a data generator and a learner alternately, data-free.

Data-free one-shot methods (DENSE, Co-Boosting, F-ADI/DeepInversion, F-DAFL, IntactOFL) all
run the same outer loop on the server: draw noise, take a few generator steps on a method-specific
loss (teacher cross-entropy, BatchNorm statistics, adversarial disagreement, ...), generate a
batch, then take a few learner steps on it (a student distilled from the teachers, or an MoE gate
over frozen experts). :func:`synthesise` is that loop; a method supplies only its losses through
a :class:`SynthesisProblem`. :mod:`oneshotfl.training.synthesis_terms` holds the terms most
of them share (BatchNorm statistics, the DCGAN re-initialisation, ODS).

Pool modes (:attr:`SynthesisConfig.pool`): ``"latest"`` trains the learner on the round's fresh
samples only (DENSE, F-ADI, F-DAFL); ``"accumulate"`` keeps a growing pool D_A of everything
generated so far and samples learner batches from it (IntactOFL's Algorithm 1, Co-Boosting).
The options the authors' synthesisers add (DENSE, Co-Boosting and IntactOFL's code) are
switches of the same loop: a generator re-initialised every round whose input noise is
optimised with it, the lowest-loss batch kept, gradient clipping, one pass over the pool per
round, and a per-batch perturbation of the learner's inputs.

All randomness comes from the caller's ``torch.Generator``: the same seed and the same initial
weights give bit-identical results.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import nn

from oneshotfl.training.loop import TrainConfig, make_optimizer
from oneshotfl.training.progress import NullTracker, Tracker, report_scalar
from oneshotfl.training.synthesis_config import SynthesisBudget, SynthesisConfig
from oneshotfl.training.synthesis_terms import BatchNormStatistics, reinitialise

__all__ = [
    "BatchNormStatistics",
    "NoAugmentation",
    "SynthesisBudget",
    "SynthesisConfig",
    "SynthesisProblem",
    "SynthesisStats",
    "synthesise",
]

_Pool = tuple[torch.Tensor, torch.Tensor]


class SynthesisProblem(Protocol):
    """The losses a data-free method supplies to :func:`synthesise`.

    The generator is called as ``generator(z, y)``; an unconditional generator ignores ``y``.
    Subclass :class:`NoAugmentation` to get the identity ``augment``.
    """

    def sample(
        self, batch_size: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Noise z ``[B, noise_dim]`` and int64 labels y ``[B]``, drawn from ``generator`` only.

        Draw on the generator's device (usually the CPU); :func:`synthesise` moves them.
        """
        ...

    def generator_loss(self, x: torch.Tensor, y: torch.Tensor, learner: nn.Module) -> torch.Tensor:
        """Loss of the generated batch ``x``; gradients reach the generator through ``x``.
        ``learner`` is the student or gate being trained (for adversarial or gate terms:
        DENSE's disagreement, Co-Boosting's hard samples, IntactOFL's MoE loss); its
        gradients from this loss are discarded."""
        ...

    def learner_loss(self, learner: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Loss of ``learner`` on a batch of detached synthetic inputs."""
        ...

    def augment(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Augment generated samples (no gradients) before they join the pool.

        Random choices must come from ``generator`` (draw on its device, then move to ``x``'s).
        """
        ...

    def perturb(
        self, learner: nn.Module, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        """Perturb one learner batch drawn from the pool (e.g. ODS) before its update; random
        choices from ``generator`` as in :meth:`augment`."""
        ...

    def pool_grew(self, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator) -> None:
        """Called with the whole pool after it grows, before the learner's round (e.g.
        Co-Boosting's ensemble re-weighting on the synthetic set)."""
        ...


class NoAugmentation:
    """Mixin giving a :class:`SynthesisProblem` the identity augmentation and perturbation and
    no pool hook."""

    def augment(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Return ``x`` unchanged."""
        return x

    def perturb(
        self, learner: nn.Module, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        """Return ``x`` unchanged."""
        return x

    def pool_grew(self, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator) -> None:
        """Nothing to do."""


@dataclass(frozen=True)
class SynthesisStats:
    """What :func:`synthesise` did: per-round mean losses (NaN for a round without steps)."""

    generator_loss: list[float]
    learner_loss: list[float]
    pool_size: int
    seconds: float


def _optimizer(
    params: list[torch.Tensor], which: Literal["generator", "learner"], cfg: SynthesisConfig
) -> torch.optim.Optimizer | None:
    """The ``which`` optimiser over ``params``; None when it takes no steps."""
    if which == "generator":
        steps, kind, lr, wd = cfg.generator_steps, cfg.generator_optimizer, cfg.generator_lr, 0.0
    else:
        steps, kind, lr = cfg.learner_steps, cfg.learner_optimizer, cfg.learner_lr
        steps, wd = max(steps, cfg.learner_batches == "pass"), cfg.learner_weight_decay
    if steps == 0:
        return None
    if not params:
        raise ValueError(f"the {which} has no parameters with requires_grad=True to optimise")
    train_cfg = TrainConfig(
        epochs=1, batch_size=1, lr=lr, optimizer=kind, momentum=cfg.momentum, weight_decay=wd
    )
    beta1 = cfg.generator_beta1 if which == "generator" else 0.9
    return make_optimizer(params, train_cfg, betas=(beta1, 0.999))


def _trainable(module: nn.Module) -> list[torch.Tensor]:
    return [p for p in module.parameters() if p.requires_grad]


def _step(
    optimizer: torch.optim.Optimizer, loss: torch.Tensor, which: str, where: str, clip: float | None
) -> float:
    """One update on a finite ``loss`` (gradient norm clipped to ``clip``); its value."""
    value = float(loss.detach())
    if not math.isfinite(value):
        raise FloatingPointError(
            f"{where}: the {which} loss became {value}; lower the {which} learning rate"
        )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if clip is not None:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        torch.nn.utils.clip_grad_norm_(params, clip)
    optimizer.step()
    return value


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _batches(size: int, cfg: SynthesisConfig, rng: torch.Generator) -> list[torch.Tensor]:
    """The round's learner batches of pool indices: ``learner_steps`` draws without
    replacement, or (``pass``) one shuffled pass with the last partial batch kept."""
    batch = cfg.learner_batch or cfg.batch_size
    if cfg.learner_batches == "pass":
        return list(torch.randperm(size, generator=rng).split(batch))
    return [torch.randperm(size, generator=rng)[:batch] for _ in range(cfg.learner_steps)]


def _grow(pool: _Pool | None, fresh: _Pool, cfg: SynthesisConfig) -> _Pool:
    """The pool after adding ``fresh``: replaced (``latest``) or appended and capped."""
    if cfg.pool == "latest" or pool is None:
        return fresh
    x, y = torch.cat([pool[0], fresh[0]]), torch.cat([pool[1], fresh[1]])
    if cfg.max_pool is not None and len(x) > cfg.max_pool:
        x, y = x[-cfg.max_pool :], y[-cfg.max_pool :]
    return x, y


@dataclass
class _Generation:
    """The generator half of the loop: its optimiser (rebuilt each round when the generator is
    reset or z optimised) and one round's steps."""

    generator: nn.Module
    problem: SynthesisProblem
    cfg: SynthesisConfig
    draw: Callable[[], _Pool]
    optimizer: torch.optim.Optimizer | None = None

    def round(self, learner: nn.Module, rng: torch.Generator, where: str) -> tuple[float, _Pool]:
        """``generator_steps`` updates on one noise batch (``per_step``: a fresh one per
        step); learner gradients are discarded. Returns the mean loss and the batch that
        joins the pool (not yet augmented)."""
        cfg, generator = self.cfg, self.generator
        if cfg.generator_reset:
            reinitialise(generator, rng)
        z, y = self.draw()
        if cfg.optimise_noise:
            z = z.clone().requires_grad_(True)
        if self.optimizer is None or cfg.generator_reset or cfg.optimise_noise:
            extra = [z] if cfg.optimise_noise else []
            self.optimizer = _optimizer(_trainable(generator) + extra, "generator", cfg)
        generator.train()
        learner.eval()
        losses: list[float] = []
        best: torch.Tensor | None = None
        for step in range(cfg.generator_steps):
            assert self.optimizer is not None
            if step and cfg.noise == "per_step":
                z, y = self.draw()
            x = generator(z, y)
            loss = self.problem.generator_loss(x, y, learner)
            value = _step(self.optimizer, loss, "generator", where, cfg.clip)
            if cfg.keep == "best" and (best is None or value < min(losses)):
                best = x.detach()
            losses.append(value)
            learner.zero_grad(set_to_none=True)
        if best is None:
            with torch.no_grad():
                best = generator(z.detach(), y)
        return _mean(losses), (best, y)


def _learner_round(
    learner: nn.Module,
    problem: SynthesisProblem,
    optimizer: torch.optim.Optimizer | None,
    pool: _Pool,
    cfg: SynthesisConfig,
    rng: torch.Generator,
    where: str,
) -> float:
    """The round's learner updates on batches of ``pool`` (:func:`_batches`), each perturbed by
    the problem first."""
    learner.train()
    losses = []
    for idx in _batches(len(pool[0]), cfg, rng):
        assert optimizer is not None
        idx = idx.to(pool[0].device)
        x, y = pool[0][idx], pool[1][idx]
        x = problem.perturb(learner, x, y, rng)
        loss = problem.learner_loss(learner, x, y)
        losses.append(_step(optimizer, loss, "learner", where, cfg.clip))
    return _mean(losses)


def synthesise(
    generator: nn.Module,
    learner: nn.Module,
    problem: SynthesisProblem,
    cfg: SynthesisConfig,
    rng: torch.Generator,
    device: torch.device,
    tracker: Tracker | None = None,
    description: str = "synthesis",
) -> SynthesisStats:
    """Train ``generator`` and ``learner`` alternately, in place, for ``cfg.rounds`` rounds.

    Each round (``generator_reset``: re-initialises the generator first) draws ``(z, y)`` once,
    takes ``generator_steps`` generator updates on ``problem.generator_loss(generator(z, y), y,
    learner)`` (learner in eval mode; learner gradients are discarded, only the generator's
    optimiser steps; ``optimise_noise``: z too), puts the ``keep`` batch (``last``:
    ``generator(z, y)`` without gradients after the steps, generator still in train mode;
    ``best``: the lowest-loss step's) through ``problem.augment`` into the pool, and takes
    the learner updates (learner in train mode) on pool batches, each put through
    ``problem.perturb``. Optimisers keep their state across rounds (the generator's is rebuilt
    with a reset or an optimised z); only parameters with ``requires_grad`` are optimised. The
    pool lives on ``device``.

    Args:
        generator: maps ``(z, y)`` to samples; moved to ``device``, left in eval mode.
        learner: student or gate; moved to ``device``, left in eval mode.
        problem: the method's sampling, losses, augmentation and perturbation.
        cfg: loop settings.
        rng: the only randomness source (noise, labels, augmentation, batch indices, resets).
        device: where to compute.
        tracker: progress display (one step per round).
        description: progress label and error-message prefix.

    Raises:
        FloatingPointError: a loss became non-finite.
        ValueError: a module that must be updated has no trainable parameters.
    """
    start = time.perf_counter()
    generator.to(device)
    learner.to(device)
    learn_opt = _optimizer(_trainable(learner), "learner", cfg)
    schedule = (
        torch.optim.lr_scheduler.CosineAnnealingLR(learn_opt, cfg.rounds)
        if cfg.learner_cosine and learn_opt is not None
        else None
    )
    gen_hist: list[float] = []
    learn_hist: list[float] = []
    pool: _Pool | None = None

    def draw() -> _Pool:
        z, y = problem.sample(cfg.batch_size, rng)
        return z.to(device), y.to(device)

    generation = _Generation(generator, problem, cfg, draw)
    with (tracker or NullTracker()).task(description, cfg.rounds) as advance:
        for t in range(cfg.rounds):
            where = f"{description}, round {t}"
            loss, (x, y) = generation.round(learner, rng, where)
            gen_hist.append(loss)
            with torch.no_grad():
                pool = _grow(pool, (problem.augment(x, rng).detach(), y), cfg)
            problem.pool_grew(*pool, rng)
            learn_hist.append(_learner_round(learner, problem, learn_opt, pool, cfg, rng, where))
            report_scalar(tracker, f"loss/{description}: generator", t, loss)
            report_scalar(tracker, f"loss/{description}: learner", t, learn_hist[-1])
            if schedule is not None:
                schedule.step()
            advance(1)
    generator.eval()
    learner.eval()
    size = 0 if pool is None else len(pool[0])
    return SynthesisStats(gen_hist, learn_hist, size, time.perf_counter() - start)
