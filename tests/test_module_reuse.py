"""One module per architecture per process (issue 53): a payload's outputs probed in a shared
module, a client's trained model handed back instead of rebuilt, and finished models recycled
into the next client's initial model — each giving what a freshly built module would."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch
from torch import nn

from helpers import prepare, run_config
from oneshotfl.data.types import TaskInfo
from oneshotfl.models import create_model
from oneshotfl.models.base import concrete
from oneshotfl.models.state import forward_with_state, model_from_state, model_state
from oneshotfl.protocol.contract import ClientContext
from oneshotfl.training.recipe import initial_model, module_from_state, recycle
from oneshotfl.training.services import train_model


@pytest.mark.parametrize("arch", ["cnn", "mlp", "simple_cnn2", "resnet8"])
def test_a_state_run_in_the_shared_module_answers_as_the_model_built_from_it(arch: str) -> None:
    torch.manual_seed(0)
    model = create_model(arch, 1, 10, 28)
    with torch.no_grad():  # BatchNorm statistics that are not the defaults
        for name, buf in model.named_buffers():
            if name.endswith("running_mean"):
                buf.normal_()
            elif name.endswith("running_var"):
                buf.uniform_(0.5, 2.0)
    arrays, _ = model_state(model)
    x = torch.randn(5, 1, 28, 28)
    rng = torch.get_rng_state()
    got = forward_with_state(arch, arrays, 1, 10, 28, x)
    assert torch.equal(torch.get_rng_state(), rng)  # building the shared module draws nothing
    with torch.no_grad():
        want = model_from_state(arch, arrays, 1, 10, 28).eval()(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    other, _ = model_state(create_model(arch, 1, 10, 28))  # the next state: its own answer
    with torch.no_grad():
        want_other = model_from_state(arch, other, 1, 10, 28).eval()(x)
    torch.testing.assert_close(forward_with_state(arch, other, 1, 10, 28, x), want_other)


def test_a_state_that_lacks_a_tensor_is_refused_by_name() -> None:
    arrays, _ = model_state(create_model("cnn", 1, 10, 28))
    arrays.pop("model.head.bias")
    with pytest.raises(KeyError, match=r"head\.bias"):
        forward_with_state("cnn", arrays, 1, 10, 28, torch.zeros(1, 1, 28, 28))


@pytest.fixture
def ctx(tiny_config: Any) -> ClientContext:
    return prepare(tiny_config(model="cnn", local_epochs=1)).client_context(0)


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_trained_module_is_handed_back_as_a_build_from_its_state_would_be(
    ctx: ClientContext,
) -> None:
    first = train_model(ctx, ctx.recipe())  # a miss: the module just trained
    assert not any(m.training for m in first.modules())
    assert all(p.grad is None and p.requires_grad for p in first.parameters())
    state = _state(first)
    held = train_model(ctx, ctx.recipe())  # `first` is held here: a module of its own
    assert held is not first
    for key, value in held.state_dict().items():
        assert torch.equal(value, state[key])
    held_id = id(held)  # the module handed out last
    del first, held
    gc.collect()
    again = train_model(ctx, ctx.recipe())  # nobody holds it: the same module comes back
    assert id(again) == held_id
    for key, value in again.state_dict().items():
        assert torch.equal(value, state[key])


def test_a_module_changed_in_place_is_not_handed_back(ctx: ClientContext) -> None:
    model = train_model(ctx, ctx.recipe())
    state = _state(model)
    with torch.no_grad():
        next(iter(model.parameters())).add_(1.0)  # a caller fine-tunes what it was given
    model_id = id(model)
    del model
    gc.collect()
    fresh = train_model(ctx, ctx.recipe())
    assert id(fresh) != model_id
    for key, value in fresh.state_dict().items():
        assert torch.equal(value, state[key])


def test_a_module_with_gradients_or_another_mode_is_not_handed_back(ctx: ClientContext) -> None:
    model = train_model(ctx, ctx.recipe())
    model(ctx.data.x[:4]).sum().backward()  # gradients left on it
    model_id = id(model)
    del model
    gc.collect()
    fresh = train_model(ctx, ctx.recipe())
    assert id(fresh) != model_id and all(p.grad is None for p in fresh.parameters())
    fresh.train()  # a mode changed
    fresh_id = id(fresh)
    del fresh
    gc.collect()
    assert id(train_model(ctx, ctx.recipe())) != fresh_id


TASK = TaskInfo(dataset="digits", num_classes=10, in_channels=1, image_size=8)


def test_a_recycled_module_starts_as_a_fresh_initial_model() -> None:
    reference = _state(initial_model("cnn", TASK, seed=7))
    used = initial_model("cnn", TASK, seed=3)  # another client's model, trained
    optimiser = torch.optim.SGD(used.parameters(), lr=0.1)
    used(torch.randn(4, 1, 8, 8)).sum().backward()
    optimiser.step()
    used.eval().requires_grad_(False)
    used_id = id(used)
    recycle(used)
    del used, optimiser
    model = initial_model("cnn", TASK, seed=7)
    assert id(model) == used_id  # loaded into, not built
    assert model.training and all(m.training for m in model.modules())
    assert all(p.grad is None and p.requires_grad for p in model.parameters())
    for key, value in model.state_dict().items():
        assert torch.equal(value, reference[key])
    assert id(initial_model("cnn", TASK, seed=7)) != used_id  # handed out once


def test_a_module_with_hooks_or_outside_the_registry_is_not_recycled() -> None:
    hooked = initial_model("cnn", TASK, seed=1)
    next(iter(hooked.children())).register_forward_hook(lambda *_: None)
    recycle(hooked)
    assert initial_model("cnn", TASK, seed=1) is not hooked
    foreign = nn.Linear(3, 2)
    recycle(foreign)  # no architecture name: ignored, nothing raised
    assert isinstance(initial_model("mlp", TASK, seed=1), nn.Module)


def test_runs_give_the_same_results_with_modules_reused(
    tiny_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reuse is invisible in results: a run whose modules are handed back and recycled
    equals one in which every module is built, to the bit (same process, same threads)."""
    from oneshotfl.runner.compare import result_differences
    from oneshotfl.training import recipe as recipe_module
    from oneshotfl.training import services

    methods = ["local", "fedavg", "ensemble", "fedprox", "fedfisher", "fedeov"]
    reused = run_config(tiny_config(model="simple_cnn2", cache_dir=None, methods=methods))
    recipe_module._FREE.clear()
    services._HANDED.entries.clear()
    monkeypatch.setattr(recipe_module, "_FREE", {})
    monkeypatch.setattr(services, "recycle", lambda model: None)
    monkeypatch.setattr(services._Handed, "get", lambda self, key, device: None)
    built = run_config(tiny_config(model="simple_cnn2", cache_dir=None, methods=methods))
    assert result_differences(built, reused) == []


