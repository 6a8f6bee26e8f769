"""IntactOFL: the gate's balance loss, the gates, the frozen experts, the data-free server,
the generator, and end-to-end runs of both readings."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from helpers import prepare, run_config
from oneshotfl.data.types import TaskInfo
from oneshotfl.functional import (
    cv_squared,
    expert_variance,
    masked_disagreement,
    weighted_logit_mean,
    weighted_softmax_mean,
)
from oneshotfl.methods import build_method, parse_method_spec
from oneshotfl.methods.intactofl import (
    Gate,
    GateProblem,
    IntactOFL,
    IntactOFLConfig,
    MixtureOfExperts,
    synthesis_config,
)
from oneshotfl.models.generator import ImageGenerator
from oneshotfl.training.synthesis import synthesise
from oneshotfl.training.synthesis_terms import BatchNormStatistics

TASK = TaskInfo("digits", 3, 1, 8)
CHEAP = "rounds=2:generator_steps=2:batch_size=16:width=4"
VARIANTS = [
    f"intactofl:{CHEAP}",
    f"intactofl:reading=paper:{CHEAP}",
    f"intactofl:gate=noisy_topk:top_k=2:gates=2:{CHEAP}",
    f"intactofl:mixture=probabilities:{CHEAP}",
]


def expert(seed: int, bn: bool = True) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Conv2d(1, 4, 3, padding=1)]
    layers += [nn.BatchNorm2d(4)] if bn else []
    layers += [nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 3)]
    return nn.Sequential(*layers).eval()


def moe(cfg: IntactOFLConfig, k: int = 3) -> MixtureOfExperts:
    torch.manual_seed(0)
    return MixtureOfExperts([expert(i) for i in range(k)], Gate(64, k, cfg, seed=0))


def test_cv_squared_of_a_hand_computed_three_expert_batch() -> None:
    weights = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]])
    importance = weights.sum(0)  # [0.6, 0.9, 0.5]
    mean = 2.0 / 3.0
    var = ((0.6 - mean) ** 2 + (0.9 - mean) ** 2 + (0.5 - mean) ** 2) / 2  # unbiased
    assert float(cv_squared(importance)) == pytest.approx(var / mean**2, rel=1e-6)
    assert float(cv_squared(torch.tensor([2.0, 2.0, 2.0]))) == 0.0  # balanced: no penalty
    assert float(cv_squared(torch.tensor([5.0]))) == 0.0


def test_expert_variance_and_masked_disagreement_by_hand() -> None:
    same = torch.zeros(2, 4, 3)
    assert torch.equal(expert_variance(same), torch.zeros(4))
    logits = torch.tensor([[[10.0, 0, 0]], [[0, 10.0, 0]]])  # two experts, opposite votes
    p = torch.softmax(logits, -1)
    assert float(expert_variance(logits)[0]) == pytest.approx(float(p.var(0, False).mean()))
    a, b = torch.tensor([[2.0, 0, 0], [0, 2.0, 0]]), torch.tensor([[1.0, 0, 0], [2.0, 0, 0]])
    rows = masked_disagreement(a, b, 3.0)
    assert rows[0] == 0.0 and rows[1] > 0  # only where the argmaxes differ


def test_the_gate_starts_as_the_plain_logit_ensemble() -> None:
    x = torch.randn(5, 1, 8, 8)
    gates = ("softmax", "linear", "noisy_topk")
    for kind in gates:  # gate_init=ensemble (the default): exactly the uniform gate at init
        m = moe(IntactOFLConfig(gate=kind, gates=2)).eval()
        assert torch.allclose(m(x), m.expert_logits(x).mean(0), atol=1e-6)
        assert torch.allclose(m.gate(x)[0], torch.full((5, 3), 1 / 3))
    m = moe(IntactOFLConfig(gate="linear", gate_init="torch")).eval()  # the authors' init
    assert not torch.allclose(m(x), m.expert_logits(x).mean(0), atol=1e-3)


def test_a_probability_mixture_starts_as_the_probability_ensemble() -> None:
    x = torch.randn(5, 1, 8, 8)
    for kind in ("softmax", "linear"):
        cfg = IntactOFLConfig(gate=kind, mixture="probabilities")
        torch.manual_seed(0)
        m = MixtureOfExperts([expert(i) for i in range(3)], Gate(64, 3, cfg, 0), cfg.mixture)
        probs = torch.softmax(m.expert_logits(x), -1).mean(0)
        assert torch.allclose(torch.softmax(m.eval()(x), -1), probs, atol=1e-6)


def test_a_top_k_gate_starting_at_the_ensemble_still_routes_per_sample() -> None:
    for kind in ("linear", "noisy_topk"):
        m = moe(IntactOFLConfig(gate=kind, top_k=2), k=5).eval()
        weights, _ = m.gate(torch.randn(32, 1, 8, 8))
        chosen = {tuple((w != 0).nonzero().flatten().tolist()) for w in weights}
        assert len(chosen) > 1, kind  # not every sample the same two experts
        assert ((weights != 0).sum(-1) == 2).all()


def test_the_linear_gate_keeps_its_top_k_scores() -> None:
    m = moe(IntactOFLConfig(gate="linear", top_k=2, gate_init="torch"), k=4)
    x = torch.randn(6, 1, 8, 8)
    weights, raw = m.gate(x)
    kept = (weights != 0).sum(-1)
    assert (kept == 2).all()
    top = raw[0].topk(2, dim=-1).values.sort(-1).values
    assert torch.allclose(weights[weights != 0].view(6, 2).sort(-1).values, top / 4)


def test_the_logit_ensemble_by_hand() -> None:
    logits = torch.tensor([[[2.0, 0.0]], [[0.0, 4.0]]])  # two members, one input
    out = weighted_logit_mean(logits, torch.tensor([3.0, 1.0]))  # mean logits [1.5, 1.0]
    expected = torch.softmax(torch.tensor([[1.5, 1.0]]), -1)
    assert torch.allclose(out, expected)
    probabilities = weighted_softmax_mean(logits, torch.tensor([1.0, 1.0]))
    assert not torch.allclose(weighted_logit_mean(logits, torch.ones(2)), probabilities)


def test_noisy_topk_keeps_k_experts_and_is_deterministic_in_eval() -> None:
    m = moe(IntactOFLConfig(gate="noisy_topk", top_k=2, gate_noise=1.0), k=4)
    x = torch.randn(6, 1, 8, 8)
    m.train()
    weights, _ = m.gate(x)
    assert ((weights > 0).sum(-1) == 2).all() and torch.allclose(weights.sum(-1), torch.ones(6))
    m.eval()
    assert torch.equal(m.gate(x)[0], m.gate(x)[0])


def test_experts_stay_frozen_in_eval_mode_and_byte_identical() -> None:
    for reading in ("code", "paper"):
        cfg = IntactOFLConfig(reading=reading, rounds=2, generator_steps=2, batch_size=8, width=4)
        m = moe(cfg)
        before = copy.deepcopy(m.experts.state_dict())
        gate_before = copy.deepcopy(m.gate.state_dict())
        generator = ImageGenerator(cfg.noise_dim, cfg.width, TASK)
        with BatchNormStatistics(list(m.experts)) as bn:
            problem = GateProblem(m, bn, cfg, 3, 0.1)
            m.train()
            assert not any(e.training for e in m.experts)
            synthesise(
                generator, m, problem, synthesis_config(cfg), torch.Generator(), torch.device("cpu")
            )
        after = m.experts.state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before)  # BN buffers included
        assert any(not torch.equal(gate_before[k], m.gate.state_dict()[k]) for k in gate_before)


def test_the_generator_lowers_its_own_loss_on_a_toy_teacher() -> None:
    cfg = IntactOFLConfig(reading="paper", informativeness=False, width=8, noise_dim=16)
    m = moe(cfg, k=2)
    torch.manual_seed(1)
    generator = ImageGenerator(cfg.noise_dim, cfg.width, TASK)
    z, y = torch.randn(32, cfg.noise_dim), torch.arange(32) % 3
    with BatchNormStatistics(list(m.experts)) as bn:
        problem = GateProblem(m, bn, cfg, 3, 0.1)
        start = float(problem.generator_loss(generator(z), y, m).detach())
        opt = torch.optim.Adam(generator.parameters(), lr=1e-2)
        for _ in range(30):
            opt.zero_grad()
            problem.generator_loss(generator(z), y, m).backward()
            opt.step()
        end = float(problem.generator_loss(generator(z), y, m).detach())
    assert end < 0.5 * start


def test_the_runner_hands_the_server_no_public_pool(
    tiny_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []
    aggregate = IntactOFL.aggregate

    def spy(self: IntactOFL, payloads: Any, ctx: Any) -> Any:
        seen.append(ctx.public)
        return aggregate(self, payloads, ctx)

    monkeypatch.setattr(IntactOFL, "aggregate", spy)
    cfg = tiny_config(public_size=100, methods=[VARIANTS[0]])
    assert prepare(cfg).data.public is not None  # the federation has a pool
    assert build_method(VARIANTS[0]).requires.data_free
    run_config(cfg)
    assert seen == [None]  # ... and the data-free server never received it


def test_every_variant_runs_and_reports_its_costs(tiny_config: Any) -> None:
    methods = ["ensemble", "ensemble:combine=logits", *VARIANTS]
    doc = run_config(tiny_config(methods=methods, model="cnn,mlp,cnn"))
    rows = {m["key"]: m for m in doc["methods"]}
    for key in (parse_method_spec(v).key for v in VARIANTS):
        info = rows[key]["diagnostics"]
        assert 0.0 <= rows[key]["accuracy"] <= 1.0
        assert info["experts"] == 3 and info["bn_layers"] == 0  # LeNet and MLP: no BatchNorm
        assert info["trainable_server_parameters"] == (
            info["gate_parameters"] + info["generator_parameters"]
        )
        assert info["gate_parameters"] < info["parameters"] and info["flops_per_image"] > 0
        assert len(info["gate_loss"]) == 2 and info["pool_size"] == 32
