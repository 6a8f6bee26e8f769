"""The settings of :func:`oneshotfl.training.synthesis.synthesise`: the loop's own
(:class:`SynthesisConfig`) and the sizes a data-free method exposes as knobs
(:class:`SynthesisBudget`, with the authors' loop of DENSE, Co-Boosting and IntactOFL)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from oneshotfl.params import Params, is_int, is_number, require


@dataclass(frozen=True)
class SynthesisConfig(Params):
    """Hyper-parameters of :func:`synthesise`.

    Attributes:
        rounds: outer epochs T.
        generator_steps: generator updates per round.
        learner_steps: learner updates per round (``learner_batches="steps"``).
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
        generator_beta1: Adam's β₁ for the generator (the authors' synthesisers use 0.5).
        generator_reset: re-initialise the generator (DCGAN init from the loop's stream) and
            its optimiser at the start of every round (DENSE, Co-Boosting, IntactOFL code).
        optimise_noise: the round's z is a parameter of the generator's optimiser too.
        keep: the batch that joins the pool: ``last`` (generated after the last step) or
            ``best`` (the inputs of the lowest-loss generator step).
        clip: gradient-norm clip of both updates (None = none).
        learner_batches: ``steps`` (``learner_steps`` batches drawn from the pool) or ``pass``
            (one shuffled pass over the whole pool, the last partial batch kept).
        learner_batch: examples per learner step (None = ``batch_size``).
        learner_weight_decay: L2 penalty of the learner's optimiser.
        learner_cosine: cosine-anneal the learner's rate over the rounds (stepped per round).
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
    generator_beta1: float = 0.9
    generator_reset: bool = False
    optimise_noise: bool = False
    keep: Literal["last", "best"] = "last"
    clip: float | None = None
    learner_batches: Literal["steps", "pass"] = "steps"
    learner_batch: int | None = None
    learner_weight_decay: float = 0.0
    learner_cosine: bool = False

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
        beta = self.generator_beta1
        require(is_number(beta) and 0 <= beta < 1, "generator_beta1", "in [0, 1)", beta)
        clip_ok = self.clip is None or (is_number(self.clip) and self.clip > 0)
        require(clip_ok, "clip", "None or > 0", self.clip)
        lb = self.learner_batch
        require(lb is None or is_int(lb, 1), "learner_batch", "None or an int >= 1", lb)
        wd = self.learner_weight_decay
        require(is_number(wd) and wd >= 0, "learner_weight_decay", ">= 0", wd)
        require(
            not (self.optimise_noise and self.noise == "per_step"),
            "optimise_noise",
            "False with noise=per_step (the optimised z is the round's one draw)",
            self.optimise_noise,
        )


@dataclass(frozen=True)
class SynthesisBudget(Params):
    """The sizes a data-free method exposes as knobs (its ``Config`` inherits them).

    Attributes:
        rounds: outer epochs T: each round trains the generator, then the learner on what
            it generated.
        generator_steps: generator updates per round.
        batch_size: samples the generator makes per round, and the learner's batch size.
        noise_dim: nz, the length of the random vector the generator turns into an input.
        width: ngf, the generator's base number of channels (the authors use 64).
        generator_lr: the generator's Adam learning rate.
        learner_lr: the learning rate of the learner (the student, or IntactOFL's gate).
    """

    rounds: int = 30
    generator_steps: int = 10
    batch_size: int = 128
    noise_dim: int = 256
    width: int = 16
    generator_lr: float = 1e-3
    learner_lr: float = 0.01

    def validate(self) -> None:
        for name in ("rounds", "batch_size", "noise_dim", "width"):
            require(is_int(getattr(self, name), 1), name, "an int >= 1", getattr(self, name))
        require(is_int(self.generator_steps, 0), "generator_steps", ">= 0", self.generator_steps)
        for name in ("generator_lr", "learner_lr"):
            value = getattr(self, name)
            require(is_number(value) and value > 0, name, "> 0", value)

    def authors_loop(self) -> SynthesisConfig:
        """The loop of the DENSE, Co-Boosting and IntactOFL code (IntactOFL's repository):
        the generator re-initialised every round with its noise optimised (Adam β₁ = 0.5),
        the lowest-loss batch into an accumulating pool, one SGD pass (momentum 0.9, weight
        decay 1e-4, cosine) of the learner over the pool per round, gradients clipped at 10."""
        return SynthesisConfig(
            rounds=self.rounds,
            generator_steps=self.generator_steps,
            learner_steps=0,
            batch_size=self.batch_size,
            noise_dim=self.noise_dim,
            generator_lr=self.generator_lr,
            learner_lr=self.learner_lr,
            learner_optimizer="sgd",
            pool="accumulate",
            learner_batches="pass",
            generator_beta1=0.5,
            generator_reset=True,
            optimise_noise=True,
            keep="best",
            clip=10.0,
            learner_weight_decay=1e-4,
            learner_cosine=True,
        )