def test_a_shard_is_hashed_once_until_its_tensors_change() -> None:
    from oneshotfl.data.types import IndexedData, LabelledData
    from oneshotfl.fingerprints import tensor_fingerprint

    data = LabelledData(torch.randn(6, 1, 4, 4), torch.arange(6))
    first = data.fingerprint()
    assert first == tensor_fingerprint(data.x, data.y)  # the artefact keys' hash, unchanged
    assert data.fingerprint() == first
    data.y[0] = 5  # changed in place: hashed again
    assert data.fingerprint() == tensor_fingerprint(data.x, data.y) != first
    view = IndexedData(data, torch.tensor([1, 3]))
    assert view.fingerprint() == tensor_fingerprint(data.x[[1, 3]], data.y[[1, 3]])
    data.x[3] += 1.0  # the source changed under the view
    assert view.fingerprint() == tensor_fingerprint(data.x[[1, 3]], data.y[[1, 3]])


@pytest.mark.parametrize("arch", ["cnn", "resnet8"])
def test_a_cached_state_is_loaded_into_a_recycled_module(arch: str) -> None:
    """A cached or offered artefact (``client_batch``'s models trained together) is loaded into
    a module nobody holds instead of a build: the same values, the same module object."""
    torch.manual_seed(1)
    spare, trained = create_model(arch, 1, 10, 28), create_model(arch, 1, 10, 28)
    arrays, _ = model_state(trained)
    recycle(spare)
    got = module_from_state(arch, arrays, 1, 10, 28)
    assert got is spare
    want = model_from_state(arch, arrays, 1, 10, 28)
    for (name, a), (_, b) in zip(got.state_dict().items(), want.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert all(p.requires_grad and p.grad is None for p in got.parameters())
    other = module_from_state(arch, arrays, 1, 10, 28)
    assert other is not spare  # none free any more: built


def test_the_device_a_tensor_reports_is_the_concrete_one() -> None:
    """``cuda`` names the current device's index, as a tensor on it reports it (on a CPU the
    CPU is itself); on_device and the handed-back module compare by it."""
    assert concrete("cpu") == torch.zeros(1).device
    if torch.cuda.is_available():
        assert concrete("cuda") == torch.zeros(1, device="cuda").device
