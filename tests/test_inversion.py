"""F-ADI and F-DAFL: the image prior, the BN term's first-layer weight, the DAFL terms, and
end-to-end runs."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from helpers import run_config
from oneshotfl.functional import total_variation_l2
from oneshotfl.methods import parse_method_spec
from oneshotfl.methods.inversion import DAFL, DeepInversion, FADIConfig, FDAFLConfig, InputBatch
from oneshotfl.models import create_model
from oneshotfl.training.synthesis_terms import BatchNormStatistics

VARIANTS = [
    "f_adi:images=16:steps=3:distill_steps=4",
    "f_adi:images=16:steps=3:distill_steps=4:bn=deepinversion:distill_batch=4",
    "f_dafl:rounds=3:batch_size=16:width=4:noise_dim=8",
    "f_dafl:rounds=3:batch_size=16:width=4:noise_dim=8:normalise=true",
]


def test_total_variation_by_hand() -> None:
    x = torch.tensor([[[[0.0, 1.0], [2.0, 4.0]]]])
    # horizontal (−1, −2), vertical (−2, −3), the two diagonals (2 − 1 = 1) and (0 − 4 = −4)
    want = math.hypot(1, 2) + math.hypot(2, 3) + 1.0 + 4.0
    assert float(total_variation_l2(x)) == pytest.approx(want)


def bn_teacher() -> nn.Module:
    torch.manual_seed(0)
    t = nn.Sequential(nn.BatchNorm2d(1), nn.Conv2d(1, 1, 1), nn.BatchNorm2d(1), nn.Flatten(),
                      nn.Linear(4, 3))  # fmt: skip
    return t.eval()


def test_the_first_bn_layer_of_each_teacher_is_weighted() -> None:
    teachers = [bn_teacher(), bn_teacher()]
    with BatchNormStatistics(teachers) as bn:
        x = torch.randn(8, 1, 2, 2) * 3 + 1
        with torch.no_grad():
            for t in teachers:
                t(x)
        plain, weighted = float(bn.loss()), float(bn.loss(first=10.0))
        assert bn.layers == 4
        first = [float(v) for i, v in bn._terms.items() if i in {0, 2}]
        assert weighted == pytest.approx(plain + 9 * sum(first), rel=1e-5)


def test_fadi_uses_the_bn_term_only_in_the_deepinversion_reading() -> None:
    teachers = [bn_teacher()]
    x, y = torch.randn(8, 1, 2, 2) * 5, torch.randint(3, (8,))
    with BatchNormStatistics(teachers) as bn:
        losses = {}
        for reading in ("code", "deepinversion"):
            problem = DeepInversion(teachers, bn, FADIConfig(bn=reading), 3)
            losses[reading] = float(problem.generator_loss(x, y, nn.Identity()).detach())
    assert losses["deepinversion"] > losses["code"] + 0.01


def test_input_batch_is_its_own_parameter() -> None:
    batch = InputBatch((4, 1, 2, 2), torch.Generator().manual_seed(0))
    assert batch(torch.zeros(4, 1)) is batch.images


def test_dafl_entropy_term_rewards_balanced_predictions() -> None:
    teacher = create_model("mlp", 1, 3, 4).eval()
    problem = DAFL([teacher], BatchNormStatistics([]), FDAFLConfig(one_hot=0, activation=0), 3)
    with torch.no_grad():
        x = torch.randn(64, 1, 4, 4)
        loss = float(problem.generator_loss(x, torch.zeros(64, dtype=torch.long), teacher))
    assert loss >= 5 * -math.log10(3) - 1e-6  # 5·Σ p̄ log10 p̄ ≥ −5·log10 C


def test_every_variant_runs_data_free(tiny_config: Any) -> None:
    cfg = tiny_config(methods=VARIANTS, model="cnn,mlp,cnn", server_model="mlp")
    rows = {m["key"]: m for m in run_config(cfg)["methods"]}
    for key in (parse_method_spec(v).key for v in VARIANTS):
        assert 0.0 <= rows[key]["accuracy"] <= 1.0
        assert rows[key]["diagnostics"]["student_arch"] == "mlp"
