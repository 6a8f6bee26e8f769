"""Client recipes and the server-side training layer: what a recipe can declare (extra
outputs, components in epoch windows, a pruning schedule), its cache key, the built-in
components by hand, and distillation with live teachers and per-sample weights."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import prepare
from oneshotfl.functional import kl_to_student
from oneshotfl.protocol.contract import ClientContext
from oneshotfl.training.components import (
    COMPONENTS,
    Component,
    ComponentEnv,
    ComponentSpec,
    augment_images,
    build_component,
    gradient_sign_examples,
    register_component,
)
from oneshotfl.training.distill import distil
from oneshotfl.training.loop import TrainConfig
from oneshotfl.training.pruning import PruningSchedule
from oneshotfl.training.recipe import ClientRecipe, train_recipe
from oneshotfl.training.services import train_model

CPU = torch.device("cpu")


@pytest.fixture
def ctx(tiny_config: Any) -> ClientContext:
    return prepare(tiny_config(model="cnn", local_epochs=2)).client_context(0)


def _train(ctx: ClientContext, recipe: ClientRecipe) -> nn.Module:
    return train_recipe(recipe, ctx.data, ctx.task, seed=ctx.seed, client_id=0, device=CPU).model


def test_the_plain_recipe_is_the_cached_local_model(ctx: ClientContext) -> None:
    direct = _train(ctx, ctx.recipe())
    cached = train_model(ctx, ctx.recipe())
    for key, value in direct.state_dict().items():
        assert torch.equal(cached.state_dict()[key], value)
    assert (
        ctx.store.misses == 1
        and train_model(ctx, ctx.recipe()) is not cached
        and ctx.store.hits == 1
    )


def test_an_abstention_recipe_trains_c_plus_one_outputs_on_negatives(ctx: ClientContext) -> None:
    negatives = (
        ComponentSpec.of("adversarial", epsilon=0.3, label="unknown", fraction=0.5),
        ComponentSpec.of("augmented", transform="erase", strength=0.5, label="unknown"),
    )
    recipe = ctx.recipe(name="open-set", extra_outputs=1, components=negatives)
    model = train_model(ctx, recipe)
    logits = model(ctx.data.x[:8])
    assert logits.shape == (8, ctx.task.num_classes + 1)
    plain = train_model(ctx, ctx.recipe())
    assert not torch.equal(plain(ctx.data.x[:8]), logits[:, :-1])
    with pytest.raises(ValueError, match="label=unknown needs a recipe with extra_outputs >= 1"):
        _train(ctx, ctx.recipe(components=negatives[:1]))


@pytest.fixture
def spy() -> Iterator[list[int]]:
    """A registered component that records the epochs in which it is active."""
    seen: list[int] = []

    class Spy(Component):
        epoch = 0

        def loss_term(
            self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor
        ) -> torch.Tensor:
            seen.append(len(x))
            return logits.sum() * 0.0

    register_component("spy")(Spy)
    yield seen
    del COMPONENTS._entries["spy"]  # tests only: the registry has no public removal


def test_components_are_active_only_in_their_epoch_window(
    ctx: ClientContext, spy: list[int]
) -> None:
    steps = len(range(0, len(ctx.data), ctx.train_config.batch_size))
    window = ComponentSpec("spy", (), start_epoch=1, stop_epoch=2)
    recipe = ctx.recipe(train=dataclasses.replace(ctx.train_config, epochs=3), components=(window,))
    _train(ctx, recipe)
    assert len(spy) in (steps, steps - 1)  # one epoch of steps (a batch of one is merged)


def test_a_pruning_schedule_runs_inside_the_budget(ctx: ClientContext) -> None:
    schedule = PruningSchedule(stages=2, epochs_per_stage=1, finetune_epochs=1, sparsity=0.5)
    recipe = ctx.recipe(pruning=schedule)
    done = train_recipe(recipe, ctx.data, ctx.task, seed=0, client_id=0, device=CPU)
    assert done.stats.steps == 3 * len(range(0, len(ctx.data), ctx.train_config.batch_size))
    assert done.facts["sparsity"] == pytest.approx(0.5, abs=1e-3)
    prunable = [m.weight for m in done.model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    zeros = sum(int((w == 0).sum()) for w in prunable)
    assert zeros / sum(w.numel() for w in prunable) == pytest.approx(0.5, abs=1e-3)
    cached = train_model(ctx, recipe)  # the cache keeps the zeros and the fact
    assert sum(int((m.weight == 0).sum()) for m in cached.modules()
               if isinstance(m, nn.Conv2d | nn.Linear)) == zeros  # fmt: skip


def test_recipe_keys_are_canonical(ctx: ClientContext) -> None:
    schedule = PruningSchedule(2, 1, 1, 0.5)
    a = ctx.recipe(pruning=schedule, train=dataclasses.replace(ctx.train_config, epochs=9))
    b = ctx.recipe(pruning=schedule, train=dataclasses.replace(ctx.train_config, epochs=3))
    assert a.key() == b.key()  # the schedule decides the budget
    one = ctx.recipe(components=(ComponentSpec.of("proximal", mu=1),))
    same = ctx.recipe(components=(ComponentSpec.of("proximal", mu=1.0),))
    assert one.key() == same.key() and one.key() != ctx.recipe().key()
    with pytest.raises(ValueError, match="mu: expected > 0"):
        ctx.recipe(components=(ComponentSpec.of("proximal", mu=-1),))
    with pytest.raises(ValueError, match="components"):
        ctx.recipe(components=(ComponentSpec.of("no-such-component"),))


def test_gradient_sign_examples_by_hand() -> None:
    model = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -2.0], [0.0, 0.0]]))
    x, y = torch.zeros(1, 2), torch.tensor([0])
    # d CE / d x = (softmax(z) − onehot(y))·W; at x = 0 softmax = (½, ½): (−½)·(1, −2) + ½·(0, 0)
    adv = gradient_sign_examples(model, x, y, epsilon=0.1, steps=1)
    torch.testing.assert_close(adv, torch.tensor([[-0.1, 0.1]]))
    far = gradient_sign_examples(model, x, y, epsilon=0.1, steps=4)
    assert float(far.abs().max()) <= 0.1 + 1e-7  # stays in the ε ball


def test_augmentations_are_seeded_and_shaped() -> None:
    x = torch.arange(2 * 1 * 4 * 4, dtype=torch.float32).view(2, 1, 4, 4)
    torch.testing.assert_close(augment_images(x, "flip", 1.0, torch.Generator()), x.flip(-1))
    for transform in ("noise", "shift", "erase"):
        a = augment_images(x, transform, 1.0, torch.Generator().manual_seed(3))
        b = augment_images(x, transform, 1.0, torch.Generator().manual_seed(3))
        assert a.shape == x.shape and torch.equal(a, b) and not torch.equal(a, x)
    erased = augment_images(x, "erase", 0.5, torch.Generator().manual_seed(0))
    assert int((erased == 0).sum()) - int((x == 0).sum()) in range(3, 9)  # a 2×2 square each


def test_a_component_builds_from_its_registered_config() -> None:
    env = ComponentEnv(10, 1, torch.Generator())
    comp = build_component(ComponentSpec.of("augmented", label="unknown", fraction=0.5), env)
    x, y = torch.zeros(4, 1, 8, 8), torch.arange(4)
    extra = comp.extra_examples(nn.Identity(), x, y)
    assert extra is not None and extra[0].shape == (2, 1, 8, 8)
    assert extra[1].tolist() == [10, 10]  # the "unknown" class index C
    with pytest.raises(ValueError, match="transform: expected one of"):
        build_component(ComponentSpec.of("augmented", transform="blur"), env)


def test_distil_with_a_live_teacher_matches_fixed_targets() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 5)
    teacher = nn.Linear(5, 3).eval()
    cfg = TrainConfig(epochs=3, batch_size=16, lr=0.05, optimizer="adam")

    def student() -> nn.Module:
        torch.manual_seed(1)
        return nn.Linear(5, 3)

    def rows(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return kl_to_student(logits, target)

    with torch.no_grad():
        fixed_targets = F.softmax(teacher(x), -1)
    fixed, live = student(), student()
    before = kl_to_student(fixed(x), fixed_targets).mean()
    distil(fixed, x, rows, cfg, torch.Generator().manual_seed(2), CPU, targets=(fixed_targets,))
    distil(
        live, x, rows, cfg, torch.Generator().manual_seed(2), CPU,
        teacher=lambda xb: F.softmax(teacher(xb), -1),
    )  # fmt: skip
    torch.testing.assert_close(live.weight, fixed.weight)
    assert kl_to_student(fixed(x), fixed_targets).mean() < before
    frozen = student()
    zero = torch.zeros(64)
    distil(frozen, x, rows, cfg, torch.Generator(), CPU, targets=(fixed_targets,), weights=zero)
    torch.testing.assert_close(frozen.weight, student().weight)  # weight 0: nothing to learn
    with pytest.raises(ValueError, match="neither"):
        distil(frozen, x, rows, cfg, torch.Generator(), CPU)
