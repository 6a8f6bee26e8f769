"""Iterative magnitude pruning inside the client's epoch budget."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch
from torch import nn

from oneshotfl.seeding import seeded_torch, torch_generator
from oneshotfl.training.pruning import MagnitudePruner, PruningError, PruningSchedule

CONV = [0.5, -0.1, 0.9, -0.3]  # |w| ranks: 0.1 < 0.3 < 0.5 < 0.9
LINEAR = [[0.2, -0.05, 0.7], [-0.6, 0.4, 0.01]]  # 0.01 < 0.05 < 0.2 < 0.4 < 0.6 < 0.7


class Tiny(nn.Module):
    """Conv2d(1→1, 2×2) + BatchNorm + Linear(3→2) with hand-set weights (10 prunable)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 2)
        self.bn = nn.BatchNorm2d(1)
        self.fc = nn.Linear(3, 2)
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor(CONV).view(1, 1, 2, 2))
            self.fc.weight.copy_(torch.tensor(LINEAR))
            self.conv.bias.fill_(1e-6)  # tiny, so they would go first if they were prunable
            self.fc.bias.fill_(-1e-6)
            self.bn.weight.fill_(1e-7)
            self.bn.bias.fill_(1e-7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.bn(self.conv(x)).flatten(1).expand(-1, 3))


def schedule(**kw: Any) -> PruningSchedule:
    values: dict[str, Any] = {
        "stages": 2,
        "epochs_per_stage": 1,
        "finetune_epochs": 0,
        "sparsity": 0.5,
    }
    return PruningSchedule(**{**values, **kw})


def pruned(pruner: MagnitudePruner) -> dict[str, list[bool]]:
    return {name: (~mask).flatten().tolist() for name, mask in pruner.masks.items()}


def test_schedule_stage_arithmetic() -> None:
    s = PruningSchedule(stages=3, epochs_per_stage=2, finetune_epochs=1, sparsity=0.5)
    assert s.total_epochs == 7
    assert [s.prune_after_epoch(e) for e in range(9)] == [
        None,
        1,
        None,
        2,
        None,
        3,
        None,
        None,
        None,
    ]
    one = PruningSchedule(stages=1, epochs_per_stage=1, finetune_epochs=0, sparsity=0.0)
    assert one.total_epochs == 1 and one.prune_after_epoch(0) == 1


def test_geometric_and_linear_targets() -> None:
    geo = schedule(stages=4, sparsity=0.75)
    lin = schedule(stages=4, sparsity=0.75, schedule="linear")
    expected_geo = [1 - 0.25**0.25, 0.5, 1 - 0.25**0.75, 0.75]
    assert [geo.sparsity_after(k) for k in range(1, 5)] == pytest.approx(expected_geo)
    assert [lin.sparsity_after(k) for k in range(1, 5)] == pytest.approx(
        [0.1875, 0.375, 0.5625, 0.75]
    )
    assert schedule(stages=3, sparsity=0.3).sparsity_after(3) == 0.3  # exact at the last stage
    # geometric: every stage keeps the same fraction of what was left
    kept = [1.0] + [1 - geo.sparsity_after(k) for k in range(1, 5)]
    assert [b / a for a, b in itertools.pairwise(kept)] == pytest.approx([0.25**0.25] * 4)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("stages", 0, "stages: expected an int >= 1, got 0"),
        ("stages", True, "stages: expected an int >= 1, got True"),
        ("epochs_per_stage", 0, "epochs_per_stage: expected an int >= 1, got 0"),
        ("finetune_epochs", -1, "finetune_epochs: expected an int >= 0, got -1"),
        ("sparsity", 1.0, r"sparsity: expected a number in \[0, 1\), got 1.0"),
        ("sparsity", -0.1, r"sparsity: expected a number in \[0, 1\), got -0.1"),
        ("sparsity", "0.5", r"sparsity: expected a number in \[0, 1\), got '0.5'"),
        ("schedule", "cosine", "schedule: expected one of geometric|linear, got 'cosine'"),
        ("scope", "net", "scope: expected one of global|layer, got 'net'"),
    ],
)
def test_schedule_validation(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        schedule(**{field: value})
    assert issubclass(PruningError, ValueError)


def test_stage_and_epoch_range_errors() -> None:
    s = schedule(stages=2)
    with pytest.raises(ValueError, match=r"stage: expected an int in 1\.\.2, got 3"):
        s.sparsity_after(3)
    with pytest.raises(ValueError, match=r"stage: expected an int in 1\.\.2, got 0"):
        s.sparsity_after(0)
    with pytest.raises(ValueError, match="epoch: expected an int >= 0, got -1"):
        s.prune_after_epoch(-1)
    with pytest.raises(PruningError, match="expected a Conv1d/2d/3d or Linear weight, got none"):
        MagnitudePruner(nn.Sequential(nn.BatchNorm1d(3), nn.ReLU()), s)


def test_global_scope_hand_computed_masks() -> None:
    pruner = MagnitudePruner(Tiny(), schedule(stages=2, sparsity=0.5))
    assert all(m.all() for m in pruner.masks.values())
    pruner.prune(1)  # 1 - 0.5**0.5 = 0.293 of 10 → 3: 0.01, 0.05, 0.1
    assert pruned(pruner) == {
        "conv.weight": [False, True, False, False],
        "fc.weight": [False, True, False, False, False, True],
    }
    pruner.prune(2)  # 0.5 of 10 → 5: also 0.2 and 0.3
    assert pruned(pruner) == {
        "conv.weight": [False, True, False, True],
        "fc.weight": [True, True, False, False, False, True],
    }
    assert pruner.model.conv.weight.flatten().tolist() == pytest.approx([0.5, 0, 0.9, 0])
    assert pruner.sparsity() == 0.5


def test_layer_scope_hand_computed_masks() -> None:
    pruner = MagnitudePruner(Tiny(), schedule(stages=2, sparsity=0.5, scope="layer"))
    pruner.prune(1)  # conv: round(0.293·4) = 1 → 0.1; fc: round(0.293·6) = 2 → 0.01, 0.05
    assert pruned(pruner) == {
        "conv.weight": [False, True, False, False],
        "fc.weight": [False, True, False, False, False, True],
    }
    pruner.prune(2)  # conv 2 → 0.1, 0.3; fc 3 → 0.01, 0.05, 0.2
    assert pruned(pruner) == {
        "conv.weight": [False, True, False, True],
        "fc.weight": [True, True, False, False, False, True],
    }
    assert pruner.report()["layers"] == {"conv.weight": 0.5, "fc.weight": 0.5}


def test_ties_go_to_the_lower_index() -> None:
    model = nn.Linear(5, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -1.0, 2.0, 1.0, -1.0]]))
    pruner = MagnitudePruner(model, schedule(stages=1, sparsity=0.4))
    pruner.prune(1)
    assert pruned(pruner) == {"weight": [True, True, False, False, False]}


