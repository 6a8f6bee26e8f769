"""Server-side synthesis: train a data generator and a learner alternately, data-free.

Data-free one-shot methods (DENSE, Co-Boosting, F-ADI/DeepInversion, F-DAFL, IntactOFL) all
run the same outer loop on the server: draw noise, take a few generator steps on a method-specific
loss (teacher cross-entropy, BatchNorm statistics, adversarial disagreement, ...), generate a
batch, then take a few learner steps on it (a student distilled from the teachers, or an MoE gate
over frozen experts). :func:`synthesise` is that loop; a method supplies only its losses through
a :class:`SynthesisProblem`. :class:`BatchNormStatistics` provides the DeepInversion / DENSE
feature-statistics term that most generator losses include.

Pool modes (:attr:`SynthesisConfig.pool`): ``"latest"`` trains the learner on the round's fresh
samples only (DENSE, F-ADI, F-DAFL); ``"accumulate"`` keeps a growing pool D_A of everything
generated so far and samples learner batches from it (IntactOFL's Algorithm 1, Co-Boosting).

All randomness comes from the caller's ``torch.Generator``: the same seed and the same initial
weights give bit-identical results.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from oneshotfl.params import Params, is_int, is_number, require
from oneshotfl.training.loop import TrainConfig, make_optimizer
from oneshotfl.training.progress import NullTracker, Tracker

_Pool = tuple[torch.Tensor, torch.Tensor]
_Hook = Callable[[nn.Module, tuple[torch.Tensor, ...], torch.Tensor], None]


class BatchNormStatistics:
    """Context manager recording BatchNorm input statistics of frozen teachers.

    Inside the ``with`` block every forward pass through a teacher records, per BatchNorm layer,
    the batch mean and biased variance of the layer's input (over all dims but the channel dim).
    A layer's record is overwritten by its next forward pass; call :meth:`clear` between passes
    to forget them. Teachers are put in eval mode on enter (running statistics never change) and
    their previous modes are restored on exit, when the hooks are removed.

    Teachers without BatchNorm layers (an MLP, a LeNet without BN) have ``layers == 0``; the term
    is then a constant zero, so the BN regulariser simply drops out of such methods' losses.
    Layers built with ``track_running_stats=False`` have no reference statistics and are skipped.
    """

    def __init__(self, teachers: Sequence[nn.Module]) -> None:
        self._teachers = list(teachers)
        self._bns = [
            m
            for t in self._teachers
            for m in t.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None
        ]
        self._terms: dict[int, torch.Tensor] = {}
        self._handles: list[RemovableHandle] = []
        self._modes: list[bool] = []

    @property
    def layers(self) -> int:
        """Number of BatchNorm layers hooked across all teachers."""
        return len(self._bns)

    def __enter__(self) -> BatchNormStatistics:
        self._modes = [t.training for t in self._teachers]
        for t in self._teachers:
            t.eval()
        self._handles = [
            bn.register_forward_hook(self._make_hook(i)) for i, bn in enumerate(self._bns)
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for t, mode in zip(self._teachers, self._modes, strict=True):
            t.train(mode)
        self.clear()

    def _make_hook(self, index: int) -> _Hook:
        def hook(module: nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            assert isinstance(module, nn.modules.batchnorm._BatchNorm)
            x = args[0]
            dims = [0, *range(2, x.dim())]
            mean = x.mean(dim=dims)
            var = x.var(dim=dims, unbiased=False)
            assert module.running_mean is not None and module.running_var is not None
            self._terms[index] = torch.linalg.vector_norm(
                mean - module.running_mean.to(mean.dtype)
            ) + torch.linalg.vector_norm(var - module.running_var.to(var.dtype))

        return hook

    def clear(self) -> None:
        """Forget the recorded statistics."""
        self._terms = {}

    def loss(self) -> torch.Tensor:
        """``sum_l ||mu_l - running_mean_l||_2 + ||var_l - running_var_l||_2``, 0-dim.

        Differentiable with respect to the teachers' inputs; a zero tensor when nothing was
        recorded (no BN layer, or no forward pass since the last :meth:`clear`).
        """
        if not self._terms:
            return torch.zeros(())
        return torch.stack(list(self._terms.values())).sum()


@dataclass(frozen=True)
class SynthesisConfig(Params):
    """Hyper-parameters of :func:`synthesise`.

    Attributes:
        rounds: outer epochs T.
        generator_steps: generator updates per round.
        learner_steps: learner updates per round.
        batch_size: generated samples per round, and examples per learner step.
        noise_dim: width of the noise z (used by the problem's ``sample``).
        generator_lr: generator learning rate.
        learner_lr: learner learning rate.
        generator_optimizer: ``adam`` or ``sgd`` (with ``momentum``).
        learner_optimizer: ``adam`` or ``sgd`` (with ``momentum``).
        momentum: SGD momentum, in [0, 1).
        pool: ``latest`` (fresh samples only) or ``accumulate`` (growing pool D_A).
        max_pool: cap on the ``accumulate`` pool (oldest samples dropped first); None = no cap.
        noise: draw (z, y) once per round and take every generator step on it
            (``per_round``, IntactOFL's Algorithm 1) or afresh before every generator step
            (``per_step``); the pool receives the round's last batch.
    """

    rounds: int
    generator_steps: int
    learner_steps: int
    batch_size: int
    noise_dim: int
    generator_lr: float
    learner_lr: float
    generator_optimizer: Literal["adam", "sgd"] = "adam"
    learner_optimizer: Literal["adam", "sgd"] = "adam"
    momentum: float = 0.9
    pool: Literal["latest", "accumulate"] = "latest"
    max_pool: int | None = None
    noise: Literal["per_round", "per_step"] = "per_round"

    def validate(self) -> None:
        for name in ("rounds", "batch_size", "noise_dim"):
            require(is_int(getattr(self, name), 1), name, "an int >= 1", getattr(self, name))
        for name in ("generator_steps", "learner_steps"):
            require(is_int(getattr(self, name), 0), name, "an int >= 0", getattr(self, name))
        for name in ("generator_lr", "learner_lr"):
            value = getattr(self, name)
            require(is_number(value) and value > 0, name, "> 0", value)
        ok = is_number(self.momentum) and 0 <= self.momentum < 1
        require(ok, "momentum", "in [0, 1)", self.momentum)
        max_ok = self.max_pool is None or (
            self.pool == "accumulate" and is_int(self.max_pool, self.batch_size)
        )
        expected = f"None, or with pool=accumulate an int >= {self.batch_size}"
        require(max_ok, "max_pool", expected, self.max_pool)


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
        """Augment generated samples (no gradients) before the learner sees them.

        Random choices must come from ``generator`` (draw on its device, then move to ``x``'s).
        """
        ...


class NoAugmentation:
    """Mixin giving a :class:`SynthesisProblem` the identity augmentation."""

    def augment(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Return ``x`` unchanged."""
        return x


@dataclass(frozen=True)
class SynthesisStats:
    """What :func:`synthesise` did: per-round mean losses (NaN for a round without steps)."""

    generator_loss: list[float]
    learner_loss: list[float]
    pool_size: int
    seconds: float


def _optimizer(
    module: nn.Module, which: Literal["generator", "learner"], cfg: SynthesisConfig
) -> torch.optim.Optimizer | None:
    """The ``which`` optimiser over the trainable parameters of ``module``; None if no steps."""
    if which == "generator":
        steps, kind, lr = cfg.generator_steps, cfg.generator_optimizer, cfg.generator_lr
    else:
        steps, kind, lr = cfg.learner_steps, cfg.learner_optimizer, cfg.learner_lr
    if steps == 0:
        return None
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"the {which} has no parameters with requires_grad=True to optimise")
    train_cfg = TrainConfig(epochs=1, batch_size=1, lr=lr, optimizer=kind, momentum=cfg.momentum)
    return make_optimizer(params, train_cfg)


def _step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, which: str, where: str) -> float:
    """One update on a finite ``loss``; its value."""
    value = float(loss.detach())
    if not math.isfinite(value):
        raise FloatingPointError(
            f"{where}: the {which} loss became {value}; lower the {which} learning rate"
        )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return value


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _draw(pool: _Pool, batch_size: int, rng: torch.Generator) -> _Pool:
    """A batch of ``batch_size`` pool samples without replacement, indices drawn with ``rng``."""
    x, y = pool
    idx = torch.randperm(len(x), generator=rng)[:batch_size].to(x.device)
    return x[idx], y[idx]


def _grow(pool: _Pool | None, fresh: _Pool, cfg: SynthesisConfig) -> _Pool:
    """The pool after adding ``fresh``: replaced (``latest``) or appended and capped."""
    if cfg.pool == "latest" or pool is None:
        return fresh
    x, y = torch.cat([pool[0], fresh[0]]), torch.cat([pool[1], fresh[1]])
    if cfg.max_pool is not None and len(x) > cfg.max_pool:
        x, y = x[-cfg.max_pool :], y[-cfg.max_pool :]
    return x, y


def _generator_round(
    generator: nn.Module,
    learner: nn.Module,
    problem: SynthesisProblem,
    optimizer: torch.optim.Optimizer | None,
    cfg: SynthesisConfig,
    draw: Callable[[], _Pool],
    where: str,
) -> tuple[float, _Pool]:
    """``cfg.generator_steps`` updates, on one noise batch from ``draw`` or (``noise=
    "per_step"``) a fresh one per step; learner gradients are discarded. Returns the mean
    loss and the last batch."""
    z, y = draw()
    generator.train()
    learner.eval()
    losses = []
    for step in range(cfg.generator_steps):
        assert optimizer is not None
        if step and cfg.noise == "per_step":
            z, y = draw()
        loss = problem.generator_loss(generator(z, y), y, learner)
        losses.append(_step(optimizer, loss, "generator", where))
        learner.zero_grad(set_to_none=True)
    return _mean(losses), (z, y)


def _learner_round(
    learner: nn.Module,
    problem: SynthesisProblem,
    optimizer: torch.optim.Optimizer | None,
    pool: _Pool,
    cfg: SynthesisConfig,
    rng: torch.Generator,
    where: str,
) -> float:
    """``cfg.learner_steps`` learner updates on batches drawn from ``pool``."""
    learner.train()
    losses = []
    for _ in range(cfg.learner_steps):
        assert optimizer is not None
        loss = problem.learner_loss(learner, *_draw(pool, cfg.batch_size, rng))
        losses.append(_step(optimizer, loss, "learner", where))
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

    Each round draws ``(z, y)`` once, takes ``generator_steps`` generator updates on
    ``problem.generator_loss(generator(z, y), y, learner)`` (learner in eval mode; learner
    gradients are discarded, only the generator's optimiser steps), generates
    ``x = generator(z, y)`` without gradients (generator still in train mode, as optimised),
    augments it into the pool, and takes ``learner_steps`` learner updates (learner in train
    mode) on batches drawn from the pool.
    Optimisers are built once and keep their state across rounds; only parameters with
    ``requires_grad`` are optimised. The pool lives on ``device``.

    Args:
        generator: maps ``(z, y)`` to samples; moved to ``device``, left in eval mode.
        learner: student or gate; moved to ``device``, left in eval mode.
        problem: the method's sampling, losses and augmentation.
        cfg: loop settings.
        rng: the only randomness source (noise, labels, augmentation, batch indices).
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
    gen_opt, learn_opt = (
        _optimizer(generator, "generator", cfg),
        _optimizer(learner, "learner", cfg),
    )
    gen_hist: list[float] = []
    learn_hist: list[float] = []
    pool: _Pool | None = None
    with (tracker or NullTracker()).task(description, cfg.rounds) as advance:

        def draw() -> _Pool:
            z, y = problem.sample(cfg.batch_size, rng)
            return z.to(device), y.to(device)

        for t in range(cfg.rounds):
            where = f"{description}, round {t}"
            loss, (z, y) = _generator_round(generator, learner, problem, gen_opt, cfg, draw, where)
            gen_hist.append(loss)
            with torch.no_grad():
                pool = _grow(pool, (problem.augment(generator(z, y), rng).detach(), y), cfg)
            learn_hist.append(_learner_round(learner, problem, learn_opt, pool, cfg, rng, where))
            advance(1)
    generator.eval()
    learner.eval()
    size = 0 if pool is None else len(pool[0])
    return SynthesisStats(gen_hist, learn_hist, size, time.perf_counter() - start)
