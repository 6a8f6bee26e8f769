"""DENSE and Co-Boosting: the hard-sample weight, the boosted ensemble weights, and runs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from helpers import run_config
from oneshotfl.methods import parse_method_spec
from oneshotfl.methods.dense import CoBoostingConfig, DenseConfig, DistilFromEnsemble, HardSamples
from oneshotfl.training.synthesis_terms import BatchNormStatistics

CHEAP = "rounds=2:generator_steps=2:batch_size=16:width=4"
VARIANTS = [
    f"dense:{CHEAP}",
    f"co_boosting:{CHEAP}",
    f"co_boosting:ensemble_weights=boosted:{CHEAP}",
]


def teachers() -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Flatten(), nn.Linear(4, 3)).eval() for _ in range(3)]


def test_hard_samples_weigh_ce_by_one_minus_the_teachers_probability() -> None:
    problem = HardSamples(teachers(), BatchNormStatistics([]), CoBoostingConfig(), 3)
    t = torch.tensor([[4.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    y = torch.tensor([0, 1])
    p = torch.softmax(t, -1)
    ce = torch.nn.functional.cross_entropy(t, y, reduction="none")
    want = ((1 - p[0, 0]) * ce[0] + (1 - p[1, 1]) * ce[1]) / 2
    assert float(problem.similarity(t, y)) == pytest.approx(float(want))
    dense = DistilFromEnsemble(teachers(), BatchNormStatistics([]), DenseConfig(), 3)
    assert float(dense.similarity(t, y)) == pytest.approx(float(ce.mean()))


@pytest.mark.parametrize("mode", ["fixed", "boosted"])
def test_ensemble_weights_stay_uniform_or_are_learnt_in_the_unit_box(mode: str) -> None:
    cfg = CoBoostingConfig(ensemble_weights=mode, weight_step=0.1, batch_size=8)
    problem = HardSamples(teachers(), BatchNormStatistics([]), cfg, 3)
    x, y = torch.randn(32, 1, 2, 2), torch.randint(3, (32,))
    problem.pool_grew(x, y, torch.Generator().manual_seed(0))
    w = problem.weights
    if mode == "fixed":
        assert torch.equal(w, torch.full((3,), 1 / 3))
    else:
        assert not torch.equal(w, torch.full((3,), 1 / 3))
        assert bool(((w >= 0) & (w <= 1)).all()) and float(w.sum()) > 0


def test_the_teacher_is_the_weighted_logit_ensemble() -> None:
    ts = teachers()
    problem = DistilFromEnsemble(ts, BatchNormStatistics([]), DenseConfig(), 3)
    x = torch.randn(5, 1, 2, 2)
    mean = torch.stack([t(x) for t in ts]).mean(0)
    assert torch.allclose(problem.teacher(x), mean, atol=1e-6)
    w = torch.tensor([1.0, 0.0, 0.0])
    assert torch.allclose(problem.teacher(x, w), ts[0](x), atol=1e-6)


def test_every_variant_runs_data_free_into_the_server_model(tiny_config: Any) -> None:
    cfg = tiny_config(methods=VARIANTS, model="cnn,mlp,cnn", server_model="mlp")
    rows = {m["key"]: m for m in run_config(cfg)["methods"]}
    for key in (parse_method_spec(v).key for v in VARIANTS):
        info = rows[key]["diagnostics"]
        assert 0.0 <= rows[key]["accuracy"] <= 1.0
        assert info["student_arch"] == "mlp" and info["bn_layers"] == 0
        assert info["pool_size"] == 32 and len(info["student_loss"]) == 2
