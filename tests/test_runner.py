"""The simulation runner: reproducibility, caching, requirements, rejection, data hygiene."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from helpers import prepare, run_config, run_method
from oneshotfl.methods.fedavg import FedAvg
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, ServerContext
from oneshotfl.protocol.outcome import Outcome
from oneshotfl.runner.config import ConfigError
from oneshotfl.runner.errors import QuorumError, RequirementError

STABLE = ("accuracy", "personal_accuracy", "upload_bytes_per_client")


def summary(doc: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [tuple(r[k] for k in STABLE) for r in doc["methods"]]


def test_same_config_gives_identical_results_with_and_without_cache(
    tiny_config: Any, tmp_path: Any
) -> None:
    first = run_config(tiny_config())
    assert first["cache"]["misses"] > 0
    cached = run_config(tiny_config())
    assert cached["cache"]["misses"] == 0 and cached["cache"]["hits"] > 0
    fresh = run_config(tiny_config(cache_dir=str(tmp_path / "other")))
    assert summary(first) == summary(cached) == summary(fresh)


def test_methods_share_one_training_of_each_client(tiny_config: Any) -> None:
    doc = run_config(tiny_config(methods=["local", "fedavg", "ensemble"]))
    # 3 clients trained once (3 misses); the other two methods and the client stats hit.
    assert doc["cache"]["misses"] == 3


def test_result_document_holds_what_users_need(tiny_config: Any) -> None:
    doc = run_config(tiny_config())
    assert doc["config"]["dataset"] == "digits"
    assert [c["client"] for c in doc["clients"]] == [0, 1, 2]
    for client in doc["clients"]:
        assert sum(client["label_histogram"]) == client["train_size"]
    by_key = {r["key"]: r for r in doc["methods"]}
    # every method reports the local accuracy of the model its clients trained, if any
    assert all(0 <= a <= 1 for a in by_key["local"]["local_test_accuracy"])
    assert by_key["fedavg"]["local_test_accuracy"] == by_key["local"]["local_test_accuracy"]
    assert "local_test_accuracy" not in by_key["centralized"]
    assert set(by_key) == {"local", "fedavg", "ensemble", "centralized"}
    assert by_key["local"]["upload_bytes_mean"] == 0  # local communicates nothing
    assert by_key["fedavg"]["upload_bytes_mean"] > 0
    assert by_key["local"]["accuracy_worst"] <= by_key["local"]["accuracy"]
    assert by_key["local"]["accuracy"] <= by_key["local"]["accuracy_best"]
    # the centralized upload is the raw data: at least 8·8 float32 pixels per example
    assert by_key["centralized"]["upload_bytes_mean"] > 256 * np.mean(
        [c["train_size"] for c in doc["clients"]]
    )


def test_seed_streams_are_separate(tiny_config: Any) -> None:
    base = prepare(tiny_config(seed=0)).data
    other_model_seed = prepare(tiny_config(seed=1, partition_seed=0)).data
    other_split = prepare(tiny_config(seed=0, partition_seed=5)).data
    for a, b in zip(base.clients, other_model_seed.clients, strict=True):
        np.testing.assert_array_equal(a.indices, b.indices)
    assert any(
        not np.array_equal(a.indices, b.indices)
        for a, b in zip(base.clients, other_split.clients, strict=True)
    )


def test_public_pool_is_disjoint_from_clients_and_unlabelled(tiny_config: Any) -> None:
    fed = prepare(tiny_config(public_size=200, val_fraction=0.2)).data
    assert fed.public is not None and len(fed.public) == 200
    assert not hasattr(fed.public, "y")
    client_rows = {tuple(x.flatten().tolist()) for c in fed.clients for x in c.train.x}
    public_rows = {tuple(x.flatten().tolist()) for x in fed.public.x}
    assert not client_rows & public_rows or len(client_rows & public_rows) < 3  # digit dupes
    all_idx = np.concatenate([c.indices for c in fed.clients])
    assert len(all_idx) == len(set(all_idx.tolist()))
    for c in fed.clients:
        assert c.val is not None and len(c.val) > 0


def test_requirements_are_checked_before_any_training(tiny_config: Any) -> None:
    cfg = tiny_config(model="mlp,cnn", methods=["ensemble", "fedavg"])
    with pytest.raises(RequirementError, match="identical client architectures"):
        run_config(cfg)
    assert not any(p.suffix == ".safetensors" for p in _cache_files(cfg.cache_dir))


def _cache_files(root: str | None) -> list[Any]:
    from pathlib import Path

    return list(Path(str(root)).rglob("*")) if root and Path(root).exists() else []


class NaNForClientOne(FedAvg):
    """FedAvg whose client 1 sends NaN weights (a broken or malicious client)."""

    def client_update(self, ctx: ClientContext) -> Payload:
        payload = super().client_update(ctx)
        if ctx.client_id != 1:
            return payload
        arrays = {
            k: np.full_like(v, np.nan) if v.dtype.kind == "f" else v
            for k, v in payload.arrays.items()
        }
        return Payload(arrays, payload.scalars)

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        assert sorted(payloads) == [0, 2]
        return super().aggregate(payloads, ctx)


def test_bad_payload_is_rejected_and_the_run_goes_on(tiny_config: Any) -> None:
    setup = prepare(tiny_config(min_clients=2))
    result = run_method("nan-client", NaNForClientOne(), setup)
    assert result["clients_used"] == [0, 2]
    assert "client 1" in result["rejected"]["1"] and "finite" in result["rejected"]["1"]
    sizes = result["upload_bytes_per_client"]
    assert sizes[1] == sizes[0]  # the rejected message was still sent: its bytes count


def test_too_few_valid_payloads_stop_with_a_clear_error(tiny_config: Any) -> None:
    setup = prepare(tiny_config(min_clients=3))
    with pytest.raises(QuorumError, match="expected at least 3"):
        run_method("nan-client", NaNForClientOne(), setup)


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"methods": ["no_such_method"]}, "unknown method 'no_such_method'"),
        ({"model": "no_such_net"}, "unknown model 'no_such_net'"),
        ({"methods": ["ensemble:weighting=bad"]}, "weighting"),
    ],
)
def test_bad_names_fail_before_training(
    tiny_config: Any, overrides: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment):
        run_config(tiny_config(**overrides))


def test_training_does_not_touch_global_torch_rng(tiny_config: Any) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    run_config(tiny_config(methods=["fedavg"]))
    torch.testing.assert_close(torch.rand(3), expected)


def test_a_run_trains_only_what_its_methods_need(tiny_config: Any) -> None:
    # FedProx trains its proximal models and nothing else: no plain local model per client
    prox = run_config(tiny_config(methods=["fedprox"]))
    assert prox["cache"]["misses"] == 3
    (method,) = prox["methods"]
    assert len(method["local_test_accuracy"]) == 3  # the FedProx models' own accuracies
    both = run_config(tiny_config(methods=["fedprox", "local"]))
    by_key = {m["key"]: m for m in both["methods"]}
    assert by_key["fedprox"]["local_test_accuracy"] == method["local_test_accuracy"]
    assert by_key["local"]["local_test_accuracy"] != method["local_test_accuracy"]


def test_an_encoder_only_run_trains_no_full_client_model(tiny_config: Any, tmp_path: Path) -> None:
    cache = tmp_path / "enc-cache"
    fedage = "fedage:block_epochs=1:ensemble_epochs=1"  # the server's budget makes no artefact
    doc = run_config(tiny_config(methods=[fedage], encoder="random:dim=16", cache_dir=str(cache)))
    assert not (cache / "local_model").exists()
    assert {p.name for p in cache.iterdir()} == {"embeddings", "head"}
    local = doc["methods"][0]["local_test_accuracy"]  # the clients' heads on the encoder
    assert len(local) == 3 and all(0 <= a <= 1 for a in local)


def test_every_party_bounds_self_reported_counts_by_the_same_n_max(tiny_config: Any) -> None:
    exp = prepare(tiny_config(clients=4, graph="ring"))
    assert exp.train_pool > 0
    assert exp.server_view().server_context().dims.max_examples == exp.train_pool
    assert exp.client_context(1).dims.max_examples == exp.train_pool
    receiver = exp.receiver_context(1)
    assert receiver.neighbours == (0, 2) and receiver.topology_seed == exp.cfg.data_seed


def test_client_time_does_not_depend_on_the_order_methods_ran_in(tiny_config: Any) -> None:
    import dataclasses

    from oneshotfl.runner.accounting import attribute_client_time
    from oneshotfl.runner.results import MethodResult

    doc = run_config(tiny_config(methods=["local", "fedavg", "fedprox"], clients=2))
    base = {m["key"]: MethodResult.from_dict(m) for m in doc["methods"]}
    shared = [{"local_model:a0": 4.0}, {"local_model:a1": 4.0}]  # per client; local, fedavg
    # local ran first and trained it (made now); fedavg loaded it; fedprox trained its own
    runs = [
        dataclasses.replace(base["local"], client_wall_s=[4.5, 4.5], client_made_s=[4.0, 4.0],
                            client_artefacts=shared),
        dataclasses.replace(base["fedavg"], client_wall_s=[0.25, 0.25], client_made_s=[0.0, 0.0],
                            client_artefacts=shared),
        dataclasses.replace(base["fedprox"], client_wall_s=[3.0, 3.0], client_made_s=[2.5, 2.5],
                            client_artefacts=[{"local_model:b0": 2.5}, {"local_model:b1": 2.5}]),
    ]  # fmt: skip
    attributed, rows = attribute_client_time(runs)
    own = {r.key: r.client_own_s for r in attributed}
    assert own == {"local": [0.5, 0.5], "fedavg": [0.25, 0.25], "fedprox": [3.0, 3.0]}
    assert rows == [
        {"kind": "local_model", "methods": ["fedavg", "local"], "seconds_per_client": 4.0}
    ]
    flipped, _ = attribute_client_time([runs[1], runs[0], runs[2]])  # fedavg first: same charges
    assert {r.key: r.client_own_s for r in flipped} == own
    assert all(r.client_artefacts is not None for r in map(MethodResult.from_dict, doc["methods"]))


def test_the_plan_is_checked_once_and_draws_each_schedule_once(tiny_config: Any) -> None:
    """``preflight`` resolves and checks a config once; a peer method's encounter schedule
    is drawn once per receiver (by the plan) and reaches the receiver's context as drawn."""
    import toys
    from helpers import registered, run_config
    from oneshotfl.runner.plan import preflight

    drawn: list[int] = []
    seen: dict[int, tuple[tuple[int, ...], ...]] = {}

    class Counted(toys.NeighbourAverage):
        def schedule(self, receiver: int, neighbours: Any, seed: int) -> Any:
            drawn.append(receiver)
            return (tuple(neighbours[:1]), tuple(neighbours[1:]))  # two windows

        def aggregate_for(self, ctx: Any, payloads: Any) -> Any:
            seen[ctx.client_id] = ctx.schedule
            return super().aggregate_for(ctx, payloads)

    with registered("counted", Counted):
        cfg = tiny_config(
            methods=["counted", "fedavg:weighting=size"], graph="ring", clients=3,
            method_defaults=["fedavg:weighting=uniform"],
        )  # fmt: skip
        plan = preflight(cfg)
        assert sorted(drawn) == [0, 1, 2] and plan.schedules["counted"][0] == ((1,), (2,))
        node = plan.node_config()  # a Flower node's part: no server-only keys
        assert "methods" not in node and "server_lr" not in node and node["clients"] == 3
        assert plan.specs["fedavg:weighting=size"] == "fedavg:weighting=size"
        drawn.clear()
        doc = run_config(cfg)
    assert sorted(drawn) == [0, 1, 2]  # run_config's own preflight; the run draws nothing
    assert seen == {r: ((n[0],), (n[1],)) for r, n in {0: (1, 2), 1: (0, 2), 2: (0, 1)}.items()}
    assert [m["key"] for m in doc["methods"]] == ["counted", "fedavg:weighting=size"]


