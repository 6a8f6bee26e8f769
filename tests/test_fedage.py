"""FedAGE: the distillation losses by hand, the wire (latents + a head on embeddings), runs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from helpers import prepare, run_method
from oneshotfl.functional import kl_to_student
from oneshotfl.methods import build_method
from oneshotfl.methods.fedage import FedAGEConfig, kd_loss
from oneshotfl.models import create_model
from oneshotfl.protocol.payload import Payload
from oneshotfl.protocol.spec import PayloadError, WireDims, model_fields, validate_payload
from oneshotfl.runner.engine import RequirementError
from oneshotfl.runner.experiment import resolve_methods

DIMS = WireDims(10, 1, 8, 0, {"D": 16})


def test_kd_loss_by_hand() -> None:
    logits = torch.zeros(2, 2)  # student uniform at any τ
    hard = torch.tensor([0, 1])
    soft = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    weight = torch.tensor([0.8, 0.5])
    # CE = log 2 for both; KL(soft ‖ uniform) = log 2 and 0
    expected = 0.25 * math.log(2) + 0.75 * (0.8 * math.log(2) + 0.5 * 0.0) / 2
    got = kd_loss(logits, hard, soft, weight, beta=0.25, tau=2.0)
    assert math.isclose(float(got), expected, rel_tol=1e-6)
    only_hard = kd_loss(logits, hard, soft, weight, beta=1.0, tau=2.0)
    assert math.isclose(float(only_hard), math.log(2), rel_tol=1e-6)


def test_the_ensemble_phase_loss_uses_the_temperature() -> None:
    logits = torch.tensor([[2.0, 0.0]])
    target = torch.tensor([[0.5, 0.5]])
    q = torch.softmax(logits / 2.0, dim=-1)
    expected = float((target * (target.log() - q.log())).sum())
    assert math.isclose(float(kl_to_student(logits, target, 2.0).mean()), expected)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"beta": 1.5}, "beta"),
        ({"gamma": -0.1}, "gamma"),
        ({"head": "head_mlp,nope"}, "registered models, got 'nope'"),
        ({"previous": "frozen"}, "previous"),
        ({"order": "alphabetical"}, "order"),
        ({"schedule": "shuffled"}, "schedule"),
        ({"ensemble_epochs": -1}, "ensemble_epochs"),
    ],
)
def test_fedage_config_validation(params: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FedAGEConfig(**params)


def test_heads_cycle_over_clients() -> None:
    cfg = FedAGEConfig(head="head_mlp,head_mlp2")
    assert [cfg.client_head(c) for c in range(3)] == ["head_mlp", "head_mlp2", "head_mlp"]


def test_payload_holds_latents_and_a_head_on_embeddings() -> None:
    spec = build_method("fedage").payload_spec(DIMS)
    head = create_model("head_mlp", 16, 10, 1)
    good = Payload({"latents": np.zeros((5, 16), np.float32)}, {"n_examples": 5}).merged(
        model_fields(head, "head")
    )
    validate_payload(good, spec, DIMS, 0)
    wrong_d = Payload({"latents": np.zeros((5, 16), np.float32)}, {"n_examples": 5}).merged(
        model_fields(create_model("head_mlp", 8, 10, 1), "head")
    )
    with pytest.raises(PayloadError, match=r"head\.features\.1\.weight"):
        validate_payload(wrong_d, spec, DIMS, 0)
    bad_latents = Payload({"latents": np.zeros((5, 15), np.float32)}, {"n_examples": 5}).merged(
        model_fields(head, "head")
    )
    with pytest.raises(PayloadError, match="latents"):
        validate_payload(bad_latents, spec, DIMS, 0)


def test_fedage_needs_the_encoder(tiny_config: Any) -> None:
    setup = prepare(tiny_config(methods=["fedage"]))
    with pytest.raises(RequirementError, match="shared frozen encoder"):
        setup.check(resolve_methods(["fedage"]))


def test_tiny_fedage_runs_learn_and_send_no_labels(tiny_config: Any) -> None:
    specs = ["fedage:lr=0.01:epochs=20", "fedage:lr=0.01:epochs=20:previous=live:order=random"]
    cfg = tiny_config(methods=specs, encoder="random:dim=32", local_epochs=1)
    setup = prepare(cfg)
    results = {key: run_method(key, method, setup) for key, method in resolve_methods(specs)}
    for key, result in results.items():
        assert result["rejected"] == {} and result["accuracy"] > 0.5, (key, result["accuracy"])
        total = sum(len(c.train) for c in setup.data.clients)
        assert result["diagnostics"]["latents"] == total
    [method] = [m for _, m in resolve_methods(specs[:1])]
    payload = method.client_update(setup.client_context(0))
    assert set(payload.arrays) - {k for k in payload.arrays if k.startswith("head.")} == {"latents"}
    assert payload.arrays["latents"].shape[1] == 32


def test_phase_schedule_and_phase_two_knobs(tiny_config: Any) -> None:
    from oneshotfl.methods.fedage import FedAGE

    setup = prepare(tiny_config(methods=["fedage"], encoder="random:dim=16", local_epochs=1))
    first = FedAGE(FedAGEConfig(epochs=1))
    payloads = {c.client_id: first.client_update(setup.client_context(c.client_id))
                for c in setup.data.clients}  # fmt: skip

    def head(cfg: FedAGEConfig) -> dict[str, torch.Tensor]:
        outcome = FedAGE(cfg).aggregate(payloads, setup.server_context())
        return {k: v.clone() for k, v in outcome.model.head.state_dict().items()}

    def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
        return all(torch.equal(a[k], b[k]) for k in a)

    one_epoch = head(FedAGEConfig(epochs=1))
    # one epoch: a single cycle over the clients either way
    assert same(one_epoch, head(FedAGEConfig(epochs=1, schedule="interleaved")))
    assert same(one_epoch, head(FedAGEConfig(epochs=1, ensemble_epochs=1)))
    assert not same(one_epoch, head(FedAGEConfig(epochs=1, ensemble_epochs=0)))
    assert not same(
        head(FedAGEConfig(epochs=2)), head(FedAGEConfig(epochs=2, schedule="interleaved"))
    )


def test_head_baselines(tiny_config: Any) -> None:
    specs = [
        "head_avg:lr=0.01:epochs=20",
        "head_avg:lr=0.01:epochs=20:weighting=size",
        "head_ensemble:lr=0.01:epochs=20",
        "centralized_head:lr=0.01:epochs=20",
    ]
    setup = prepare(tiny_config(methods=specs, encoder="random:dim=32", local_epochs=1))
    results = [run_method(key, method, setup) for key, method in resolve_methods(specs)]
    for result in results:
        assert result["rejected"] == {} and 0.0 <= result["accuracy"] <= 1.0, result["key"]
    assert results[2]["outcome"] == "Ensemble"
    assert results[3]["accuracy"] > 0.8  # one head on all embeddings and labels
    head_bytes = results[0]["upload_bytes_per_client"]
    raw = results[3]["upload_bytes_per_client"]
    sizes = [len(c.train) for c in setup.data.clients]
    for n, b in zip(sizes, raw, strict=True):
        assert n * (32 * 4 + 8) < b < n * (32 * 4 + 8) + 1024  # latents + int64 labels
    assert len(set(head_bytes)) == 1  # a head is the same size on every client


def test_local_dp_on_latents_and_the_privacy_report(tiny_config: Any, tmp_path: Any) -> None:
    from oneshotfl.methods.common import client_embeddings
    from oneshotfl.privacy import analytic_gaussian_sigma, clip_rows
    from oneshotfl.runner.experiment import run_experiment
    from oneshotfl.runner.results import write_result

    setup = prepare(tiny_config(methods=["fedage"], encoder="random:dim=32"))
    ctx = setup.client_context(0)
    clean = clip_rows(client_embeddings(ctx), 0.5)
    private = build_method("fedage:dp_epsilon=1:clip=0.5").client_update(setup.client_context(0))
    noise = torch.from_numpy(private.arrays["latents"]) - clean
    sigma = analytic_gaussian_sigma(1.0, 1e-5, 1.0)  # sensitivity 2C = 1
    assert abs(float(noise.std()) / sigma - 1) < 0.1
    loose = build_method("fedage:dp_epsilon=1e6:clip=0.5").client_update(setup.client_context(0))
    assert torch.allclose(torch.from_numpy(loose.arrays["latents"]), clean, atol=5e-3)

    report = FedAGEConfig(dp_epsilon=2.0, clip=3.0).privacy_report()
    assert report["latents"]["covered"] and report["latents"]["sensitivity_l2"] == 6.0
    assert report["latents"]["sigma"] == analytic_gaussian_sigma(2.0, 1e-5, 6.0)
    assert not report["head"]["covered"] and "labels" in report["head"]["why"]
    assert not FedAGEConfig().privacy_report()["latents"]["covered"]

    doc = run_experiment(
        tiny_config(methods=["fedage:dp_epsilon=4", "head_ensemble"], encoder="random:dim=32")
    )
    write_result(tmp_path / "run", doc)
    import json

    written = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert list(written) == ["fedage:dp_epsilon=4"]
    assert written["fedage:dp_epsilon=4"]["latents"]["epsilon"] == 4.0
