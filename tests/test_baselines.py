"""FedProx, FedDF and MinE: hand-computed math, payload validation, tiny end-to-end runs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from helpers import make_server_context, prepare, run_method
from oneshotfl.data.types import TaskInfo, UnlabelledData

# Importing feddf, fedprox and mine (below) registers them: methods/__init__.py does not list
# them, so build_method and the registry-wide contract test see them through these imports.
from oneshotfl.functional import average_probabilities, ensemble_target, kl_to_student
from oneshotfl.methods import build_method
from oneshotfl.methods.common import initial_model
from oneshotfl.methods.feddf import FedDFConfig, choose_student
from oneshotfl.methods.fedprox import FedProx, FedProxConfig
from oneshotfl.methods.mine import (
    MinEConfig,
    lowest_entropy_client,
    lowest_entropy_labels,
    lowest_entropy_predictions,
)
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ServerContext
from oneshotfl.protocol.fields import model_fields, model_from_fields
from oneshotfl.protocol.spec import PayloadError, task_dims
from oneshotfl.protocol.validate import validate_payload
from oneshotfl.runner.checks import resolve_methods
from oneshotfl.training.components import (
    ComponentEnv,
    ComponentSpec,
    build_component,
    proximal_penalty,
)

TASK = TaskInfo("digits", 10, 1, 8)
DIMS = task_dims(TASK, 4)


def server_ctx(**kw: Any) -> ServerContext:
    return make_server_context(TASK, public=UnlabelledData(torch.zeros(4, 1, 8, 8)), **kw)


def probs_payload(rows: list[list[float]]) -> Payload:
    return Payload({"probs": np.asarray(rows, dtype=np.float32)})


# ----------------------------------------------------------------------------- FedProx


def tiny_linear(weight: list[float], bias: float) -> nn.Linear:
    layer = nn.Linear(2, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([weight]))
        layer.bias.fill_(bias)
    return layer


def test_proximal_penalty_by_hand() -> None:
    w0 = tiny_linear([0.0, 0.0], 1.0)
    proximal = build_component(
        ComponentSpec.of("proximal", mu=0.5), ComponentEnv(10, 0, torch.Generator())
    )
    proximal.setup(w0)  # snapshots w0
    none = torch.empty(0)
    with torch.no_grad():  # move the model: w = (1, 2), b = 3
        w0.weight.copy_(torch.tensor([[1.0, 2.0]]))
        w0.bias.fill_(3.0)
    # ‖w − w0‖² = 1² + 2² + (3 − 1)² = 9 → (μ/2)·9 = 0.25·9 = 2.25
    value = proximal.loss_term(w0, none, none, none)
    assert value is not None
    torch.testing.assert_close(value, torch.tensor(2.25))
    value.backward()  # ∇ = μ·(w − w0) = 0.5·(1, 2), 0.5·2
    assert w0.weight.grad is not None and w0.bias.grad is not None
    torch.testing.assert_close(w0.weight.grad, torch.tensor([[0.5, 1.0]]))
    torch.testing.assert_close(w0.bias.grad, torch.tensor([1.0]))
    same = proximal_penalty([torch.ones(3)], [torch.ones(3)], mu=7.0)
    assert float(same) == 0.0


def test_proximal_penalty_rejects_misaligned_tensors() -> None:
    with pytest.raises(ValueError, match="anchor"):
        proximal_penalty([torch.zeros(2)], [], mu=1.0)
    with pytest.raises(ValueError, match="shape"):
        proximal_penalty([torch.zeros(2)], [torch.zeros(3)], mu=1.0)


@pytest.mark.parametrize("mu", [0.0, -1.0])
def test_fedprox_config_rejects_non_positive_mu(mu: float) -> None:
    with pytest.raises(ValueError, match=r"mu: expected > 0"):
        FedProxConfig(mu=mu)
    with pytest.raises(ValueError, match="mu"):
        build_method(f"fedprox:mu={mu}")


def test_large_mu_keeps_the_client_near_the_initial_model(tiny_config: Any) -> None:
    setup = prepare(tiny_config(methods=["fedprox"]))
    ctx = setup.client_context(0)
    w0 = initial_model(ctx.arch, ctx.task, ctx.seed)

    def drift(mu: float) -> float:
        payload = FedProx(FedProxConfig(mu=mu)).client_update(ctx)
        model = model_from_fields(payload, ctx.dims)
        with torch.no_grad():
            pairs = zip(model.parameters(), w0.parameters(), strict=True)
            return float(sum(((a - b) ** 2).sum() for a, b in pairs) ** 0.5)

    free, held = drift(1e-6), drift(10.0)
    assert held < 0.2 * free, (held, free)


# ----------------------------------------------------------------------------- FedDF


def test_teacher_average_by_hand() -> None:
    probs = torch.tensor([[[0.2, 0.8], [1.0, 0.0]], [[0.6, 0.4], [0.0, 1.0]]])  # [K=2, N=2, C=2]
    torch.testing.assert_close(average_probabilities(probs), torch.tensor([[0.4, 0.6], [0.5, 0.5]]))
    with pytest.raises(ValueError, match="expected"):
        average_probabilities(torch.zeros(0, 2, 2))


def test_ensemble_target_by_hand() -> None:
    logits = torch.tensor([[[0.0, 0.0]], [[2.0, 0.0]]])  # two clients, one sample
    e, e2 = math.e, math.e**2
    # mean of softmaxes: ((.5, .5) + (e²/(e²+1), 1/(e²+1))) / 2
    want_probs = torch.tensor([[(0.5 + e2 / (e2 + 1)) / 2, (0.5 + 1 / (e2 + 1)) / 2]])
    torch.testing.assert_close(ensemble_target(logits), want_probs)
    # the paper's: softmax of the mean logits (1, 0) → (e/(e+1), 1/(e+1))
    want_logits = torch.tensor([[e / (e + 1), 1 / (e + 1)]])
    torch.testing.assert_close(ensemble_target(logits, form="logits"), want_logits)
    # T = 2 on the mean logits: softmax((0.5, 0)) = (√e/(√e+1), 1/(√e+1))
    r = math.sqrt(e)
    torch.testing.assert_close(
        ensemble_target(logits, 2.0, "logits"), torch.tensor([[r / (r + 1), 1 / (r + 1)]])
    )


def test_distillation_loss_by_hand() -> None:
    teacher = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    # sample 0: q = softmax(0, ln 3) = (1/4, 3/4): KL = ½ln(½/¼) + ½ln(½/¾) = ½ln(4/3)
    # sample 1: q = softmax(ln 3, 0) = (3/4, 1/4): KL = 1·ln(1/(3/4)) = ln(4/3) (0·log 0 = 0)
    logits = torch.tensor([[0.0, math.log(3)], [math.log(3), 0.0]])
    want = torch.tensor((0.5 * math.log(4 / 3) + math.log(4 / 3)) / 2)
    torch.testing.assert_close(kl_to_student(logits, teacher).mean(), want)
    torch.testing.assert_close(kl_to_student(2 * logits, teacher, temperature=2.0).mean(), want)
    matching = torch.log(torch.tensor([[0.3, 0.7]]))
    torch.testing.assert_close(
        kl_to_student(matching, torch.tensor([[0.3, 0.7]])).mean(), torch.tensor(0.0)
    )


def test_student_choice() -> None:
    assert choose_student("models", None, ["mlp", "mlp"]) == ("mlp", True)
    assert choose_student("models", "mlp", ["mlp", "mlp"]) == ("mlp", True)
    assert choose_student("models", "cnn", ["mlp", "mlp"]) == ("cnn", False)
    assert choose_student("models", None, ["cnn", "mlp"]) == ("cnn", False)
    assert choose_student("predictions", "cnn", []) == ("cnn", False)
    with pytest.raises(ValueError, match="set server_model"):
        choose_student("predictions", None, [])


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"form": "logits"}, "form"),
        ({"temperature": 0.0}, "temperature"),
        ({"teacher": "median"}, "teacher"),
        ({"form": "predictions", "teacher": "logits"}, "teacher"),
        ({"epochs": 0}, "epochs"),
    ],
)
def test_feddf_config_validation(params: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FedDFConfig(**params)


def test_feddf_predictions_form_needs_a_server_model() -> None:
    method = build_method("feddf:form=predictions")
    payload = probs_payload([[0.1] * 10] * 4)
    with pytest.raises(ValueError, match="set server_model"):
        method.aggregate({0: payload}, server_ctx())


def test_feddf_models_form_starts_from_the_fedavg_average() -> None:
    model = initial_model("mlp", TASK, seed=3)
    payload = model_fields(model).merged(Payload({}, {"n_examples": 5}))
    method = build_method("feddf:epochs=1")
    outcome = method.aggregate({0: payload, 1: payload}, server_ctx())
    info = getattr(outcome, "info", {})
    assert info["student_init"] == "average" and info["student_arch"] == "mlp"


# ----------------------------------------------------------------------------- MinE


def test_lowest_entropy_labels_by_hand() -> None:
    client_a = [[0.5, 0.5, 0.0], [0.9, 0.05, 0.05], [0.2, 0.3, 0.5], [0.4, 0.3, 0.3]]
    client_b = [[0.0, 0.5, 0.5], [0.1, 0.1, 0.8], [0.0, 1.0, 0.0], [0.3, 0.3, 0.4]]
    probs = torch.tensor([client_a, client_b])
    # x0: H_a = H_b = ln 2 exactly (a tie): the lowest client id (a) wins, and its classes 0
    #     and 1 tie at 0.5: the lowest class (0) wins.
    # x1: H_a(.9, .05, .05) = 0.394 < H_b(.1, .1, .8) = 0.639 → a → class 0
    # x2: H_b = 0 (one-hot) < H_a = 1.030 → b → class 1
    # x3: identical multisets (a permutation): equal entropies → a → class 0
    assert lowest_entropy_client(probs).tolist() == [0, 0, 1, 0]
    assert lowest_entropy_labels(probs).tolist() == [0, 0, 1, 0]
    assert lowest_entropy_labels(probs).dtype == torch.int64
    torch.testing.assert_close(lowest_entropy_predictions(probs)[2], torch.tensor([0.0, 1, 0]))
    with pytest.raises(ValueError, match="expected"):
        lowest_entropy_labels(torch.zeros(2, 3))


def test_mine_config_validation() -> None:
    with pytest.raises(ValueError, match="target"):
        MinEConfig(target="vote")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epochs"):
        MinEConfig(epochs=0)


# ----------------------------------------------------------------------------- wire


@pytest.mark.parametrize("spec", ["mine", "feddf:form=predictions"])
def test_prediction_payloads_must_be_probability_rows(spec: str) -> None:
    method = build_method(spec)
    good = probs_payload([[0.1] * 10] * 4)
    validate_payload(good, method.payload_spec(DIMS), DIMS)
    bad = probs_payload([[0.1] * 10] * 3 + [[0.2] * 10])  # the last row sums to 2
    with pytest.raises(PayloadError, match="rows summing to 1"):
        validate_payload(bad, method.payload_spec(DIMS), DIMS, client=1)
    short = probs_payload([[0.1] * 10] * 3)  # 3 rows for a public pool of 4
    with pytest.raises(PayloadError, match="N_pub"):
        validate_payload(short, method.payload_spec(DIMS), DIMS)
    model = model_fields(initial_model("mlp", TASK, seed=0))
    with pytest.raises(PayloadError, match="probs"):
        validate_payload(model, method.payload_spec(DIMS), DIMS)


def test_feddf_payload_spec_follows_the_form() -> None:
    model = model_fields(initial_model("mlp", TASK, seed=0)).merged(Payload({}, {"n_examples": 3}))
    validate_payload(model, build_method("feddf").payload_spec(DIMS), DIMS)
    with pytest.raises(PayloadError, match=r"model\.arch"):
        validate_payload(
            probs_payload([[0.1] * 10] * 4), build_method("feddf").payload_spec(DIMS), DIMS
        )


# ----------------------------------------------------------------------------- end to end


def test_tiny_runs_of_every_baseline(tiny_config: Any) -> None:
    specs = [
        "fedprox",
        "feddf",
        "feddf:teacher=probabilities",
        "feddf:form=predictions",
        "mine",
        "mine:target=soft",
    ]
    cfg = tiny_config(public_size=200, server_model="mlp", server_epochs=2, methods=specs)
    setup = prepare(cfg)
    results = {key: run_method(key, method, setup) for key, method in resolve_methods(specs)}
    for key, result in results.items():
        assert 0.0 <= result["accuracy"] <= 1.0, key
        assert result["rejected"] == {} and result["clients_used"] == [0, 1, 2], key
    model_bytes = min(min(results[k]["upload_bytes_per_client"]) for k in ("fedprox", "feddf"))
    raw = 200 * 10 * 4  # N_pub · C · float32
    for key in ("feddf:form=predictions", "mine", "mine:target=soft"):
        sizes = results[key]["upload_bytes_per_client"]
        assert all(raw < s < raw + 512 for s in sizes), (key, sizes)
        assert max(sizes) * 5 < model_bytes, (key, sizes, model_bytes)
    assert results["feddf"]["diagnostics"]["student_init"] == "average"
    assert results["feddf:form=predictions"]["diagnostics"]["student_init"] == "initial"
    assert results["fedprox"]["diagnostics"]["mu"] == 0.01
    histogram = results["mine"]["diagnostics"]["pseudo_label_histogram"]
    assert len(histogram) == 10 and sum(histogram) == 200
    shares = results["mine"]["diagnostics"]["chosen_client_share"]
    assert set(shares) == {"0", "1", "2"} and math.isclose(sum(shares.values()), 1.0)


def test_feddf_distils_heterogeneous_client_models(tiny_config: Any) -> None:
    cfg = tiny_config(public_size=100, model="mlp,cnn", server_epochs=1, methods=["feddf"])
    setup = prepare(cfg)
    [(key, method)] = resolve_methods(cfg.methods)
    result = run_method(key, method, setup)
    assert result["rejected"] == {} and 0.0 <= result["accuracy"] <= 1.0
    assert result["diagnostics"]["student_arch"] == "mlp"  # client 0's architecture
    assert result["diagnostics"]["student_init"] == "initial"


def test_centralized_trains_the_union_for_its_own_epochs_where_given() -> None:
    from oneshotfl.methods.centralized import CentralizedConfig, union_budget
    from oneshotfl.training.loop import TrainConfig

    client = TrainConfig(epochs=3, min_steps=40)
    assert union_budget(client, 5) == TrainConfig(epochs=3, min_steps=200)  # the clients'
    assert union_budget(client, 5, 2) == TrainConfig(epochs=2, min_steps=200)
    with pytest.raises(ValueError, match=r"epochs: expected an int >= 1, got 0"):
        CentralizedConfig(epochs=0)
    assert build_method("centralized:epochs=2").config == CentralizedConfig(epochs=2)
