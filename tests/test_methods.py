"""Methods: the contract over the whole registry, and hand-computed aggregation math."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from helpers import make_server_context, prepare, run_method
from oneshotfl.data.types import TaskInfo
from oneshotfl.functional import weighted_average, weighted_softmax_mean
from oneshotfl.methods import build_method, parse_method_spec
from oneshotfl.models import create_model
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ServerContext
from oneshotfl.protocol.fields import model_fields
from oneshotfl.protocol.outcome import Ensemble, GlobalModel

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
