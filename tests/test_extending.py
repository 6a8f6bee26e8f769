"""The core carries new shapes of method: a peer method and a generator-based method, each a
few lines (tests/toys.py), run by the real engine — per-edge bytes, per-client results, the
graph in result.json, rejection per edge, and determinism."""

from __future__ import annotations

import ast
import inspect
from typing import Any

import numpy as np
import pytest
import torch

import toys
from helpers import prepare, registered, run_config, run_method
from oneshotfl.methods import build_method
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import (
    ClientContext,
    NoConfig,
    PeerMethod,
    Requires,
    Topology,
)
from oneshotfl.protocol.fields import model_fields
from oneshotfl.runner.config import ConfigError
from oneshotfl.training.services import train_model


def _lines(*objects: Any) -> int:
    """Source lines of the toy's classes, comments and blank lines included."""
    return sum(len(inspect.getsource(o).splitlines()) for o in objects)


def test_each_toy_method_fits_in_under_80_lines() -> None:
    assert _lines(toys.NeighbourAverage) < 80
    assert _lines(toys.Generator, toys.DistilFromNoise, toys.DataFreeDistillation) < 80
    tree = ast.parse(inspect.getsource(toys.DataFreeDistillation))
    loops = [n for n in ast.walk(tree) if isinstance(n, ast.For | ast.While)]
    assert not loops  # no private training loop: the synthesis layer runs it


def test_a_peer_method_runs_over_a_ring_with_bytes_per_edge(tiny_config: Any) -> None:
    with registered("toy_average", toys.NeighbourAverage):
        cfg = tiny_config(methods=["toy_average", "fedavg"], clients=4, graph="ring:k=1")
        doc = run_config(cfg)
    peer, fedavg = doc["methods"]
    assert doc["graph"]["spec"] == "ring:k=1" and len(doc["graph"]["edges"]) == 8
    edges = peer["topology"]["edges"]
    assert sorted((s, r) for s, r, _ in edges) == [tuple(e) for e in doc["graph"]["edges"]]
    model_bytes = fedavg["upload_bytes_per_client"]  # one model + n_examples per edge
    assert peer["upload_bytes_per_client"] == [2 * b for b in model_bytes]
    assert all(size == model_bytes[s] for s, _, size in edges)
    assert peer["outcome"] == "Personalised" and peer["clients_used"] == [0, 1, 2, 3]
    assert len(peer["client_accuracy"]) == len(peer["client_personal_accuracy"]) == 4
    assert peer["accuracy_worst"] <= peer["accuracy"] <= peer["accuracy_best"]
    assert peer["local_test_accuracy"] == fedavg["local_test_accuracy"]  # the same recipe


def test_over_a_complete_graph_every_peer_average_is_fedavg(tiny_config: Any) -> None:
    with registered("toy_average", toys.NeighbourAverage):
        doc = run_config(tiny_config(methods=["toy_average", "fedavg"], graph="complete"))
    peer, fedavg = doc["methods"]
    assert peer["client_accuracy"] == [fedavg["accuracy"]] * 3


def test_peer_ensemble_over_a_complete_graph_is_the_ensemble(tiny_config: Any) -> None:
    exp = prepare(tiny_config(methods=["peer_ensemble"], graph="complete"))
    method, star = build_method("peer_ensemble"), build_method("ensemble")
    payloads = {c: star.client_update(exp.client_context(c)) for c in range(3)}
    x = exp.data.test.x
    want = star.aggregate(payloads, exp.server_view().server_context()).predict_proba(x, exp.device)  # type: ignore[union-attr]
    for c in range(3):
        others = {s: p for s, p in payloads.items() if s != c}
        got = method.aggregate_for(exp.client_context(c), others)
        torch.testing.assert_close(got.predict_proba(x, exp.device), want)  # type: ignore[union-attr]


class BadSender(toys.NeighbourAverage):
    """Client 1 sends NaN weights to its neighbours."""

    def client_update(self, ctx: ClientContext) -> Payload:
        payload = super().client_update(ctx)
        if ctx.client_id != 1:
            return payload
        arrays = {k: np.full_like(v, np.nan) if v.dtype.kind == "f" else v
                  for k, v in payload.arrays.items()}  # fmt: skip
        return Payload(arrays, payload.scalars)


