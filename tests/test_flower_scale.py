"""Flower at scale: a dataset loaded once per machine (a memory-mapped copy), carves that hold
indices, node processes that hold a bounded number of clients, and where clients ran."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord

from oneshotfl.data import shared
from oneshotfl.data.datasets import load_dataset
from oneshotfl.data.federated import carve_federated_data
from oneshotfl.data.partition import Dirichlet
from oneshotfl.data.shared import SHARED_ENV, load_shared, shared_folder, shared_key
from oneshotfl.data.types import IndexedData, LabelledData
from oneshotfl.environment import data_hash
from oneshotfl.flower.grid import WHERE, error_line, placement, read_where, where_record
from oneshotfl.flower.messages import reply_content
from oneshotfl.flower.node import NodeCache, NodeIdentity, node_identity, node_state
from oneshotfl.runner.config import make_config
from oneshotfl.runner.experiment import run_experiment
from oneshotfl.runner.plan import preflight
from oneshotfl.runner.results import PARTIAL_FILE, write_partial, write_result
from oneshotfl.runner.transport import ClientReply
from test_datasets import write_mnist_like


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ONESHOTFL_DATA", raising=False)
    monkeypatch.delenv(SHARED_ENV, raising=False)


def test_the_folder_is_the_argument_else_the_environment_else_the_temp_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert shared_folder(str(tmp_path)) == tmp_path
    assert shared_folder("off") is None
    assert shared_folder().name == f"oneshotfl-shared-data-{os.getuid()}"  # type: ignore[union-attr]
    monkeypatch.setenv(SHARED_ENV, str(tmp_path / "env"))
    assert shared_folder() == tmp_path / "env"
    monkeypatch.setenv(SHARED_ENV, "off")
    assert shared_folder() is None


def test_a_shared_copy_is_written_once_and_mapped_with_the_same_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_mnist_like(tmp_path / "data", n_train=12, n_test=5)
    folder = tmp_path / "shared"
    first = load_shared("fashion_mnist", str(tmp_path / "data"), folder=folder)
    plain = load_dataset("fashion_mnist", tmp_path / "data")
    (copy,) = folder.iterdir()
    assert sorted(p.name for p in copy.iterdir()) == [
        "meta.json", "test_x.npy", "test_y.npy", "train_x.npy", "train_y.npy"
    ]  # fmt: skip

    def no_second_load(*args: object) -> None:
        raise AssertionError("the shared copy must be mapped, not loaded again")

    monkeypatch.setattr(shared, "load_dataset", no_second_load)
    second = load_shared("fashion_mnist", str(tmp_path / "data"), folder=folder)
    for data in (first, second):
        assert torch.equal(data.train.x, plain.train.x) and torch.equal(data.test.y, plain.test.y)
        assert data.class_names == plain.class_names and data.num_classes == 10
    assert isinstance(np.load(copy / "train_x.npy", mmap_mode="r"), np.memmap)
    # the mapped tensor is private copy-on-write: changing it leaves the file as it was
    second.train.x[0] += 1
    assert torch.equal(load_shared("fashion_mnist", str(tmp_path / "data"), folder=folder)
                       .train.x, plain.train.x)  # fmt: skip


def test_a_changed_file_makes_a_new_copy_and_user_data_is_not_shared(tmp_path: Path) -> None:
    write_mnist_like(tmp_path / "data", n_train=12, n_test=5)
    before = shared_key("fashion_mnist", str(tmp_path / "data"))
    write_mnist_like(tmp_path / "data", n_train=14, n_test=5, seed=1)
    after = shared_key("fashion_mnist", str(tmp_path / "data"))
    assert before is not None and after is not None and before != after
    assert shared_key("npz:path=x.npz", None) is None
    assert shared_key("fashion_mnist", str(tmp_path / "nowhere")) is None  # the loader says why
    np.savez(tmp_path / "own.npz", x=np.zeros((6, 4), np.float32), y=np.arange(6) % 2)
    data = load_shared(f"npz:path={tmp_path / 'own.npz'}", folder=tmp_path / "shared")
    assert len(data.train) + len(data.test) == 6 and not (tmp_path / "shared").exists()


def test_indexed_rows_read_as_the_copy_does() -> None:
    source = LabelledData(torch.arange(40.0).view(10, 4), torch.arange(10))
    index = torch.tensor([7, 2, 5])
    rows = IndexedData(source, index)
    copy = source.subset(index)
    assert len(rows) == 3 and torch.equal(rows.x, copy.x) and torch.equal(rows.y, copy.y)
    assert torch.equal(rows.subset([2, 0]).x, copy.subset([2, 0]).x)


@pytest.mark.parametrize("val_fraction", [0.0, 0.25])
def test_a_lazy_carve_gives_the_same_shards_and_hash(val_fraction: float) -> None:
    dataset = load_dataset("digits")
    kwargs = dict(
        clients=7, partitioner=Dirichlet(0.5, min_samples=5), seed=3, public_size=50,
        val_fraction=val_fraction,
    )  # fmt: skip
    plain = carve_federated_data(dataset, **kwargs)  # type: ignore[arg-type]
    lazy = carve_federated_data(dataset, lazy=True, **kwargs)  # type: ignore[arg-type]
    assert data_hash(plain) == data_hash(lazy)
    for a, b in zip(plain.clients, lazy.clients, strict=True):
        assert isinstance(b.train, IndexedData) and len(a.train) == len(b.train)
        assert torch.equal(a.train.x, b.train.x) and np.array_equal(a.indices, b.indices)
        assert (a.val is None) == (b.val is None)
        if a.val is not None and b.val is not None:
            assert torch.equal(a.val.x, b.val.x) and torch.equal(a.val.y, b.val.y)


def test_a_node_maps_the_shared_copy_unless_told_off(tmp_path: Path) -> None:
    write_mnist_like(tmp_path / "data", n_train=12, n_test=5)
    root = str(tmp_path / "data")
    on = node_identity({"partition-id": 0, "shared-data": str(tmp_path / "shared")})
    NodeCache().dataset("fashion_mnist", root, False, on.shared_data)
    assert len(list((tmp_path / "shared").iterdir())) == 1
    off = node_identity({"partition-id": 0, "shared-data": "off"})
    data = NodeCache().dataset("fashion_mnist", root, False, off.shared_data)
    assert len(data.train) == 12 and len(list((tmp_path / "shared").iterdir())) == 1


def test_a_node_process_holds_a_bounded_number_of_clients(tmp_path: Path) -> None:
    cfg = make_config({"dataset": "digits", "clients": 5, "model": "mlp", "local_epochs": 1,
                       "local_steps": 0, "min_samples": 5})  # fmt: skip
    cache = NodeCache(max_clients=2)
    shared_data = str(tmp_path / "shared")
    states = [node_state(cfg.to_dict(), NodeIdentity(0, shared_data=shared_data), cache)]
    store = states[0].federation.store
    store.scoped("client 0")  # what client 0's artefacts are memoised in
    states += [
        node_state(cfg.to_dict(), NodeIdentity(c, shared_data=shared_data), cache) for c in (1, 2)
    ]
    held = sorted(state.client_id for state in cache.states.values())
    assert held == [1, 2] and len(cache.federations) == 1
    assert "client 0" not in store._views  # its in-memory artefacts went with it
    shard = states[2].federation.data.clients[0]
    assert isinstance(shard.train, IndexedData)  # the carve holds indices, not a copy
    again = node_state(cfg.to_dict(), NodeIdentity(1, shared_data=shared_data), cache)
    assert again is states[1]
    assert list(cache.states.values())[-1] is again  # the most recently used again


def test_where_a_reply_was_computed_is_read_back_and_grouped() -> None:
    content = reply_content(ClientReply(3, b"abc", 0.1, 1.0))
    assert read_where(content) is None  # a node of an older oneshotfl: nothing said
    content[WHERE] = where_record("host-a", "f" * 300)
    assert read_where(content) == ("host-a/" + "f" * 300)[:200]
    content[WHERE] = where_record("host-b")
    assert read_where(content) == "host-b"
    content[WHERE] = ConfigRecord({"host": 7})
    assert read_where(content) is None  # informative only: a malformed record is ignored
    assert placement({2: "a/n1", 0: "a/n1", 1: "a/n2"}) == {"a/n1": [0, 2], "a/n2": [1]}


def test_a_folder_that_cannot_be_written_loads_the_data_as_before(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    data = load_shared("digits", folder=tmp_path / "file" / "shared")
    assert torch.equal(data.train.x, load_dataset("digits").train.x)


def test_a_node_error_is_named_in_one_line() -> None:
    wrapped = (
        "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'ray::ClientAppActor.run()\n"
        '  File "x.py", line 3, in run\n    raise ClientAppException(str(ex)) from ex\n'
        "flwr.clientapp.client_app.ClientAppException: \nException ClientAppException "
        "occurred. Message: dataset 'mnist' not found: looked in /empty'>"
    )
    assert error_line(wrapped) == "dataset 'mnist' not found: looked in /empty"
    assert error_line("Error: Node Unavailable\n") == "Error: Node Unavailable"
    assert len(error_line("x" * 1000)) == 400


def test_a_run_cut_short_keeps_what_finished(tmp_path: Path) -> None:
    cfg = make_config({"dataset": "digits", "clients": 3, "model": "mlp", "local_epochs": 1,
                       "local_steps": 0, "min_samples": 5,
                       "methods": ["local", "fedavg", "ensemble"]})  # fmt: skip
    seen: list[dict[str, Any]] = []

    def partial(doc: dict[str, Any]) -> None:
        seen.append(doc)
        write_partial(tmp_path, doc)
        assert json.loads((tmp_path / PARTIAL_FILE).read_text())["partial"] == doc["partial"]

    doc = run_experiment(preflight(cfg), partial=partial)
    assert [d["partial"]["pending"] for d in seen] == [["fedavg", "ensemble"], ["ensemble"]]
    assert [m["key"] for m in seen[1]["methods"]] == ["local", "fedavg"]
    assert seen[1]["methods"][1]["accuracy"] == doc["methods"][1]["accuracy"]
    write_result(tmp_path, doc)
    assert not (tmp_path / PARTIAL_FILE).exists()  # the whole run is in result.json
