"""Methods: the contract over the whole registry, and hand-computed aggregation math."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from helpers import make_server_context, prepare, run_method
from oneshotfl.data.types import LabelledData, TaskInfo
from oneshotfl.functional import weighted_average, weighted_member_sum, weighted_softmax_mean
from oneshotfl.methods import build_method, parse_method_spec
from oneshotfl.methods.builders import (
    client_logits,
    client_models,
    initial_model_parts,
    seeded_head,
    seeded_model,
    shared_initial_model,
)
from oneshotfl.models import create_model
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, ServerContext
from oneshotfl.protocol.fields import model_fields
from oneshotfl.protocol.outcome import Ensemble, GlobalModel
from oneshotfl.protocol.spec import task_dims
from oneshotfl.seeding import seeded_torch
from oneshotfl.training.loop import TrainConfig, predict_logits
from oneshotfl.training.recipe import initial_model

TASK = TaskInfo("digits", 10, 1, 8)


def server_ctx(**kw: Any) -> ServerContext:
    return make_server_context(TASK, **kw)


def test_weighted_average_matches_hand_computation() -> None:
    a = {"w": np.array([1.0, 2.0], np.float32), "n": np.array(2, np.int64)}
    b = {"w": np.array([4.0, 8.0], np.float32), "n": np.array(5, np.int64)}
    out = weighted_average([a, b], [1, 2])  # (1·a + 2·b) / 3
    np.testing.assert_allclose(out["w"], [3.0, 6.0])
    assert out["w"].dtype == np.float32
    assert out["n"] == 4 and out["n"].dtype == np.int64  # (2 + 10)/3 = 4


@pytest.mark.parametrize("weights", [[], [1.0], [-1.0, 2.0], [0.0, 0.0]])
def test_weighted_average_rejects_bad_weights(weights: list[float]) -> None:
    a = {"w": np.zeros(2, np.float32)}
    with pytest.raises(ValueError, match="weights"):
        weighted_average([a, a], weights)


def test_fedavg_of_one_client_is_that_client() -> None:
    torch.manual_seed(1)
    model = create_model("cnn", 1, 10, 8).eval()
    payload = model_fields(model).merged(Payload({}, {"n_examples": 17}))
    outcome = build_method("fedavg").aggregate({0: payload}, server_ctx())
    assert isinstance(outcome, GlobalModel)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(outcome.model.state_dict()[key], value)


def test_ensemble_of_identical_members_equals_one_member() -> None:
    torch.manual_seed(2)
    model = create_model("mlp", 1, 10, 8).eval()
    payload = model_fields(model).merged(Payload({}, {"n_examples": 5}))
    outcome = build_method("ensemble").aggregate({0: payload, 1: payload, 2: payload}, server_ctx())
    assert isinstance(outcome, Ensemble)
    x = torch.randn(6, 1, 8, 8)
    single = torch.softmax(model(x), dim=-1)
    torch.testing.assert_close(outcome.predict_proba(x, torch.device("cpu")), single)


def test_size_weighted_ensemble_matches_hand_computation() -> None:
    logits = torch.tensor([[[0.0, 0.0]], [[10.0, -10.0]]])  # member 0: (.5,.5); member 1: ≈(1,0)
    probs = weighted_softmax_mean(logits, torch.tensor([3.0, 1.0]))
    torch.testing.assert_close(
        probs, torch.tensor([[0.75 * 0.5 + 0.25, 0.75 * 0.5]]), atol=1e-6, rtol=0
    )


def test_weighted_member_sum_matches_hand_computation() -> None:
    members = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[10.0, 20.0], [30.0, 40.0]]])  # [2, 2, 2]
    per_member = weighted_member_sum(torch.tensor([0.5, 2.0]), members)
    torch.testing.assert_close(per_member, torch.tensor([[20.5, 41.0], [61.5, 82.0]]))
    per_row = weighted_member_sum(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), members)  # [K, N]
    torch.testing.assert_close(per_row, torch.tensor([[1.0, 2.0], [30.0, 40.0]]))


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def client_ctx(**kw: Any) -> ClientContext:
    values: dict[str, Any] = dict(
        client_id=0,
        data=LabelledData(torch.zeros(2, 1, 8, 8), torch.zeros(2, dtype=torch.long)),
        val=None,
        task=TASK,
        arch="cnn",
        train_config=TrainConfig(init="torch"),
        public=None,
        device=torch.device("cpu"),
        seed=4,
    )
    values.update(kw)
    return ClientContext(**values)


def test_shared_initial_model_reads_arch_seed_and_init_from_the_context() -> None:
    client = client_ctx()
    assert same_weights(shared_initial_model(client), initial_model("cnn", TASK, 4, init="torch"))
    assert not same_weights(shared_initial_model(client), initial_model("cnn", TASK, 4))
    server = server_ctx(server_arch="mlp", seed=2)
    assert same_weights(shared_initial_model(server), initial_model("mlp", TASK, 2))
    own = shared_initial_model(server, "cnn", extra_outputs=1)
    assert same_weights(own, initial_model("cnn", TASK, 2, 1))
    with pytest.raises(ValueError, match="server architecture"):
        shared_initial_model(server_ctx())
    parts = {"arch": "cnn", "seed": 4, "init": "torch", "task": [10, 1, 8]}
    assert initial_model_parts(client) == parts  # a cached model's key follows its start


def test_seeded_models_and_heads_come_from_their_stream() -> None:
    ctx = client_ctx()
    with seeded_torch(4, "a", 1):
        expected = create_model("cnn", 1, 10, 8, "torch")
    assert same_weights(seeded_model(ctx, "a", 1), expected)
    assert not same_weights(seeded_model(ctx, "a", 2), expected)
    with seeded_torch(4, "h"):
        head = create_model("head_mlp", 16, 10, 1, "torch")
    assert same_weights(seeded_head(ctx, "head_mlp", 16, "h"), head)


def test_client_models_and_logits_follow_client_ids() -> None:
    torch.manual_seed(5)
    models = {c: create_model("mlp", 1, 11, 8).eval() for c in (3, 1)}
    payloads = {c: model_fields(m, "student0") for c, m in models.items()}
    dims = task_dims(TASK)
    rebuilt = client_models(payloads, dims, prefix="student0", extra_outputs=1)
    assert all(not m.training for m in rebuilt)
    assert same_weights(rebuilt[0], models[1]) and same_weights(rebuilt[1], models[3])
    x = torch.randn(4, 1, 8, 8)
    cpu = torch.device("cpu")
    logits = client_logits(
        {c: model_fields(m) for c, m in models.items()},
        task_dims(TaskInfo("digits", 11, 1, 8)),
        x,
        cpu,
    )
    expected = torch.stack([predict_logits(models[c], x, cpu) for c in (1, 3)])
    assert torch.equal(logits, expected)


def test_method_specs_parse_and_coerce() -> None:
    spec = parse_method_spec("ensemble:weighting=size")
    assert spec.name == "ensemble" and spec.params == {"weighting": "size"}
    assert spec.key == "ensemble:weighting=size"
    assert build_method(spec).config.weighting == "size"
    with pytest.raises(ValueError, match="weighting"):
        build_method("ensemble:weighting=median")
    with pytest.raises(ValueError, match="unknown parameter"):
        build_method("ensemble:temperature=2")
    with pytest.raises(ValueError, match="key=value"):
        parse_method_spec("ensemble:size")


def test_batchnorm_models_cross_the_wire_and_average(tiny_config: Any) -> None:
    setup = prepare(tiny_config(model="resnet8", methods=["fedavg"]))
    result = run_method("fedavg", build_method("fedavg"), setup)
    assert result["rejected"] == {} and result["clients_used"] == [0, 1, 2]
