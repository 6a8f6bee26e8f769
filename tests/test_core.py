"""Small core pieces: the registry, seed streams, devices, the training loop, the cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from oneshotfl.data.types import LabelledData
from oneshotfl.devices import resolve_device
from oneshotfl.payload import Payload
from oneshotfl.registry import Registry, RegistryError
from oneshotfl.seeding import derive_seed, numpy_rng, seeded_torch
from oneshotfl.training.artefacts import ArtefactStore
from oneshotfl.training.loop import TrainConfig, batch_indices, fit, train_classifier


def test_registry_rejects_duplicates_and_lists_known_names() -> None:
    reg: Registry[int] = Registry("widget")
    reg.register("a", "the a")(1)
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("a")(2)
    with pytest.raises(RegistryError, match="unknown widget 'b'; expected one of: a"):
        reg.get("b")
    assert reg.names() == ["a"] and reg.entries()[0].description == "the a"


def test_a_module_dropped_into_a_package_registers_without_an_import_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forget: list[str]
) -> None:
    """Issue 52: a method is one module. ``import_package_modules`` imports every module of
    a package, so a decorator in a new file registers; the methods package does this, and
    every method class defined in its modules is registered."""
    import inspect
    import pkgutil
    import sys

    import oneshotfl.methods as methods
    from oneshotfl.methods.base import METHODS, Method
    from oneshotfl.registry import import_package_modules

    package = tmp_path / "oneshotfl_plugin_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "zeta.py").write_text(
        "from oneshotfl.extend import register_method\n"
        "from oneshotfl.methods.fedavg import FedAvg\n"
        "@register_method('dropped_in', 'a module no list names')\n"
        "class DroppedIn(FedAvg):\n    'A test method.'\n"
    )
    (package / "alpha.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    forget.append("dropped_in")
    import oneshotfl_plugin_pkg

    assert import_package_modules("oneshotfl_plugin_pkg", oneshotfl_plugin_pkg.__path__) == [
        "alpha",
        "zeta",
    ]
    assert "dropped_in" in METHODS and "oneshotfl_plugin_pkg.alpha" in sys.modules
    found = sorted(m.name for m in pkgutil.iter_modules(methods.__path__))
    assert list(methods.MODULES) == found
    defined = {
        cls.name
        for module in found
        for _, cls in inspect.getmembers(
            sys.modules[f"oneshotfl.methods.{module}"], inspect.isclass
        )
        if issubclass(cls, Method)
        and cls.__module__ == f"oneshotfl.methods.{module}"
        and cls.__dict__.get("name")
    }
    assert defined and defined <= set(METHODS.names())


def test_seed_streams_are_stable_and_independent() -> None:
    assert derive_seed(0, "client", 1) == derive_seed(0, "client", 1)
    assert derive_seed(0, "client", 1) != derive_seed(0, "client", 2)
    assert derive_seed(0, "a") != derive_seed(1, "a")
    np.testing.assert_array_equal(numpy_rng(3, "x").random(4), numpy_rng(3, "x").random(4))
    torch.manual_seed(5)
    before = torch.rand(2)
    torch.manual_seed(5)
    with seeded_torch(9, "init"):
        inner = torch.rand(2)
    torch.testing.assert_close(torch.rand(2), before)  # the global stream is untouched
    with seeded_torch(9, "init"):
        torch.testing.assert_close(torch.rand(2), inner)


def test_devices() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda")
    with pytest.raises(ValueError, match="expected one of auto, cpu, cuda"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            resolve_device("cuda")


def test_batches_cover_every_example_once_and_never_leave_a_batch_of_one() -> None:
    batches = batch_indices(65, 32, torch.Generator().manual_seed(0))
    assert [len(b) for b in batches] == [32, 33]
    assert sorted(torch.cat(batches).tolist()) == list(range(65))


def test_training_learns_a_separable_problem_and_is_reproducible() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200, 2, generator=gen)
    y = (x[:, 0] > 0).long()
    data = LabelledData(x, y)
    cfg = TrainConfig(epochs=20, batch_size=16, lr=0.1)

    def trained() -> torch.nn.Module:
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 2)
        train_classifier(model, data, cfg, torch.Generator().manual_seed(1), torch.device("cpu"))
        return model

    a, b = trained(), trained()
    assert float((a(x).argmax(1) == y).float().mean()) > 0.95
    torch.testing.assert_close(a.weight, b.weight)


def test_diverging_loss_stops_with_a_clear_error() -> None:
    model = torch.nn.Linear(1, 1)

    def loss_fn(m: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return m(batch[0]).sum() * float("inf")

    with pytest.raises(FloatingPointError, match="lower the learning rate"):
        fit(
            model,
            (torch.ones(4, 1),),
            loss_fn,
            TrainConfig(epochs=1),
            torch.Generator(),
            torch.device("cpu"),
        )


def test_artefact_store_hits_memory_then_disk_and_survives_a_corrupt_file(tmp_path: Path) -> None:
    calls = []

    def make() -> Payload:
        calls.append(1)
        return Payload({"w": np.arange(3, dtype=np.float32)}, {"s": 1.5})

    store = ArtefactStore(tmp_path)
    first, hit = store.get_or_make("k", {"a": 1}, make, "thing")
    assert not hit and len(calls) == 1
    _, hit = store.get_or_make("k", {"a": 1}, make, "thing")
    assert hit and len(calls) == 1
    fresh = ArtefactStore(tmp_path)
    again, hit = fresh.get_or_make("k", {"a": 1}, make, "thing")
    assert hit and len(calls) == 1
    np.testing.assert_array_equal(again.arrays["w"], first.arrays["w"])
    _, hit = fresh.get_or_make("k", {"a": 2}, make, "thing")
    assert not hit and len(calls) == 2
    for path in tmp_path.rglob("*.safetensors"):
        path.write_bytes(b"garbage")
    _, hit = ArtefactStore(tmp_path).get_or_make("k", {"a": 1}, make, "thing")
    assert not hit and len(calls) == 3
