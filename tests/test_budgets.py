"""Small data trains: the initialisation of unnormalised models (the root cause of FedOV's
collapse on 8×8 digits with the LeNet ``cnn``) and training budgets in optimiser steps
(``local_steps``, ``server_steps``, head ``steps``), resolved to whole epochs."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import prepare, run_config
from oneshotfl.methods import build_method, parse_method_spec
from oneshotfl.methods.fedeov import FedEOV
from oneshotfl.methods.fedov import FedOV
from oneshotfl.models import create_model
from oneshotfl.models.base import init_weights
from oneshotfl.seeding import torch_generator
from oneshotfl.training.loop import (
    TrainConfig,
    batch_indices,
    budget_epochs,
    fit,
    predict_logits,
    resolve_budget,
    steps_per_epoch,
)


@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 128, 129, 130, 1000])
@pytest.mark.parametrize("batch", [1, 32, 64])
def test_steps_per_epoch_counts_the_batches_the_loop_draws(n: int, batch: int) -> None:
    drawn = len(batch_indices(n, batch, torch.Generator().manual_seed(0)))
    assert steps_per_epoch(n, batch) == drawn


def test_the_step_floor_raises_epochs_to_whole_epochs_and_never_lowers_them() -> None:
    cfg = TrainConfig(epochs=5, batch_size=64, min_steps=300)
    assert budget_epochs(cfg, 290) == 60  # 5 steps per epoch: 300 steps
    assert budget_epochs(cfg, 6000) == 5  # 94 steps per epoch: the epochs already make 470
    assert budget_epochs(cfg, 700) == 28  # 11 per epoch: 27.3 → 28 whole epochs (308 steps)
    assert budget_epochs(dataclasses.replace(cfg, min_steps=0), 290) == 5
    assert budget_epochs(dataclasses.replace(cfg, epochs=0), 290) == 0  # switched off stays off
    assert budget_epochs(cfg, 0) == 5
    resolved = resolve_budget(cfg, 290)
    assert resolved.epochs == 60 and resolve_budget(resolved, 290) == resolved


@pytest.mark.parametrize("arch", ["cnn", "mlp", "fedavg_cnn"])
def test_he_initialisation_keeps_the_signal_through_an_unnormalised_model(arch: str) -> None:
    x = torch.randn(256, 1, 8, 8)
    spread = {}
    for init in ("torch", "he"):
        torch.manual_seed(0)
        model = create_model(arch, 1, 11, 8, init=init).eval()
        with torch.no_grad():
            spread[init] = float(model(x).std(0).mean())  # how logits vary across inputs
    assert spread["he"] > 5 * spread["torch"]
    assert 0.2 < spread["he"] < 5.0


def test_initialisation_leaves_normalised_models_as_their_papers_build_them() -> None:
    torch.manual_seed(0)
    model = create_model("simple_cnn2", 1, 11, 8, init="torch")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    init_weights(model, "he")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="init: expected one of he, torch"):
        create_model("cnn", 1, 10, 8, init="xavier")  # type: ignore[arg-type]


def _own_class_test(setup: Any, client: int) -> tuple[torch.Tensor, torch.Tensor]:
    test, own = setup.data.test, setup.data.shard(client).train.y.unique()
    keep = torch.isin(test.y, own)
    return test.x[keep], test.y[keep]


@pytest.mark.parametrize("init", ["he", "torch"])
def test_fedov_clients_on_8x8_digits_learn_their_classes_with_the_lenet_cnn(
    tiny_config: Any, init: str
) -> None:
    """The collapse of the robustness issue, one client: FedOV's LeNet on 8×8 digits, 10
    epochs of Adam 1e-3 (about 50 steps). With PyTorch's default initialisation its logits
    hardly depend on the input at first, so the only progress is in the output biases, and
    with two thirds of every joint batch labelled "unknown" the model calls every real image
    unknown; with He initialisation the same budget learns the client's classes."""
    cfg = tiny_config(
        methods=["fedov"], model="cnn", partition="disjoint", clients=5, local_epochs=10,
        optimizer="adam", lr=0.001, batch_size=64, init=init, cache_dir="",
    )  # fmt: skip
    setup = prepare(cfg)
    ctx = setup.client_context(0)
    model = FedOV().trained(ctx)
    x, y = _own_class_test(setup, 0)
    logits = predict_logits(model, x, torch.device("cpu"))
    unknown = float((logits.argmax(1) == setup.data.task.num_classes).float().mean())
    known = float((logits[:, :-1].argmax(1) == y).float().mean())
    if init == "he":
        assert unknown < 0.5 and known > 0.9
    else:  # the documented reading that collapses: why he is the default
        assert unknown > 0.9


