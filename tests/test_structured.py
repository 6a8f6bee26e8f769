"""Structured pruning: channel groups, the group-lasso proximal step, physical removal."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from oneshotfl.models import create_model
from oneshotfl.seeding import seeded_torch
from oneshotfl.training.structured import (
    StructureError,
    channel_groups,
    group_lasso_prox,
    group_norms,
    kept_units,
    remove_groups,
)

ARCHS = ["cnn", "mlp", "resnet8", "vgg", "simple_cnn2", "mobilenetv2"]


def _model(arch: str) -> nn.Module:
    with seeded_torch(0, "structured", arch):
        model = create_model(arch, 1, 10, 28)
        x = torch.randn(16, 1, 28, 28)
    model.train()
    model(x)  # moves the BatchNorm running statistics off their defaults
    return model.eval()


def test_groups_follow_only_single_channel_wise_paths() -> None:
    resnet = {g.producer for g in channel_groups(_model("resnet8"))}
    assert resnet == {f"layers.{s}.0.conv1" for s in range(3)}  # block outputs feed additions
    cnn = channel_groups(_model("cnn"))
    assert [(g.producer, g.consumer) for g in cnn] == [
        ("conv.0", "conv.3"),
        ("conv.3", "fc.0"),
        ("fc.0", "fc.2"),
        ("fc.2", "head"),
    ]
    assert cnn[1].fan == 25  # 16 channels x a 5x5 map flattened channel-major into fc.0
    vgg = channel_groups(_model("vgg"))
    assert all(len(g.followers) == 1 for g in vgg[:4])  # each conv's BatchNorm
    assert all(g.producer != "head" for a in ARCHS for g in channel_groups(_model(a)))


def test_the_proximal_step_zeroes_whole_groups_and_only_shrinks_the_others() -> None:
    model = _model("vgg")
    groups = channel_groups(model)
    before = group_norms(model, groups)
    thresholds = [n.clone() for n in before]  # unit 0 of each layer: exactly its own norm
    for t in thresholds:
        t[1:] = t[1:] * 0.25
    group_lasso_prox(model, groups, thresholds)
    after = group_norms(model, groups)
    modules = dict(model.named_modules())
    for g, b, a in zip(groups, before, after, strict=True):
        assert a[0] == 0  # a whole group: conv filter and its BatchNorm weight and bias
        assert modules[g.producer].weight[0].abs().sum() == 0
        assert all(modules[f].weight[0] == 0 and modules[f].bias[0] == 0 for f in g.followers)
        torch.testing.assert_close(a[1:], b[1:] * 0.75)  # shrunk by the threshold, not zeroed


@pytest.mark.parametrize("arch", ARCHS)
def test_removing_zeroed_groups_leaves_the_outputs_unchanged(arch: str) -> None:
    model = _model(arch)
    groups = channel_groups(model)
    keep, thresholds = {}, []
    for k, norms in enumerate(group_norms(model, groups)):
        kept = kept_units(torch.rand(len(norms), generator=torch.Generator().manual_seed(k)), 0.5)
        keep[groups[k].producer] = kept
        t = torch.full_like(norms, float("inf"))
        t[kept] = 0.0
        thresholds.append(t)
    group_lasso_prox(model, groups, thresholds)
    smaller = remove_groups(model, groups, keep)
    size = sum(p.numel() for p in smaller.parameters())
    assert size < 0.8 * sum(p.numel() for p in model.parameters())
    with seeded_torch(1, "structured", "inputs"):
        x = torch.randn(8, 1, 28, 28)
    torch.testing.assert_close(smaller(x), model(x), atol=1e-5, rtol=1e-5)
    model.train()
    smaller.train()  # with batch statistics too: a zeroed unit outputs exactly zero
    torch.testing.assert_close(smaller(x), model(x), atol=1e-4, rtol=1e-4)


def test_kept_units_drop_the_smallest_and_never_all() -> None:
    norms = torch.tensor([0.5, 0.0, 2.0, 0.1])
    assert kept_units(norms, 0.5).tolist() == [0, 2]
    assert kept_units(norms, 0.99).tolist() == [2]
    assert kept_units(norms, 0.0).tolist() == [0, 1, 2, 3]


def test_bad_keep_indices_are_refused() -> None:
    model = _model("mlp")
    groups = channel_groups(model)
    with pytest.raises(StructureError, match="sorted distinct"):
        remove_groups(model, groups, {"features.1": torch.tensor([3, 1])})
    with pytest.raises(StructureError, match="sorted distinct"):
        remove_groups(model, groups, {"features.1": torch.tensor([], dtype=torch.long)})
    with pytest.raises(StructureError, match="producer"):
        remove_groups(model, groups, {"head": torch.tensor([0])})


def test_paths_a_removal_would_change_are_not_groups() -> None:
    class NonAffine(nn.Module):  # a BatchNorm without weight or bias: nothing to zero
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4, affine=False)
            self.out = nn.Conv2d(4, 2, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(self.bn(self.conv(x)))

    class Widthwise(nn.Module):  # a linear layer on an unflattened map acts on its width
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv2d(1, 4, 1), nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.conv(x))

    assert channel_groups(NonAffine()) == []
    assert channel_groups(Widthwise()) == []
