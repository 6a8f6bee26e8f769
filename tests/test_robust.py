"""Robust aggregation (issue 15): the rules by hand, and a scaled-model attacker against
one-shot FedAvg and a confidently wrong member against the ensemble."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from helpers import TINY, prepare, run_config, run_over
from oneshotfl.methods import build_method
from oneshotfl.payload import Payload, decode, encode
from oneshotfl.robust import (
    agreement_trust,
    coordinate_median,
    norm_clipped_average,
    robust_probability_mean,
    trimmed_mean,
)
from oneshotfl.runner.config import make_config
from oneshotfl.runner.federation import Federation
from oneshotfl.runner.transport import ClientReply, LocalTransport, Missing


def states(*values: float) -> list[dict[str, np.ndarray]]:
    return [
        {"w": np.array([v, -v], np.float32), "count": np.array(int(v), np.int64)} for v in values
    ]


def test_coordinate_median_and_trimmed_mean_by_hand() -> None:
    median = coordinate_median(states(1, 2, 100))
    assert median["w"].tolist() == [2.0, -2.0] and int(median["count"]) == 2
    assert median["w"].dtype == np.float32 and median["count"].dtype == np.int64
    trimmed = trimmed_mean(states(1, 2, 3, 4, 100), 0.2)  # drops 1 and 100 per coordinate
    assert trimmed["w"].tolist() == [3.0, -3.0]
    assert trimmed_mean(states(1, 2, 3), 0.2)["w"].tolist() == [2.0, -2.0]  # ⌊0.6⌋ = 0: mean
    with pytest.raises(ValueError, match="trim"):
        trimmed_mean(states(1, 2), 0.5)


def test_norm_clipping_scales_updates_to_the_median_norm() -> None:
    reference = {"w": np.zeros(2, np.float32), "count": np.array(0, np.int64)}
    clipped = norm_clipped_average(states(1, 2, 10), [1.0, 1.0, 1.0], reference)
    # update norms √2, 2√2, 10√2; the median 2√2 bounds them: updates 1, 2 and 2 (scaled)
    assert np.allclose(clipped["w"], [5 / 3, -5 / 3])
    assert int(clipped["count"]) == 2


def test_agreement_trust_and_robust_probability_means_by_hand() -> None:
    eye = torch.eye(3)
    honest = eye[[0, 1, 2, 0]]  # four samples, classes 0 1 2 0
    liar = eye[[1, 2, 0, 2]]  # always another class
    probs = torch.stack([honest, honest, honest, liar])
    assert agreement_trust(probs).tolist() == [1.0, 1.0, 1.0, 0.0]
    assert agreement_trust(probs[:1]).tolist() == [1.0]
    # two clients who disagree: each one's "others" is the other alone
    assert agreement_trust(torch.stack([honest, liar])).tolist() == [0.0, 0.0]
    median = robust_probability_mean(probs[1:], "median")
    assert torch.equal(median, honest)
    spread = torch.tensor([[[0.6, 0.4]], [[0.5, 0.5]], [[0.0, 1.0]], [[0.7, 0.3]]])
    even = robust_probability_mean(spread, "median")  # middle two per class: mean, renormalised
    assert torch.allclose(even, torch.tensor([[0.55, 0.45]]))
    trimmed = robust_probability_mean(spread, "trimmed_mean", 0.25)
    assert torch.allclose(trimmed, torch.tensor([[0.55, 0.45]]))


class ScaledClientOne(LocalTransport):
    """Client 1 sends its model with every float tensor multiplied by 50 (a valid payload)."""

    def upload(
        self, key: str, method: Any, round_index: int, broadcast: bytes | None
    ) -> tuple[list[ClientReply], Missing]:
        replies, missing = super().upload(key, method, round_index, broadcast)
        out = []
        for reply in replies:
            if reply.client_id == 1:
                payload = decode(reply.data)
                arrays = {
                    k: v * np.float32(50) if v.dtype.kind == "f" else v
                    for k, v in payload.arrays.items()
                }
                reply = dataclasses.replace(
                    reply, data=encode(type(payload)(arrays, payload.scalars))
                )
            out.append(reply)
        return out, missing


@pytest.fixture(scope="module")
def five(tmp_path_factory: pytest.TempPathFactory) -> Federation:
    cache = tmp_path_factory.mktemp("cache")
    # PyTorch's initialisation: with He's, biases start at 0 and stay small after an epoch, so
    # the MLP is nearly positively homogeneous — a model scaled by 50 keeps its predictions and
    # "takes over" the plain mean with an intact IID model, which breaks nothing to withstand.
    values = {**TINY, "clients": 5, "partition": "iid", "cache_dir": str(cache), "init": "torch"}
    return prepare(make_config(values))


def accuracy(exp: Federation, method: str, transport: LocalTransport) -> float:
    return float(run_over(method, build_method(method), exp, transport).accuracy)


@pytest.mark.parametrize(
    ("method", "modes"),
    [("fedavg", ("median", "trimmed_mean", "norm_clip")), ("ensemble", ("median", "trimmed_mean"))],
)
def test_robust_modes_withstand_a_scaled_model(
    five: Federation, method: str, modes: tuple[str, ...]
) -> None:
    clean = accuracy(five, method, LocalTransport(five))
    attacked = accuracy(five, method, ScaledClientOne(five))
    assert attacked < clean - 0.2  # the plain mean is taken over by the scaled model
    for mode in modes:  # one of five clients lost, not the run: most of the way back
        robust = accuracy(five, f"{method}:aggregation={mode}", ScaledClientOne(five))
        assert robust > attacked + 0.1 and robust > clean - 0.15, mode


class WrongPredictionsClientOne(LocalTransport):
    """Client 1 sends confident wrong predictions on the public pool (one-hot, shifted class)."""

    def upload(
        self, key: str, method: Any, round_index: int, broadcast: bytes | None
    ) -> tuple[list[ClientReply], Missing]:
        replies, missing = super().upload(key, method, round_index, broadcast)
        out = []
        for reply in replies:
            if reply.client_id == 1:
                payload = decode(reply.data)
                probs = payload.arrays["probs"]
                wrong = np.eye(probs.shape[1], dtype=probs.dtype)[(probs.argmax(1) + 1) % 10]
                reply = dataclasses.replace(reply, data=encode(type(payload)({"probs": wrong})))
            out.append(reply)
        return out, missing


def test_agreement_trust_outweighs_confident_wrong_predictions(tmp_path: Any) -> None:
    overrides = {"clients": 4, "partition": "iid", "public_size": 200, "server_model": "mlp"}
    overrides |= {"local_epochs": 10}  # honest predictions confident enough to agree
    exp = prepare(make_config({**TINY, **overrides, "cache_dir": str(tmp_path)}))
    plain = "feddf:form=predictions"
    attacked = accuracy(exp, plain, WrongPredictionsClientOne(exp))
    trusted = accuracy(exp, f"{plain}:trust=agreement", WrongPredictionsClientOne(exp))
    clean = accuracy(exp, f"{plain}:trust=agreement", LocalTransport(exp))
    assert trusted > attacked and trusted > clean - 0.1


def test_malicious_clients_are_a_setting_checked_before_training(tiny_config: Any) -> None:
    from oneshotfl.runner.config import ConfigError

    for bad, fragment in (
        ({"malicious": 1}, "expected what the 1 malicious"),
        ({"malicious": 4, "attack": "scale"}, "between 0 and clients=3"),
        ({"malicious": 1, "attack": "bribe"}, "unknown attack"),
    ):
        with pytest.raises(ConfigError, match=fragment):
            tiny_config(**bad)


def test_attacks_poison_and_tamper_as_documented(tiny_config: Any) -> None:
    from oneshotfl.security.threats import build_attack

    exp = prepare(tiny_config(malicious=1, attack="label_flip"))
    honest = prepare(tiny_config())
    flipped, clean = exp.client_context(0).data.y, honest.client_context(0).data.y
    assert torch.equal(flipped, 9 - clean)
    assert exp.attack_of(1) is None and exp.attack_of(0) is not None
    spec = build_method("feddf:form=predictions").payload_spec(honest.dims)
    probs = np.full((4, 10), 0.1, np.float32)
    probs[:, 3] = 0.2
    payload = Payload({"probs": probs / probs.sum(1, keepdims=True)})
    rng = np.random.default_rng(0)
    dims = honest.dims
    wrong = build_attack("wrong_predictions").tamper(payload, spec, dims, rng).arrays["probs"]
    assert (wrong.argmax(1) == 4).all() and (wrong.max(1) == 1).all()
    noisy = build_attack("noise").tamper(payload, spec, dims, rng).arrays["probs"]
    assert np.allclose(noisy.sum(1), 1, atol=1e-5) and not np.allclose(
        noisy, payload.arrays["probs"]
    )


def test_a_configured_scaling_attacker_and_the_robust_mode(tiny_config: Any) -> None:
    overrides = {
        "clients": 5,
        "partition": "iid",
        "methods": ["fedavg", "fedavg:aggregation=median"],
        "init": "torch",  # a scaled model that breaks the mean (see the fixture `five`)
    }
    clean = run_config(tiny_config(**overrides))
    attacked = run_config(tiny_config(**overrides, malicious=1, attack="scale:factor=50"))
    acc = {
        doc_id: {m["key"]: m["accuracy"] for m in d["methods"]}
        for doc_id, d in (("clean", clean), ("attacked", attacked))
    }
    assert acc["attacked"]["fedavg"] < acc["clean"]["fedavg"] - 0.2
    assert acc["attacked"]["fedavg:aggregation=median"] > acc["attacked"]["fedavg"] + 0.1
    assert attacked["clients"][0]["malicious"] == "scale:factor=50"
    assert "malicious" not in attacked["clients"][1]


def test_an_over_reporting_attacker_is_capped_by_clipped_weighting(tiny_config: Any) -> None:
    overrides = {"clients": 5, "partition": "iid", "local_epochs": 3}
    methods = ["fedavg:weighting=size", "fedavg:weighting=clipped"]
    doc = run_config(tiny_config(**overrides, methods=methods, malicious=1, attack="over_report"))
    exp = prepare(tiny_config(**overrides))
    claims = [len(exp.client_context(c).data) for c in range(5)]
    weights = {m["key"]: m["diagnostics"].get("weights") for m in doc["methods"]}
    acc = {m["key"]: m["accuracy"] for m in doc["methods"]}
    assert acc["fedavg:weighting=clipped"] > acc["fedavg:weighting=size"] + 0.05, (acc, weights)
    assert exp.train_pool > 4 * max(claims)  # the claim is the whole pool, far above any shard


def test_an_attack_that_does_not_fit_the_payload_is_refused_before_training(
    tiny_config: Any,
) -> None:
    from oneshotfl.runner.errors import RequirementError

    for method, attack in (("fedavg", "wrong_predictions"), ("feddf:form=predictions", "scale")):
        cfg = tiny_config(methods=[method], malicious=1, attack=attack, public_size=50)
        with pytest.raises(RequirementError, match=f"attack '{attack}' needs"):
            run_config(dataclasses.replace(cfg, server_model="mlp"))


def test_fedol_leaves_out_the_clients_the_others_contradict(tiny_config: Any) -> None:
    methods = ["fedol:iterations=2", "fedol:iterations=2:trust=agreement"]
    overrides = {"clients": 5, "partition": "iid", "public_size": 200, "server_model": "mlp"}
    overrides |= {"local_epochs": 10, "methods": methods}
    doc = run_config(tiny_config(**overrides, malicious=1, attack="wrong_predictions"))
    plain, guarded = doc["methods"]
    assert guarded["diagnostics"]["untrusted"] == [0]
    assert guarded["accuracy"] > plain["accuracy"]
    assert "untrusted" not in plain["diagnostics"]