def test_client_contexts_resolve_the_local_step_floor_over_their_own_data(
    tiny_config: Any,
) -> None:
    setup = prepare(tiny_config(local_epochs=2, local_steps=100, batch_size=32))
    for client in range(setup.cfg.clients):
        ctx = setup.client_context(client)
        per_epoch = steps_per_epoch(len(ctx.data), 32)
        assert ctx.train_config.epochs == max(2, -(-100 // per_epoch))
        assert ctx.train_config.epochs * per_epoch >= 100
        assert ctx.epochs_for(None) == ctx.train_config.epochs
        assert ctx.epochs_for(1) == ctx.train_config.epochs  # an own knob gets the floor too
        assert ctx.epochs_for(10_000) == 10_000
        assert ctx.recipe().train.init == "he"


def test_fedeov_builds_its_curriculum_over_the_resolved_budget(tiny_config: Any) -> None:
    setup = prepare(tiny_config(local_epochs=3, local_steps=120, batch_size=32))
    ctx = setup.client_context(0)
    for spec in ("fedeov", "fedeov:epochs=2", "fedeov_pruned:stages=2"):
        method = build_method(parse_method_spec(spec))
        assert isinstance(method, FedEOV)
        recipe = method.recipe(ctx)
        budget = ctx.epochs_for(method.config.epochs)
        assert recipe.epochs() == budget
        assert resolve_budget(recipe.train, len(ctx.data)).epochs == recipe.train.epochs
        starts = sorted(s.start_epoch for s in recipe.components)
        assert starts[-1] < budget  # the curriculum's stages lie inside what trains


def test_the_server_step_floor_resolves_over_the_public_pool(tiny_config: Any) -> None:
    setup = prepare(tiny_config(public_size=150, server_epochs=2, server_steps=50))
    ctx = setup.server_view().server_context()
    assert ctx.train_config.epochs == 25 and ctx.train_config.min_steps == 0  # 2 steps/epoch
    view = setup.server_view()
    data_free = view.server_context(dataclasses.replace(FedEOV.requires, data_free=True))
    assert data_free.public is None and data_free.train_config.epochs == 2
    assert ctx.client_train_config.min_steps == 0  # TINY: no client floor


def test_fol_stages_and_fedavg_rounds_run_exactly_their_own_epochs(
    tiny_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from oneshotfl.methods import fedavg_rounds
    from oneshotfl.methods.fol import Fol

    setup = prepare(tiny_config(local_steps=200, val_fraction=0.2))
    stage = Fol()._epochs(setup.client_context(0), 3)
    assert stage.epochs == 3 and stage.min_steps == 0
    seen: list[TrainConfig] = []
    real = fedavg_rounds.train_classifier

    def spy(model: Any, data: Any, cfg: TrainConfig, *args: Any, **kwargs: Any) -> Any:
        seen.append(cfg)
        return real(model, data, cfg, *args, **kwargs)

    monkeypatch.setattr(fedavg_rounds, "train_classifier", spy)
    run_config(tiny_config(methods=["fedavg_rounds:rounds=2:local_epochs=1"], local_steps=200))
    assert len(seen) == 2 * 3 and all(c.epochs == 1 and c.min_steps == 0 for c in seen)


def test_a_method_that_ends_at_chance_is_warned_about(
    tiny_config: Any, caplog: pytest.LogCaptureFixture
) -> None:

    doc = run_config(tiny_config(methods=["fedavg", "ensemble"], lr=1e-7, local_epochs=1))
    for row in doc["methods"]:
        at_chance = row["accuracy"] < 0.15  # 10 classes
        assert (f"{row['key']} ended at chance" in caplog.text) == at_chance
    assert "ended at chance" in caplog.text  # lr 1e-7 leaves the models where they started
    caplog.clear()
    run_config(tiny_config(methods=["fedavg"], local_epochs=3))
    assert "ended at chance" not in caplog.text


def test_grad_clip_bounds_every_step_and_reaches_every_party(tiny_config: Any) -> None:
    """A run-wide training setting (``grad_clip``) is one config key and one field of
    ``TrainConfig``: both contexts carry it, the loop applies it, no method names it."""
    with pytest.raises(ValueError, match="grad_clip"):
        TrainConfig(grad_clip=-1.0)
    torch.manual_seed(0)
    x, y = torch.randn(8, 4) * 100, torch.randint(0, 2, (8,))

    def step(clip: float) -> float:
        model = nn.Linear(4, 2)
        before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
        cfg = TrainConfig(epochs=1, batch_size=8, lr=1.0, momentum=0.0, grad_clip=clip)
        fit(model, (x, y), lambda m, b: F.cross_entropy(m(b[0]), b[1]), cfg,
            torch_generator(0, "clip"), torch.device("cpu"))  # fmt: skip
        after = torch.cat([p.detach().flatten() for p in model.parameters()])
        return float((after - before).norm())

    assert step(0.0) > 1.0 and step(0.5) == pytest.approx(0.5, rel=1e-4)  # lr 1: step = grad
    fed = prepare(tiny_config(grad_clip=0.5))
    assert fed.client_context(0).train_config.grad_clip == 0.5
    assert fed.server_view().server_context().train_config.grad_clip == 0.5
    clipped = run_config(tiny_config(methods=["local"], grad_clip=1e-3))["methods"][0]
    plain = run_config(tiny_config(methods=["local"]))["methods"][0]
    assert clipped["accuracy"] != plain["accuracy"]
