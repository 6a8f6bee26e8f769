"""The shared generator/learner synthesis layer: BN statistics term and the alternating loop."""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.training.synthesis import (
    BatchNormStatistics,
    NoAugmentation,
    SynthesisConfig,
    SynthesisProblem,
    SynthesisStats,
    synthesise,
)

CLASSES, NOISE, BATCH = 3, 8, 16
CPU = torch.device("cpu")


M = TypeVar("M", bound=nn.Module)


def built(seed: int, make: Callable[[], M]) -> M:
    """``make()`` with weights drawn from ``seed``, leaving the global RNG as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


class Generator(nn.Module):
    """Conditional generator: noise plus a label embedding, Linear to a 2x4x4 image."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(CLASSES, NOISE)
        self.fc = nn.Linear(NOISE, 2 * 4 * 4)

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(z + self.embed(y))).view(-1, 2, 4, 4)


def make_teacher() -> nn.Sequential:
    teacher = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(64, CLASSES),
    )
    bn, head = teacher[1], teacher[4]
    assert isinstance(bn, nn.BatchNorm2d) and isinstance(head, nn.Linear)
    assert bn.running_mean is not None and bn.running_var is not None
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 1.5)
        head.weight.mul_(5.0)  # confident teacher: a distillation target worth learning
    return teacher.eval().requires_grad_(False)


def make_student() -> nn.Sequential:
    return nn.Sequential(nn.Flatten(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, CLASSES))