def test_apply_keeps_pruned_weights_zero_after_sgd_step() -> None:
    model = Tiny()
    pruner = MagnitudePruner(model, schedule(stages=1, sparsity=0.5))
    pruner.prune(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    for _ in range(2):
        opt.zero_grad()
        (-(model.conv.weight.sum() + model.fc.weight.sum())).backward()  # moves every weight
        opt.step()
        assert (model.conv.weight[~pruner.masks["conv.weight"]] != 0).all()  # revived by SGD
        pruner.apply()
        assert (model.conv.weight[~pruner.masks["conv.weight"]] == 0).all()
        assert (model.fc.weight[~pruner.masks["fc.weight"]] == 0).all()
        assert (model.fc.weight[pruner.masks["fc.weight"]] != 0).all()
    assert pruner.sparsity() == 0.5


def test_pruned_weights_are_never_revived_across_stages() -> None:
    model = Tiny()
    pruner = MagnitudePruner(model, schedule(stages=2, sparsity=0.5))
    pruner.prune(1)
    first = {name: ~mask for name, mask in pruner.masks.items()}
    with torch.no_grad():  # pruned weights grow huge before apply(); kept ones shrink
        model.conv.weight.mul_(0.001).add_(100.0 * first["conv.weight"])
        model.fc.weight.mul_(0.001).add_(100.0 * first["fc.weight"])
    pruner.prune(2)
    for name, was in first.items():
        assert (~pruner.masks[name])[was].all()
    assert sum(int((~m).sum()) for m in pruner.masks.values()) == 5
    assert pruner.sparsity() == 0.5
    pruner.prune(1)  # an earlier stage changes nothing
    assert sum(int((~m).sum()) for m in pruner.masks.values()) == 5


def test_state_dict_biases_and_batchnorm_untouched() -> None:
    model = Tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pruner = MagnitudePruner(model, schedule(stages=1, sparsity=0.9))
    pruner.prune(1)
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(after[k].shape == v.shape and after[k].dtype == v.dtype for k, v in before.items())
    for key in before:
        if key not in ("conv.weight", "fc.weight"):
            assert torch.equal(after[key], before[key]), key
    assert type(model.conv) is nn.Conv2d and not model.conv._forward_pre_hooks
    assert pruner.sparsity() == 0.9


def test_measured_sparsity_matches_target_count_every_stage() -> None:
    with seeded_torch(0, "test", "pruning"):
        model = nn.Sequential(nn.Conv1d(3, 5, 3), nn.ReLU(), nn.Flatten(), nn.Linear(30, 7))
    sched = schedule(stages=3, sparsity=0.8)
    pruner = MagnitudePruner(model, sched)
    n = 5 * 3 * 3 + 30 * 7
    for stage in (1, 2, 3):
        pruner.prune(stage)
        zeros = round(sched.sparsity_after(stage) * n)
        assert pruner.sparsity() == zeros / n
    report = pruner.report()
    assert report["prunable_params"] == n
    assert report["total_params"] == n + 5 + 7
    assert report["nonzero_params"] == n - round(0.8 * n) + 12
    assert report["target"] == 0.8 and report["stage"] == 3 and report["stage_target"] == 0.8
    assert report["sparsity"] == round(0.8 * n) / n


def test_short_training_run_ends_at_target_sparsity() -> None:
    with seeded_torch(0, "test", "pruning", "train"):
        model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    sched = PruningSchedule(stages=2, epochs_per_stage=2, finetune_epochs=1, sparsity=0.6)
    pruner = MagnitudePruner(model, sched)
    gen = torch_generator(0, "test", "pruning", "data")
    x, y = torch.randn(64, 8, generator=gen), torch.randint(0, 3, (64,), generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    stages = []
    for epoch in range(sched.total_epochs):
        for batch in torch.arange(64).split(16):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
            opt.step()
            pruner.apply()
        stages.append(pruner.on_epoch_end(epoch))
    assert stages == [None, 1, None, 2, None]
    n = 8 * 16 + 16 * 3
    assert pruner.sparsity() == round(0.6 * n) / n
    with torch.no_grad():
        assert math.isfinite(float(nn.functional.cross_entropy(model(x), y)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_masks_follow_the_model_to_cuda() -> None:
    model = Tiny()
    pruner = MagnitudePruner(model, schedule(stages=2, sparsity=0.5))
    pruner.prune(1)
    model.cuda()
    pruner.prune(2)
    assert all(m.device.type == "cuda" for m in pruner.masks.values())
    assert pruned(pruner)["fc.weight"] == [True, True, False, False, False, True]
    assert pruner.sparsity() == 0.5