def test_a_bad_payload_is_refused_per_edge_and_the_others_go_on(tiny_config: Any) -> None:
    with registered("bad_sender", BadSender):
        doc = run_config(tiny_config(methods=["bad_sender"], graph="complete"))
    result = doc["methods"][0]
    assert sorted(result["rejected"]) == ["1->0", "1->2"]
    assert "client 1" in result["rejected"]["1->0"] and "NaN" in result["rejected"]["1->0"]
    assert result["clients_used"] == [0, 1, 2]  # every receiver still built its model
    assert all(0 <= a <= 1 for a in result["client_accuracy"])
    # the quorum counts the clients whose message arrived and nobody refused: 2 of 3 here
    with registered("bad_sender", BadSender):
        doc = run_config(tiny_config(methods=["bad_sender"], graph="complete", min_clients=3))
    assert "expected at least 3" in doc["failed_methods"]["bad_sender"]


class FailsOnClientTwo(toys.NeighbourAverage):
    """Client 2 crashes in its update (e.g. data it cannot handle)."""

    def client_update(self, ctx: ClientContext) -> Payload:
        if ctx.client_id == 2:
            raise RuntimeError("cannot train on this shard")
        return super().client_update(ctx)


def test_a_failing_client_is_named_and_the_run_goes_on(tiny_config: Any) -> None:
    with registered("fails", FailsOnClientTwo):
        doc = run_config(tiny_config(methods=["fails", "fedavg"], graph="complete"))
    peer, fedavg = doc["methods"]
    assert "cannot train on this shard" in peer["no_reply"]["client 2"]
    assert peer["clients_used"] == [0, 1]  # a client whose update failed receives nothing
    assert all(2 not in (s, r) for s, r, _ in peer["topology"]["edges"])
    assert fedavg["clients_used"] == [0, 1, 2] and "no_reply" not in fedavg


def test_a_peer_method_must_declare_its_topology() -> None:
    with pytest.raises(TypeError, match=r"must declare topology=Topology\.PEER"):

        class Forgot(PeerMethod[NoConfig]):
            requires = Requires(same_architecture=True)

    with pytest.raises(TypeError, match="must declare a star topology"):

        class Wrong(toys.DataFreeDistillation):
            requires = Requires(topology=Topology.PEER)


def test_star_runs_never_build_the_graph(tiny_config: Any) -> None:
    doc = run_config(tiny_config(methods=["fedavg"], graph="random:degree=3"))  # n·D odd
    assert "graph" not in doc
    with pytest.raises(ConfigError, match="graph 'random'"):
        run_config(tiny_config(methods=["peer_ensemble"], graph="random:degree=3"))


@pytest.mark.parametrize(("model", "bn_layers"), [("mlp", 0), ("resnet8", 3 * 9)])
def test_a_generator_based_method_runs_on_the_synthesis_layer(
    tiny_config: Any, model: str, bn_layers: int
) -> None:
    with registered("toy_datafree", toys.DataFreeDistillation):
        cfg = tiny_config(methods=["toy_datafree"], model=model)
        exp = prepare(cfg)
        first = run_method("toy_datafree", build_method("toy_datafree"), exp)
        again = run_method("toy_datafree", build_method("toy_datafree"), exp)
    # 3 teachers: resnet8 has 9 BatchNorm layers each; an MLP none, so its BN term is zero
    assert first["diagnostics"]["bn_layers"] == bn_layers
    assert len(first["diagnostics"]["learner_loss"]) == 5
    assert 0 <= first["accuracy"] <= 1 and first["accuracy"] == again["accuracy"]
    assert first["per_class_accuracy"] == again["per_class_accuracy"]


def test_model_fields_of_a_toy_client_round_trip(tiny_config: Any) -> None:
    exp = prepare(tiny_config(methods=["fedavg"]))
    ctx = exp.client_context(0)
    fields = model_fields(train_model(ctx, ctx.recipe()).cpu())
    assert fields.scalars["model.arch"] == "mlp"
