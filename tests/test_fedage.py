"""FedAGE: the distillation losses by hand, the wire (latents + a head on embeddings), runs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from helpers import check, prepare, run_config, run_method
from oneshotfl.functional import kl_to_student
from oneshotfl.methods import build_method
from oneshotfl.methods.fedage_config import FedAGEConfig
from oneshotfl.methods.fedage_server import kd_loss
from oneshotfl.models import create_model
from oneshotfl.payload import Payload
from oneshotfl.protocol.fields import model_fields
from oneshotfl.protocol.spec import PayloadError, WireDims
from oneshotfl.protocol.validate import validate_payload
from oneshotfl.runner.checks import resolve_methods
from oneshotfl.runner.errors import RequirementError

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


def test_a_knob_value_named_none_is_that_value_not_the_readings_default() -> None:
    """``ensemble_weighting=none`` in a method spec is the literal "none" (uniform weights),
    not None (= the reading's value, confidence under the authors' reading)."""
    method = build_method("fedage:ensemble_weighting=none")
    assert method.config.ensemble_weighting == "none"
    assert method.config.setting("ensemble_weighting") == "none"
    assert build_method("fedage:dp_epsilon=none").config.dp_epsilon is None
    assert build_method("fedage").config.setting("ensemble_weighting") == "confidence"


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
        check(setup, resolve_methods(["fedage"]))


def test_tiny_fedage_runs_learn_and_send_no_labels(tiny_config: Any) -> None:
    server = "block_epochs=5:ensemble_epochs=5"  # not the authors' 50 + 50: still learns (> 0.5)
    specs = [
        f"fedage:lr=0.01:epochs=20:{server}",
        f"fedage:lr=0.01:epochs=20:previous=live:order=random:{server}",
    ]
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
        outcome = FedAGE(cfg).aggregate(payloads, setup.server_view().server_context())
        return {k: v.clone() for k, v in outcome.model.head.state_dict().items()}

    def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
        return all(torch.equal(a[k], b[k]) for k in a)

    def paper(**knobs: Any) -> FedAGEConfig:
        return FedAGEConfig(reading="paper", **knobs)

    one_epoch = head(paper(epochs=1))
    # one epoch: a single cycle over the clients either way
    assert same(one_epoch, head(paper(epochs=1, schedule="interleaved")))
    assert same(one_epoch, head(paper(epochs=1, ensemble_epochs=1)))
    assert not same(one_epoch, head(paper(epochs=1, ensemble_epochs=0)))
    assert not same(head(paper(epochs=2)), head(paper(epochs=2, schedule="interleaved")))
    # a reading is only the defaults of its knobs: spelled out, the paper's is the authors'
    authors = {k: v for k, v in FedAGEConfig().resolved().items() if "epochs" not in k}
    short = {"block_epochs": 1, "ensemble_epochs": 1}
    assert same(head(FedAGEConfig(epochs=1, **short)), head(paper(epochs=1, **short, **authors)))


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
    from oneshotfl.privacy import analytic_gaussian_sigma, clip_rows, latent_privacy_report
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

    report = latent_privacy_report(FedAGEConfig(dp_epsilon=2.0, clip=3.0))
    assert report["latents"]["covered"] and report["latents"]["sensitivity_l2"] == 6.0
    assert report["latents"]["sigma"] == analytic_gaussian_sigma(2.0, 1e-5, 6.0)
    assert not report["head"]["covered"] and "true labels" in report["head"]["why"]
    assert not report["labels"]["covered"] and "pseudo-label" in report["labels"]["why"]
    assert not latent_privacy_report(FedAGEConfig())["latents"]["covered"]
    both = latent_privacy_report(FedAGEConfig(dp_epsilon=2.0, label_epsilon=1.0))
    assert both["labels"]["covered"] and both["head"]["covered"]
    assert both["head"]["epsilon"] == 3.0  # composition over the latent and the label
    clean_head = FedAGEConfig(dp_epsilon=2.0, label_epsilon=1.0, head_source="clean")
    assert not latent_privacy_report(clean_head)["head"]["covered"]

    dp = "fedage:block_epochs=1:dp_epsilon=4:ensemble_epochs=1"  # the server's budget is moot
    doc = run_config(tiny_config(methods=[dp, "head_ensemble"], encoder="random:dim=32"))
    write_result(tmp_path / "run", doc)
    import json

    written = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert list(written) == [dp]
    assert written[dp]["latents"]["epsilon"] == 4.0


def _separated_toy() -> tuple[Any, dict[int, Payload], Any]:
    """Three clients, three well-separated latent clusters in 4-d, client k holding class k
    only; each client's head, trained on its own latents alone, predicts its own class
    everywhere. Images are the latents themselves (the identity encoder)."""
    from helpers import make_server_context
    from oneshotfl.data.types import TaskInfo, UnlabelledData
    from oneshotfl.encoders import build_encoder
    from oneshotfl.protocol.fields import model_fields

    task = TaskInfo("toy", 3, 4, 1)
    encoder = build_encoder("identity", task, 0)
    gen = torch.Generator().manual_seed(0)

    def cluster(k: int, n: int) -> torch.Tensor:
        return (6.0 * torch.eye(4)[k] + 0.5 * torch.randn(n, 4, generator=gen)).view(n, 4, 1, 1)

    payloads = {}
    for k in range(3):
        z = cluster(k, 60).flatten(1)
        torch.manual_seed(k)
        head = create_model("head_mlp", 4, 3, 1)
        opt = torch.optim.Adam(head.parameters(), lr=1e-2)
        for _ in range(100):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(head(z), torch.full((60,), k)).backward()
            opt.step()
        payloads[k] = Payload({"latents": z.numpy()}, {"n_examples": 60}).merged(
            model_fields(head.eval(), "head")
        )
    test_x = torch.cat([cluster(k, 50) for k in range(3)])
    test = LabelledTest(test_x, torch.arange(3).repeat_interleave(50))
    ctx = make_server_context(task, encoder=encoder, public=None)
    del UnlabelledData
    return ctx, payloads, test


class LabelledTest:
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y


def test_the_authors_reading_reaches_the_control_and_kl_only_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import oneshotfl.methods.fedage as fedage_module
    from oneshotfl.methods.heads import PseudoLabelHead

    ctx, payloads, test = _separated_toy()

    def accuracy(method: Any) -> float:
        outcome = method.aggregate(payloads, ctx)
        probs = outcome.predict_proba(test.x, torch.device("cpu"))
        return float((probs.argmax(1) == test.y).double().mean())

    short = {"block_epochs": 10, "ensemble_epochs": 20}
    control = accuracy(PseudoLabelHead(FedAGEConfig(**short)))
    authors = accuracy(build_method("fedage:block_epochs=10:ensemble_epochs=20"))
    paper = accuracy(build_method("fedage:reading=paper:block_epochs=10:ensemble_epochs=20"))
    assert control == 1.0 and authors >= control - 0.02
    assert paper < 0.7  # KL to a near-uniform ensemble of one-class heads: near chance

    seen: dict[str, torch.Tensor] = {}
    phase2 = fedage_module.phase2

    def spy(cfg: Any, student: Any, z: Any, p_ens: Any, own: Any, c: Any) -> None:
        seen["own"] = own
        phase2(cfg, student, z, p_ens, own, c)

    monkeypatch.setattr(fedage_module, "phase2", spy)
    accuracy(build_method("fedage:block_epochs=1:ensemble_epochs=1"))
    # the CE term's labels: each latent's own client's head, i.e. client k's class here
    assert torch.equal(seen["own"], torch.arange(3).repeat_interleave(60))


def test_randomized_response_rates_by_hand() -> None:
    from oneshotfl.privacy import randomized_response, randomized_response_keep

    p = randomized_response_keep(1.0, 10)
    assert p == pytest.approx(math.e / (math.e + 9))
    y = torch.zeros(200_000, dtype=torch.long)
    out = randomized_response(y, 10, 1.0, torch.Generator().manual_seed(0))
    counts = torch.bincount(out, minlength=10).double() / len(y)
    assert float(counts[0]) == pytest.approx(p, abs=0.005)
    assert torch.allclose(
        counts[1:], torch.full((9,), (1 - p) / 9, dtype=torch.float64), atol=0.004
    )
    with pytest.raises(ValueError, match="label epsilon"):
        randomized_response_keep(0.0, 10)


def test_the_clients_report_how_often_pseudo_labels_are_true(tiny_config: Any) -> None:
    cfg = tiny_config(
        methods=[
            "fedage:block_epochs=1:ensemble_epochs=1",
            "fedage:label_epsilon=0.1:block_epochs=1:ensemble_epochs=1",
        ],
        encoder="random:dim=16",
    )

    clean, private = run_config(cfg)["methods"]
    agree = clean["client_facts"]["pseudo_label_agreement"]
    noisy = private["client_facts"]["pseudo_label_agreement"]
    assert len(agree) == 3 and all(0 <= a <= 1 for a in agree)
    assert sum(noisy) < sum(agree)  # heads fit to randomized labels give the labels away less
