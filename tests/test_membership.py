"""The membership-inference audit: its metrics by hand, its attacks on real uploads."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from helpers import prepare
from oneshotfl.methods import build_method
from oneshotfl.payload import Payload
from oneshotfl.security.membership import (
    AuditConfig,
    audit_client,
    fit_logistic,
    label_matched,
    roc_auc,
    tpr_at_fpr,
    upload_kind,
)


def test_auc_and_tpr_at_fpr_by_hand() -> None:
    assert roc_auc(torch.tensor([3.0, 2.0]), torch.tensor([1.0, 2.0])) == 0.875
    others, members = torch.arange(100.0), torch.arange(50.0, 150.0)
    assert tpr_at_fpr(members, others, 0.01) == 0.51  # threshold 98: one non-member above
    assert tpr_at_fpr(members, others, 0.001) == 0.50  # none above: threshold 99


def test_label_matched_draws_the_histogram_and_skips_the_excluded() -> None:
    wanted = torch.tensor([0, 0, 1, 2, 2, 2])
    pool = torch.tensor([0, 1, 2, 0, 1, 2, 0, 2, 2, 2])
    picked = label_matched(wanted, pool, np.random.default_rng(0), exclude={2})
    assert sorted(pool[picked].tolist()) == [0, 0, 1, 2, 2, 2] and 2 not in picked.tolist()


def test_the_logistic_attack_separates_what_is_separable() -> None:
    gen = torch.Generator().manual_seed(0)
    inside, outside = torch.randn(200, 4, generator=gen) + 2, torch.randn(200, 4, generator=gen)
    score = fit_logistic(inside, outside)
    assert roc_auc(score(inside), score(outside)) > 0.95


def test_upload_kinds() -> None:
    z = np.zeros((2, 3), np.float32)
    assert upload_kind(Payload({"latents": z, "head.w": z})) == "latents"
    assert upload_kind(Payload({"probs": z})) == "predictions"
    assert upload_kind(Payload({"model.head.weight": z})) == "model"


def test_an_overfit_model_and_raw_latents_give_their_members_away(tiny_config: Any) -> None:
    cfg = tiny_config(
        clients=2, partition="iid", local_epochs=30, public_size=100, encoder="random:dim=16",
        max_train=300, methods=["fedavg"],
    )  # fmt: skip
    exp = prepare(cfg)
    audit = AuditConfig(candidates=60, shadows=2, surrogate_epochs=2)
    ctx = exp.client_context(0)
    model = audit_client(build_method("fedavg"), ctx, exp.data.test, audit)
    assert model["loss_auc"] > 0.6 and model["shadow_auc"] > 0.6
    latents = audit_client(build_method("fedage"), ctx, exp.data.test, audit)
    assert latents["nearest_auc"] > 0.99 and latents["nearest_tpr"] > 0.9
    predictions = audit_client(build_method("feddf:form=predictions"), ctx, exp.data.test, audit)
    assert set(predictions) >= {"loss_auc", "loss_tpr", "shadow_auc", "shadow_tpr"}
    assert model["members"] == model["non_members"] == 60