class DistilProblem(NoAugmentation):
    """Generator: teacher CE + BN term (- adversarial KL); learner: distil the teacher softmax."""

    def __init__(
        self, teacher: nn.Module, bn: BatchNormStatistics, learner: nn.Module, adversarial: float
    ) -> None:
        self.teacher, self.bn, self.learner, self.adversarial = teacher, bn, learner, adversarial
        self.batch_sizes: list[int] = []

    def sample(
        self, batch_size: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.randn(batch_size, NOISE, generator=generator)
        return z, torch.randint(CLASSES, (batch_size,), generator=generator)

    def generator_loss(self, x: torch.Tensor, y: torch.Tensor, learner: nn.Module) -> torch.Tensor:
        self.bn.clear()
        logits = self.teacher(x)
        loss = F.cross_entropy(logits, y) + 0.1 * self.bn.loss()
        if self.adversarial:
            assert learner is self.learner  # the loop hands the learner it trains
            loss = loss - self.adversarial * kl(learner(x), logits)
        return loss

    def learner_loss(self, learner: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.batch_sizes.append(len(x))
        with torch.no_grad():
            target = self.teacher(x)
        return kl(learner(x), target)


def kl(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    return F.kl_div(
        F.log_softmax(student, 1), F.log_softmax(teacher, 1), reduction="batchmean", log_target=True
    )


def config(**overrides: Any) -> SynthesisConfig:
    values: dict[str, Any] = dict(
        rounds=3,
        generator_steps=2,
        learner_steps=3,
        batch_size=BATCH,
        noise_dim=NOISE,
        generator_lr=1e-2,
        learner_lr=1e-2,
    )
    values.update(overrides)
    return SynthesisConfig(**values)


def run(
    cfg: SynthesisConfig,
    learner: nn.Module | None = None,
    adversarial: float = 0.0,
    seed: int = 0,
) -> tuple[nn.Module, nn.Module, nn.Module, SynthesisStats, DistilProblem]:
    """One synthesis run from fixed initial weights; returns generator, learner, teacher, ..."""
    generator, teacher = built(1, Generator), built(2, make_teacher)
    learner = learner if learner is not None else built(3, make_student)
    with BatchNormStatistics([teacher]) as bn:
        problem = DistilProblem(teacher, bn, learner, adversarial)
        typed: SynthesisProblem = problem
        stats = synthesise(generator, learner, typed, cfg, torch.Generator().manual_seed(seed), CPU)
    return generator, learner, teacher, stats, problem


def same(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# --- BatchNormStatistics -----------------------------------------------------------------------


def bn_with(module: nn.modules.batchnorm._BatchNorm, mean: list[float], var: list[float]) -> Any:
    module.running_mean = torch.tensor(mean)
    module.running_var = torch.tensor(var)
    return module.eval()


def test_bn_term_hand_computed_1d_and_2d_summed_over_teachers() -> None:
    bn1 = bn_with(nn.BatchNorm1d(2), [1.0, -1.0], [2.0, 0.5])
    bn2 = bn_with(nn.BatchNorm2d(1), [1.0], [1.0])
    with BatchNormStatistics([bn1, bn2]) as stats:
        assert stats.layers == 2
        bn1(torch.tensor([[0.0, 1.0], [2.0, 3.0]]))
        # mean (1, 2), biased var (1, 1): ||(0, 3)|| + ||(-1, 0.5)||
        assert stats.loss().item() == pytest.approx(3 + math.sqrt(1.25))
        bn2(torch.tensor([0.0, 4.0, 2.0, 6.0]).view(2, 1, 1, 2))
        # mean 3, biased var 5: |3 - 1| + |5 - 1|
        loss = stats.loss()
        assert loss.dim() == 0
        assert loss.item() == pytest.approx(3 + math.sqrt(1.25) + 6)
        stats.clear()
        assert stats.loss().item() == 0


def test_bn_term_is_zero_on_data_with_the_layers_own_statistics() -> None:
    bn = bn_with(nn.BatchNorm2d(2).eval(), [0.5, -1.0], [2.0, 0.25])
    z = torch.randn(64, 2, 5, 5)
    z = (z - z.mean(dim=(0, 2, 3), keepdim=True)) / z.std(
        dim=(0, 2, 3), keepdim=True, unbiased=False
    )
    x = z * bn.running_var.sqrt().view(1, 2, 1, 1) + bn.running_mean.view(1, 2, 1, 1)
    with BatchNormStatistics([bn]) as stats:
        bn(x)
        assert float(stats.loss()) == pytest.approx(0.0, abs=1e-5)
        bn(x + 1.0)
        assert float(stats.loss()) > 1.0


def test_bn_record_is_overwritten_by_the_next_forward() -> None:
    bn = bn_with(nn.BatchNorm1d(1), [0.0], [1.0])
    with BatchNormStatistics([bn]) as stats:
        bn(torch.tensor([[10.0], [10.0]]))
        bn(torch.tensor([[1.0], [1.0]]))
        assert stats.loss().item() == pytest.approx(1 + 1)


def test_bn_term_is_zero_without_bn_layers() -> None:
    mlp = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    with BatchNormStatistics([mlp]) as stats:
        mlp(torch.randn(5, 4, generator=torch.Generator().manual_seed(0)))
        loss = stats.loss()
    assert stats.layers == 0
    assert loss.dim() == 0 and loss.item() == 0


def test_bn_running_stats_unchanged_modes_restored_hooks_removed() -> None:
    teacher = built(2, make_teacher).train()
    bn = teacher[1]
    before = {k: v.clone() for k, v in bn.state_dict().items()}
    with BatchNormStatistics([teacher]) as stats:
        assert not teacher.training
        teacher(torch.randn(4, 2, 4, 4, generator=torch.Generator().manual_seed(0)))
        assert stats.loss().item() > 0
    assert all(torch.equal(before[k], v) for k, v in bn.state_dict().items())
    assert teacher.training
    assert len(bn._forward_hooks) == 0
    teacher.eval()(torch.randn(4, 2, 4, 4, generator=torch.Generator().manual_seed(1)))
    assert stats.loss().item() == 0


def test_bn_gradient_reaches_the_input() -> None:
    teacher = built(2, make_teacher)
    x = torch.randn(4, 2, 4, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
    with BatchNormStatistics([teacher]) as stats:
        teacher(x)
        stats.loss().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


# --- synthesise --------------------------------------------------------------------------------


def test_learner_loss_falls_and_generator_changes() -> None:
    cfg = config(rounds=12, learner_steps=6, generator_steps=1)
    generator, learner, teacher, stats, _ = run(cfg)
    assert len(stats.generator_loss) == len(stats.learner_loss) == 12
    assert sum(stats.learner_loss[-3:]) < 0.5 * sum(stats.learner_loss[:3])
    assert sum(stats.generator_loss[-3:]) < sum(stats.generator_loss[:3])
    assert not same(generator, built(1, Generator))
    assert same(teacher, built(2, make_teacher))
    assert not generator.training and not learner.training
    assert stats.pool_size == BATCH and stats.seconds >= 0


def test_frozen_parameters_never_change() -> None:
    learner = built(3, make_student)
    learner[1].requires_grad_(False)
    frozen = copy.deepcopy(learner[1])
    run(config(), learner=learner)  # trains it in place
    assert same(learner[1], frozen)
    assert not same(learner[3], built(3, make_student)[3])


def test_generator_steps_never_update_the_learner() -> None:
    generator, learner, _, stats, _ = run(config(learner_steps=0), adversarial=1.0)
    assert same(learner, built(3, make_student))
    assert all(p.grad is None for p in learner.parameters())
    assert all(math.isnan(v) for v in stats.learner_loss)
    assert all(math.isfinite(v) for v in stats.generator_loss)
    assert not same(generator, built(1, Generator))


def test_accumulate_pool_grows_and_is_capped() -> None:
    for rounds in (1, 2, 3):
        *_, stats, problem = run(config(rounds=rounds, pool="accumulate"))
        assert stats.pool_size == rounds * BATCH
        assert problem.batch_sizes == [BATCH] * (3 * rounds)
    *_, stats, _ = run(config(rounds=4, pool="accumulate", max_pool=2 * BATCH + 3))
    assert stats.pool_size == 2 * BATCH + 3


def test_same_seeds_are_bit_identical_whatever_the_global_rng() -> None:
    cfg = config(pool="accumulate", generator_optimizer="sgd")
    torch.manual_seed(0)
    g1, l1, _, s1, _ = run(cfg, adversarial=0.5)
    torch.manual_seed(123)
    g2, l2, _, s2, _ = run(cfg, adversarial=0.5)
    assert same(g1, g2) and same(l1, l2)
    assert s1.generator_loss == s2.generator_loss and s1.learner_loss == s2.learner_loss
    _, l3, *_ = run(cfg, adversarial=0.5, seed=1)
    assert not same(l1, l3)


def test_learner_sees_augmented_samples() -> None:
    seen: list[torch.Tensor] = []

    class Augmented(DistilProblem):
        def augment(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
            assert not torch.is_grad_enabled()
            return x + torch.rand(x.shape, generator=generator) + 10

        def learner_loss(self, learner: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Any:
            seen.append(x)
            return super().learner_loss(learner, x, y)

    generator, teacher, learner = Generator(), make_teacher(), make_student()
    with BatchNormStatistics([teacher]) as bn:
        problem = Augmented(teacher, bn, learner, 0.0)
        synthesise(generator, learner, problem, config(), torch.Generator(), CPU)
    assert len(seen) == 9 and all(x.min() > 8 and not x.requires_grad for x in seen)


def test_one_tracker_task_of_rounds_steps() -> None:
    calls: list[tuple[str, int]] = []
    advanced: list[int] = []

    class Recorder:
        @contextlib.contextmanager
        def task(self, description: str, total: int) -> Iterator[Callable[[int], None]]:
            calls.append((description, total))
            yield advanced.append

    generator, teacher, learner = Generator(), make_teacher(), make_student()
    with BatchNormStatistics([teacher]) as bn:
        problem = DistilProblem(teacher, bn, learner, 0.0)
        rng = torch.Generator().manual_seed(0)
        synthesise(generator, learner, problem, config(), rng, CPU, Recorder(), "dense")
    assert calls == [("dense", 3)] and advanced == [1, 1, 1]


def test_non_finite_loss_names_round_and_loss() -> None:
    class Exploding(DistilProblem):
        def learner_loss(self, learner: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Any:
            return super().learner_loss(learner, x, y) * math.inf

    generator, teacher, learner = Generator(), make_teacher(), make_student()
    error = r"round 0: the learner loss became inf"
    with BatchNormStatistics([teacher]) as bn, pytest.raises(FloatingPointError, match=error):
        problem = Exploding(teacher, bn, learner, 0.0)
        synthesise(generator, learner, problem, config(), torch.Generator(), CPU)
    with pytest.raises(ValueError, match="learner has no parameters"):
        synthesise(
            generator, learner.requires_grad_(False), problem, config(), torch.Generator(), CPU
        )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rounds", 0),
        ("generator_steps", -1),
        ("learner_steps", 1.5),
        ("batch_size", 0),
        ("noise_dim", 0),
        ("generator_lr", 0.0),
        ("learner_lr", -1e-3),
        ("generator_optimizer", "rmsprop"),
        ("learner_optimizer", "lbfgs"),
        ("momentum", 1.0),
        ("pool", "all"),
        ("max_pool", BATCH - 1),
    ],
)
def test_config_rejects_bad_values(field: str, value: object) -> None:
    extra = {"pool": "accumulate"} if field == "max_pool" else {}
    with pytest.raises(ValueError, match=rf"^{field}: expected .*, got {value!r}$"):
        config(**extra, **{field: value})


def test_config_max_pool_needs_accumulate() -> None:
    with pytest.raises(ValueError, match="max_pool"):
        config(max_pool=100)
    assert config(pool="accumulate", max_pool=BATCH).max_pool == BATCH


@pytest.mark.parametrize(("noise", "draws"), [("per_round", 3), ("per_step", 3 * 4)])
def test_noise_is_drawn_per_round_or_per_generator_step(noise: str, draws: int) -> None:
    generator, teacher, learner = Generator(), make_teacher(), make_student()
    with BatchNormStatistics([teacher]) as bn:
        problem = DistilProblem(teacher, bn, learner, 0.0)
        calls: list[int] = []
        sample = problem.sample

        def counted(batch_size: int, gen: torch.Generator) -> Any:
            calls.append(batch_size)
            return sample(batch_size, gen)

        problem.sample = counted  # type: ignore[method-assign]
        cfg = config(rounds=3, generator_steps=4, noise=noise)
        synthesise(generator, learner, problem, cfg, torch.Generator().manual_seed(0), CPU)
    assert len(calls) == draws