def test_a_nodes_spec_folds_in_the_method_defaults(tiny_config: Any) -> None:
    from oneshotfl.runner.plan import node_specs

    cfg = tiny_config(methods=["ensemble", "fedavg"], method_defaults=["ensemble:weighting=size"])
    assert node_specs(cfg) == {"ensemble": "ensemble:weighting=size", "fedavg": "fedavg"}


def test_the_federation_is_a_frozen_value_whose_server_view_holds_no_shard(
    tiny_config: Any,
) -> None:
    import dataclasses

    import torch

    from helpers import prepare
    from oneshotfl.data.federated import ClientShard, FederatedData

    fed = prepare(tiny_config(val_fraction=0.2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        fed.cfg = fed.cfg  # type: ignore[misc]
    assert [s.client_id for s in fed.only(1).data.clients] == [1]
    view = fed.server_view()
    private = [t for s in fed.data.clients for t in (s.train.x, s.val.x)]  # type: ignore[union-attr]
    for f in dataclasses.fields(view):
        value = getattr(view, f.name)
        assert not isinstance(value, FederatedData | ClientShard), f.name
        tensors = [v for v in vars(value).values()] if hasattr(value, "__dict__") else [value]
        for t in tensors:
            if isinstance(t, torch.Tensor):
                assert all(t is not p for p in private), f.name
    assert view.client_examples == sum(len(s.train) for s in fed.data.clients)
