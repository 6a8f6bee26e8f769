"""FENS: the proxy split, the aggregator on the wire, FedAdam, the model set in a broadcast,
the rounds end to end (history, bytes, a client that lost its state, saved models, tables)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import oneshotfl
from helpers import TINY, prepare, run_over, table_npz
from oneshotfl.data.types import LabelledData, TaskInfo
from oneshotfl.methods import MethodSpec, build_method
from oneshotfl.methods.fens import (
    FENS,
    FENSConfig,
    ServerAggregator,
    epoch_batches,
    examples_seen,
    fedadam_step,
    proxy_split,
)
from oneshotfl.methods.fens_wire import AggregatorFields, aggregator_arrays
from oneshotfl.models import create_model
from oneshotfl.models.aggregator import StackedAggregator, stack_member_logits
from oneshotfl.payload import Payload
from oneshotfl.protocol.model_set import ModelSet, model_set_fields, models_from_set
from oneshotfl.protocol.outcome import AGGREGATOR, Ensemble, combiner
from oneshotfl.protocol.spec import PayloadError, PayloadSpec, task_dims
from oneshotfl.protocol.validate import validate_payload
from oneshotfl.protocol.wire import byte_limit
from oneshotfl.runner.config import make_config
from oneshotfl.runner.transport import LocalTransport
from oneshotfl.training.loop import accuracy

CPU = torch.device("cpu")
TASK = TaskInfo(dataset="digits", num_classes=10, in_channels=1, image_size=8)
FAST = "fens:rounds=30:eval_every=10:batch=32:server_lr=0.01"


def test_the_proxy_split_is_disjoint_covering_and_seeded() -> None:
    data = LabelledData(torch.arange(50.0).view(50, 1, 1, 1), torch.zeros(50, dtype=torch.long))
    train, proxy = proxy_split(data, 0.1, seed=3, client=1)
    seen = torch.cat([train.x, proxy.x]).flatten().sort().values
    assert len(proxy) == 5 and torch.equal(seen, torch.arange(50.0))
    assert torch.equal(proxy_split(data, 0.1, 3, 1)[1].x, proxy.x)
    assert not torch.equal(proxy_split(data, 0.1, 3, 2)[1].x, proxy.x)  # each client its own
    one = LabelledData(torch.zeros(1, 1, 1, 1), torch.zeros(1, dtype=torch.long))
    assert len(proxy_split(one, 0.1, 0, 0)[1]) == 0  # one example: nothing to hold out


def test_the_linear_aggregator_starts_as_the_logit_mean() -> None:
    members = [create_model("mlp", 1, 3, 4) for _ in range(3)]
    x = torch.randn(20, 1, 4, 4)
    agg = StackedAggregator("linear", 3, 3)
    learned = Ensemble(members, rule=AGGREGATOR, aggregator=agg).predict_proba(x, CPU)
    mean = Ensemble(members, rule="logits").predict_proba(x, CPU)
    assert torch.allclose(learned, mean, atol=1e-6)
    logits = torch.randn(2, 5, 3)  # [K, N, C] → [N, K·C], member-major
    assert torch.equal(stack_member_logits(logits)[:, 3:], logits[1])
    with pytest.raises(ValueError, match="goes with a learned aggregator"):
        Ensemble(members, rule=AGGREGATOR)
    with pytest.raises(ValueError, match="expected probabilities"):
        combiner(AGGREGATOR)


def test_fedadam_is_the_authors_update_without_bias_correction() -> None:
    cfg = FENSConfig(server_lr=0.1, beta1=0.5, beta2=0.9, eps=1e-3)
    agg = ServerAggregator("linear", 2, 3)
    agg.moments = {n: (torch.zeros_like(p), torch.zeros_like(p)) for n, p in agg.named_parameters()}
    delta = {"weight": torch.tensor([0.2, -0.4]), "bias": torch.zeros(3)}
    new = fedadam_step(agg, delta, cfg)
    m, v = 0.5 * delta["weight"], 0.1 * delta["weight"] ** 2
    want = agg.weight.detach() + 0.1 * m / (v.sqrt() + 1e-3)
    assert torch.allclose(new.weight, want)
    assert torch.equal(new.bias, agg.bias) and torch.equal(new.moments["weight"][0], m)
    assert torch.equal(agg.weight, torch.full((2,), 0.5))  # a copy: the old state stays


def test_aggregator_fields_are_bounded_by_the_federation() -> None:
    dims = task_dims(TASK, archs=("mlp",) * 4)
    group = AggregatorFields("delta", "nn", 2)
    spec = PayloadSpec(groups=(group,))
    agg = StackedAggregator("nn", 3, 10, 2)
    good = Payload(aggregator_arrays(dict(agg.named_parameters()), "delta"), {})
    validate_payload(good, spec, dims, 0)
    too_many = StackedAggregator("nn", 5, 10, 2)
    big = Payload(aggregator_arrays(dict(too_many.named_parameters()), "delta"), {})
    with pytest.raises(PayloadError, match="at most 4"):
        validate_payload(big, spec, dims, 0)
    bad = dict(good.arrays)
    bad["delta.out.bias"] = np.full(10, np.nan, np.float32)
    with pytest.raises(PayloadError, match="finite"):
        validate_payload(Payload(bad, {}), spec, dims, 0)
    del bad["delta.out.bias"]
    with pytest.raises(PayloadError, match="missing"):
        validate_payload(Payload(bad, {}), spec, dims, 0)
    limit = byte_limit(spec, dims)
    assert limit is not None and limit >= 4 * sum(p.numel() for p in too_many.parameters()) // 2


def test_a_model_set_checks_every_model_as_its_clients() -> None:
    dims = task_dims(TASK, archs=("mlp", "cnn", "mlp"))
    models = {0: create_model("mlp", 1, 10, 8), 2: create_model("mlp", 1, 10, 8)}
    fields = model_set_fields(models)
    spec = PayloadSpec(groups=(ModelSet(),))
    validate_payload(fields, spec, dims, None)
    back = models_from_set(fields, dims)
    assert sorted(back) == [0, 2]
    wrong = model_set_fields({1: create_model("mlp", 1, 10, 8)})  # client 1 is a cnn
    with pytest.raises(PayloadError, match="'cnn', the architecture this client"):
        validate_payload(wrong, spec, dims, None)
    stranger = model_set_fields({7: create_model("mlp", 1, 10, 8)})
    with pytest.raises(PayloadError, match="below 3"):
        validate_payload(stranger, spec, dims, None)
    with pytest.raises(PayloadError, match="at least 1"):
        validate_payload(Payload({}, {}), spec, dims, None)
    limit = byte_limit(spec, dims)
    mlp = 4 * sum(p.numel() for p in models[0].parameters())
    cnn = 4 * sum(p.numel() for p in create_model("cnn", 1, 10, 8).parameters())
    assert limit is not None and 2 * mlp + cnn < limit < 2 * mlp + cnn + 100_000  # 3 clients


def test_fens_trains_its_aggregator_and_counts_every_round(tmp_path: Path) -> None:
    settings = {**TINY, "clients": 4, "local_epochs": 5, "methods": ["ensemble", FAST]}
    result = oneshotfl.run({**settings, "cache_dir": str(tmp_path / "c")})
    fens, ensemble = result.method(FAST), result.method("ensemble")
    assert fens.rounds == 31 and fens.accuracy > 0.6, fens.accuracy
    assert [h["round"] for h in fens.rounds_history] == [1, 11, 21, 31]
    assert fens.rounds_history[0]["accuracy"] < fens.accuracy  # the trained aggregator helps
    model_bytes = ensemble.upload_bytes_per_client[0]
    agg = fens.diagnostics["aggregator_parameters"]
    assert agg == 4 * 10 * 4 * 2 + 4 * 2 + 4 * 2 * 10 + 10
    # every model once, then the aggregator every round, both ways
    assert fens.download_bytes_per_client > 4 * model_bytes + 30 * 4 * agg
    assert fens.upload_bytes_per_client[0] > model_bytes + 30 * 4 * agg
    assert fens.diagnostics["round"] == 30
    assert fens.inference is not None and ensemble.inference is not None
    assert fens.inference["parameters"] == ensemble.inference["parameters"] + agg


def test_a_client_that_lost_its_round_one_logits_is_named_and_the_rest_go_on() -> None:
    cfg = make_config({**TINY, "clients": 3, "methods": [FAST], "cache_dir": None})
    fed = prepare(cfg)
    knobs = {"rounds": 3, "eval_every": 1, "aggregator": "linear"}
    method = build_method(MethodSpec("fens", knobs))
    assert isinstance(method, FENS)
    forget = fed.store.scoped("client 1")

    class Forgetful(LocalTransport):
        def upload(self, key: str, m: Any, round_index: int, broadcast: Any) -> Any:
            if round_index == 2:
                forget._memo.clear()  # as a process restarted without a disk cache
            return super().upload(key, m, round_index, broadcast)

    result = run_over("fens", method, fed, Forgetful(fed))
    assert "client 1" in result.no_reply and "round-1 models" in result.no_reply["client 1"]
    assert result.rounds == 4 and result.accuracy > 0.3


def test_a_saved_fens_ensemble_reproduces_its_accuracy(tmp_path: Path) -> None:
    settings = {**TINY, "methods": [FAST], "cache_dir": None}
    result = oneshotfl.run(settings, tmp_path / "run", save_models=True)
    model = result.load_model(FAST)
    assert isinstance(model, Ensemble) and model.aggregator is not None
    test = prepare(make_config(settings)).data.test
    probs = model.predict_proba(test.x, CPU)
    assert accuracy(probs, test.y) == pytest.approx(result.method(FAST).accuracy, abs=1e-6)


@pytest.mark.parametrize("aggregator", ["nn", "linear"])
def test_fens_runs_on_tables(tiny_config: Any, tmp_path: Path, aggregator: str) -> None:
    spec = f"{FAST}:aggregator={aggregator}"
    cfg = tiny_config(methods=[spec], dataset=table_npz(tmp_path), local_epochs=5)
    result = oneshotfl.run(dataclasses.replace(cfg, clients=3))
    assert result.method(spec).accuracy > 1 / 3 + 0.2


def test_a_multi_round_method_shows_its_rounds_as_one_task(tmp_path: Path) -> None:
    tasks: list[tuple[str, int]] = []
    advanced: list[int] = []

    class Recorder:
        @contextlib.contextmanager
        def task(self, description: str, total: int) -> Iterator[Callable[[int], None]]:
            tasks.append((description, total))
            yield advanced.append

    spec = "fens:rounds=4:eval_every=2:aggregator=linear"
    oneshotfl.run({**TINY, "methods": ["fedavg", spec], "cache_dir": None}, tracker=Recorder())
    assert ("fens:aggregator=linear:eval_every=2:rounds=4: 5 rounds", 5) in tasks
    assert not any(d.startswith("fedavg:") for d, _ in tasks)  # one round: no bar of rounds


def test_local_steps_walk_epochs_and_weigh_a_client_by_its_examples_once() -> None:
    # the authors' get_ratios: n once the steps cover an epoch, batch · steps below one
    assert examples_seen(1000, 3, 128) == 384
    assert examples_seen(300, 3, 128) == 300  # past one epoch: n, not 3 · 128 = 384
    assert examples_seen(50, 1, 128) == 50
    batches = epoch_batches(10, 5, 4, torch.Generator().manual_seed(0))
    assert [len(b) for b in batches] == [4, 4, 2, 4, 4]  # an epoch's last batch: the rest
    assert sorted(torch.cat(batches[:3]).tolist()) == list(range(10))  # each once an epoch
    one = epoch_batches(10, 1, 4, torch.Generator().manual_seed(0))[0]
    assert torch.equal(one, torch.randperm(10, generator=torch.Generator().manual_seed(0))[:4])
    assert epoch_batches(0, 3, 4, torch.Generator()) == []
    cfg = make_config({**TINY, "methods": ["fens"], "cache_dir": None})
    fed = prepare(cfg)
    reports: list[tuple[int, int]] = []

    class Recording(FENS):
        def client_update(self, ctx: Any) -> Payload:
            out = super().client_update(ctx)
            if ctx.round > 0:
                reports.append((len(self._split(ctx)[1]), int(out.scalars["n_seen"])))
            return out

    knobs = FENSConfig(rounds=1, eval_every=1, aggregator="linear", local_steps=8, batch=16)
    run_over("fens", Recording(knobs), fed, LocalTransport(fed))
    assert len(reports) == 3 and all(n < 8 * 16 for n, _ in reports)
    assert [seen for _, seen in reports] == [n for n, _ in reports]  # each its own n
