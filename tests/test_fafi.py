"""FAFI: the supervised contrastive term is SimCLR's NT-Xent when each class is one example's
two views, an anchor with no positive is left out, the fused classifier predicts as the
size-weighted logit ensemble with the averaged prototypes, the views are drawn per batch or
per image, and the method learns small data and sends one model's bytes."""

from __future__ import annotations

from typing import Any, Literal

import pytest
import torch

import oneshotfl
from oneshotfl.data.types import TaskInfo
from oneshotfl.encoders.pretrain import nt_xent
from oneshotfl.methods.fafi import FafiConfig, FusedPrototypes, supcon_loss, two_views
from oneshotfl.models import create_model


def test_supcon_with_one_example_a_class_is_nt_xent_and_a_lone_anchor_is_left_out() -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(6, 5, generator=gen), torch.randn(6, 5, generator=gen)
    z = torch.nn.functional.normalize(torch.cat([a, b]), dim=1)
    ids = torch.arange(6).repeat(2)  # each "class" is one example's two views
    assert torch.allclose(supcon_loss(z, ids, 0.5), nt_xent(a, b, 0.5), atol=1e-6)
    # a row whose class no other row has: a negative to the others, itself counted as 0
    lone = torch.nn.functional.normalize(torch.randn(1, 5, generator=gen), dim=1)
    with_lone = torch.cat([z, lone])
    labels = torch.cat([ids, torch.tensor([99])])
    sim = with_lone @ with_lone.T / 0.5
    sim.fill_diagonal_(float("-inf"))
    log_prob = sim.log_softmax(1)
    want = -torch.stack([log_prob[i, (i + 6) % 12] for i in range(12)]).sum() / 13  # lone: 0
    assert torch.allclose(supcon_loss(with_lone, labels, 0.5), want, atol=1e-6)


def test_the_fused_classifier_predicts_as_the_weighted_logit_ensemble_with_mean_prototypes() -> (
    None
):
    torch.manual_seed(0)
    members = [create_model("mlp", 1, 4, 8) for _ in range(3)]
    prototypes = torch.stack([m.head.weight.detach() for m in members]).mean(0)
    weights = torch.tensor([10.0, 30.0, 60.0])
    fused = FusedPrototypes(members, weights, prototypes).eval()
    x = torch.randn(50, 1, 8, 8)
    with torch.no_grad():
        logits = sum(
            w * m.forward_features(x) @ prototypes.T for w, m in zip(weights, members, strict=True)
        )
        assert torch.equal(fused(x).argmax(1), torch.as_tensor(logits).argmax(1))
        assert torch.allclose(fused.weights.sum(), torch.tensor(1.0))


@pytest.mark.parametrize("draw", ["batch", "image"])
def test_views_are_drawn_per_batch_or_per_image(draw: Literal["batch", "image"]) -> None:
    task = TaskInfo("digits", 10, 1, 8)
    x = torch.rand(1, 1, 8, 8).repeat(4, 1, 1, 1)  # four copies of one image
    views = two_views(x, task, torch.Generator().manual_seed(1), FafiConfig(draw=draw))
    assert views.shape == (8, 1, 8, 8)
    same = all(torch.equal(views[0], views[i]) for i in range(1, 4))
    assert same == (draw == "batch")
    assert not torch.equal(views[0], views[4])  # the two views differ


def test_fafi_learns_small_data_and_sends_one_models_bytes(tiny_config: Any) -> None:
    cfg = tiny_config(methods=["fafi:crop_area=0.6", "ensemble"], model="cnn", local_epochs=3)
    result = oneshotfl.run(cfg)
    by_key = {m.key: m for m in result.methods}
    fafi, ensemble = by_key["fafi:crop_area=0.6"], by_key["ensemble"]
    assert fafi.accuracy > 0.5, fafi.accuracy
    assert fafi.upload_bytes_mean == ensemble.upload_bytes_mean
    with pytest.raises(ValueError, match="crop_area: expected in"):
        FafiConfig(crop_area=0.0)
