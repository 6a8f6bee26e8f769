"""FedOV and FedEOV: the vote and Theorem 2 by hand, the negatives (FGSM, jigsaw, corruptions),
the curricula of both readings, pruning inside the budget, the disjoint partition and the
methods end to end (locally and relayed through Flower's ClientApp)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.data.partition import make_partitioner
from oneshotfl.functional import abstention_weighted_ensemble
from oneshotfl.methods.fedeov import FedEOVConfig, curriculum, stage_negatives
from oneshotfl.methods.fedov import runner_up_unknown_loss
from oneshotfl.models import create_model
from oneshotfl.training.components import sign_gradient_steps
from oneshotfl.training.negatives import corrupt, jigsaw, rotate_square
from oneshotfl.training.pruning import MagnitudePruner, PruningSchedule


def _logits(probs: list[list[float]]) -> torch.Tensor:
    """Per member one row of probabilities → logits [M, 1, C+1] with exactly that softmax."""
    return torch.tensor(probs, dtype=torch.float64).log().unsqueeze(1)


def test_theorem_2_weights_each_member_by_one_minus_its_unknown_probability() -> None:
    # 3 clients, C = 2 known classes + unknown (last)
    probs = [[0.6, 0.2, 0.2], [0.1, 0.1, 0.8], [0.05, 0.45, 0.5]]
    out = abstention_weighted_ensemble(_logits(probs)).double()
    alpha = [0.8, 0.2, 0.5]
    f = [[0.75, 0.25], [0.5, 0.5], [0.1, 0.9]]  # each member's known-class distribution
    expect = [sum(a * fc[k] for a, fc in zip(alpha, f, strict=True)) / sum(alpha) for k in (0, 1)]
    assert out[0].tolist() == pytest.approx(expect, abs=1e-6)  # [0.6333, 0.3667]


def test_the_top_k_vote_discards_the_members_most_sure_of_unknown() -> None:
    probs = [[0.6, 0.2, 0.2], [0.1, 0.1, 0.8], [0.05, 0.45, 0.5]]
    out = abstention_weighted_ensemble(_logits(probs), accepted=2).double()
    # member 1 (p_unknown 0.8) is discarded: (0.6 + 0.05, 0.2 + 0.45) / 1.3
    assert out[0].tolist() == pytest.approx([0.65 / 1.3, 0.65 / 1.3], abs=1e-6)
    one = abstention_weighted_ensemble(_logits(probs), accepted=1).double()
    assert one[0].tolist() == pytest.approx([0.75, 0.25], abs=1e-6)
    every = abstention_weighted_ensemble(_logits(probs), accepted=3)
    assert torch.allclose(every, abstention_weighted_ensemble(_logits(probs)))


def test_members_certain_of_unknown_give_a_uniform_row_not_nan() -> None:
    logits = torch.tensor([[[-1e4, -1e4, 0.0]], [[-1e4, -1e4, 0.0]]])
    assert abstention_weighted_ensemble(logits).tolist() == [[0.5, 0.5]]
    with pytest.raises(ValueError, match="accepted >= 1"):
        abstention_weighted_ensemble(logits, accepted=0)


def test_targeted_fgsm_lowers_the_loss_of_the_target_class() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 5)).eval()
    x, target = torch.randn(32, 1, 4, 4), torch.full((32,), 3)
    before = F.cross_entropy(model(x), target, reduction="none")
    adv = sign_gradient_steps(model, x, target, step=0.05, steps=3, epsilon=0.1, targeted=True)
    after = F.cross_entropy(model(adv), target, reduction="none")
    assert bool((after < before).all())
    assert float((adv - x).abs().max()) <= 0.1 + 1e-6
    away = sign_gradient_steps(model, x, target, step=0.05, steps=3, epsilon=0.1)
    assert bool((F.cross_entropy(model(away), target, reduction="none") > before).all())


def _patches(img: torch.Tensor, grid: int) -> list[bytes]:
    _, h, w = img.shape
    ph, pw = h // grid, w // grid
    return sorted(
        img[:, i * ph : (i + 1) * ph, j * pw : (j + 1) * pw].numpy().tobytes()
        for i in range(grid)
        for j in range(grid)
    )


def test_jigsaw_without_smoothing_permutes_the_patches_and_never_leaves_the_image_as_is() -> None:
    x = torch.randn(64, 3, 12, 12)
    out = jigsaw(x, 4, torch.Generator().manual_seed(1), smooth=False)
    for a, b in zip(x, out, strict=True):
        assert _patches(a, 4) == _patches(b, 4)
        assert not torch.equal(a, b)
    smooth = jigsaw(x, 4, torch.Generator().manual_seed(1), smooth=True)
    # a corner pixel is never on a seam band
    assert torch.equal(smooth[..., 0, 0], out[..., 0, 0])
    assert not torch.equal(smooth, out)


@pytest.mark.parametrize("turns", [1, 2, 3])
def test_rotate_square_turns_the_square_like_rot90(turns: int) -> None:
    img = torch.arange(36.0).view(1, 1, 6, 6)
    rows = torch.arange(6).view(6, 1).expand(6, 6).clone()
    cols = torch.arange(6).view(1, 6).expand(6, 6).clone()
    rotate_square(rows, cols, 1, 2, 3, turns)
    out = img[0, 0][rows, cols]
    expect = img[0, 0].clone()
    expect[1:4, 2:5] = torch.rot90(img[0, 0, 1:4, 2:5], turns)
    assert torch.equal(out, expect)


@pytest.mark.parametrize("style", ["fedeov", "fedov"])
def test_corruptions_are_seeded_finite_and_change_the_images(style: str) -> None:
    x = torch.randn(70, 1, 16, 16)
    a = corrupt(x, style, torch.Generator().manual_seed(3))
    b = corrupt(x, style, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.shape == x.shape and bool(torch.isfinite(a).all())
    changed = (a - x).abs().flatten(1).amax(1) > 0
    assert float(changed.double().mean()) > 0.9  # a cut onto itself may leave an image as is
    with pytest.raises(ValueError, match="style"):
        corrupt(x, "other", torch.Generator())


def test_the_defaults_are_the_three_step_fgsm_and_the_codes_top5_vote() -> None:
    cfg = FedEOVConfig()  # issue 27: the L-inf reach of 15 x 0.002; the vote of the paper
    assert (cfg.fgsm_warmup_steps, cfg.fgsm_steps, cfg.fgsm_step) == (1, 3, 0.01)
    assert cfg.fgsm_steps * cfg.fgsm_step == pytest.approx(15 * 0.002)
    assert cfg.accepted_votes == 5


def test_the_code_curriculum_with_two_epochs_is_plain_negatives_then_everything() -> None:
    cfg = FedEOVConfig(fgsm_warmup_steps=5, fgsm_steps=15)  # distinct counts (the code's)
    specs = curriculum(cfg, 2)
    assert [(s.start_epoch, s.stop_epoch) for s in specs] == [(0, 1), (1, 2)]
    first, second = (dict(s.params) for s in specs)
    assert first["jigsaw"] is False and "fgsm_steps" not in first
    assert second["jigsaw"] is True and second["fgsm_steps"] == 15
    # E = 8: one epoch per stage 0, 1, 2, then jigsaw for five epochs
    steps = [stage_negatives(cfg, e, 8) for e in range(8)]
    assert [s.get("fgsm_steps", 0) for s in steps if s] == [0, 5, 15, 15, 15, 15, 15, 15]
    assert [bool(s and s["jigsaw"]) for s in steps] == [False] * 3 + [True] * 5
    assert [(s.start_epoch, s.stop_epoch) for s in curriculum(cfg, 8, 4)] == [
        (4, 5),
        (5, 6),
        (6, 7),
        (7, 12),
    ]


def test_the_paper_curriculum_is_three_thirds_and_every_stage_can_be_switched_off() -> None:
    cfg = FedEOVConfig(schedule="paper", fgsm_warmup_steps=5, fgsm_steps=15)
    stages = [stage_negatives(cfg, e, 6) for e in range(6)]
    assert [bool(s and s["corrupt"]) for s in stages] == [True] * 4 + [False] * 2
    assert [s.get("fgsm_steps", 0) for s in stages if s] == [0, 0, 5, 15, 0, 0]
    assert [bool(s and s["jigsaw"]) for s in stages] == [False] * 4 + [True] * 2
    no_adv = dataclasses.replace(cfg, adversarial=False)
    assert all("fgsm_steps" not in (stage_negatives(no_adv, e, 6) or {}) for e in range(6))
    only_jigsaw = FedEOVConfig(corrupt=False)
    assert stage_negatives(only_jigsaw, 0, 2) is None
    with pytest.raises(ValueError, match="corrupt/jigsaw"):
        FedEOVConfig(corrupt=False, jigsaw=False)


def test_the_runner_up_term_pushes_unknown_to_second_place() -> None:
    logits = torch.tensor([[5.0, 0.0, 0.0], [0.0, 4.0, 0.0], [0.0, 0.0, 9.0]])
    y = torch.tensor([0, 1, 2])  # the last row is a negative (label 2 = unknown): ignored
    masked = torch.tensor([[-1e4, 0.0, 0.0], [0.0, -1e4, 0.0]])
    expect = F.cross_entropy(masked, torch.tensor([2, 2]))
    assert float(runner_up_unknown_loss(logits, y, 2)) == pytest.approx(float(expect))


def test_pruning_in_the_budget_reaches_the_sparsity_and_pruned_weights_stay_zero() -> None:
    torch.manual_seed(0)
    model = create_model("cnn", 1, 4, 8)
    schedule = PruningSchedule(1, 1, 1, 0.5, scope="layer", rewind=True, keep_head=True)
    pruner = MagnitudePruner(model, schedule)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    x, y = torch.randn(32, 1, 8, 8), torch.randint(0, 4, (32,))

    def epoch() -> None:
        for _ in range(5):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            pruner.apply()

    epoch()
    pruner.on_epoch_end(0)
    report = pruner.report()
    assert "head.weight" not in report["layers"]
    assert all(abs(s - 0.5) < 0.01 for s in report["layers"].values())
    for name, mask in pruner.masks.items():  # rewound: kept weights are back at θ⁰
        w = model.state_dict()[name]
        assert torch.equal(w[mask], initial[name][mask])
    pruned = {n: ~m.clone() for n, m in pruner.masks.items()}
    epoch()  # fine-tuning with the masks
    for name, zero in pruned.items():
        assert bool((model.state_dict()[name][zero] == 0).all())
    assert pruner.sparsity() == pytest.approx(0.5, abs=0.01)
    with pytest.raises(ValueError, match="finetune_epochs"):
        PruningSchedule(1, 1, 0, 0.5, rewind=True)


@pytest.mark.parametrize(("clients", "per_client"), [(5, 2), (10, 1), (20, 1)])
def test_disjoint_matches_the_reference_semantics(clients: int, per_client: int) -> None:
    labels = np.repeat(np.arange(10), 30)
    parts = make_partitioner("disjoint").split(labels, clients, np.random.default_rng(0))
    classes = [set(labels[p].tolist()) for p in parts]
    assert all(len(c) == per_client for c in classes)
    assert sorted(np.concatenate(parts).tolist()) == list(range(300))  # all, once
    if clients <= 10:
        assert all(a.isdisjoint(b) for i, a in enumerate(classes) for b in classes[i + 1 :])
    else:  # two clients per class, its examples split in half
        holders = {c: [k for k, s in enumerate(classes) if c in s] for c in range(10)}
        assert all(len(h) == 2 for h in holders.values())
        assert all(len(p) == 15 for p in parts)
    with pytest.raises(ValueError, match="multiple of 10"):
        make_partitioner("disjoint").split(labels, 15, np.random.default_rng(0))


OPEN_SET = [  # parameters in sorted order: the result keys are canonical
    "fedov:fgsm_steps=1",
    "fedeov:accepted_votes=2:fgsm_steps=2:fgsm_warmup_steps=1",
    "fedeov_pruned:fgsm_steps=1:fgsm_warmup_steps=1",
    "fedeov_distilled:accepted_votes=2:distill_epochs=1:fgsm_steps=2:fgsm_warmup_steps=1",
]


def open_set_config(tiny_config: Any) -> Any:
    return tiny_config(
        methods=OPEN_SET, model="cnn", partition="disjoint", public_size=200, local_epochs=2
    )


@pytest.mark.xdist_group("open-set")  # with test_flower's: one worker makes the run once
def test_every_variant_runs_and_reports_what_it_is(open_set_run: tuple[Any, Any]) -> None:
    _, doc = open_set_run  # conftest.py: run_config(open_set_config(...)), made once a session
    rows = {m["key"]: m for m in doc["methods"]}
    assert set(rows) == set(OPEN_SET)
    for row in rows.values():
        assert 0.0 <= row["accuracy"] <= 1.0 and not math.isnan(row["accuracy"])
    pruned = rows[OPEN_SET[2]]
    facts = pruned["client_facts"]
    assert all(s == pytest.approx(0.5, abs=0.02) for s in facts["sparsity"])
    assert all(s < d for s, d in zip(facts["flops_sparse"], facts["flops_dense"], strict=True))
    assert rows[OPEN_SET[1]]["diagnostics"]["accepted_votes"] == 2


@pytest.mark.parametrize("bn", ["eval", "code"])
def test_only_the_code_reading_lets_the_attack_move_batchnorm_statistics(bn: str) -> None:
    from oneshotfl.training.components import ComponentEnv
    from oneshotfl.training.negatives import Negatives, NegativesConfig

    torch.manual_seed(0)
    model = create_model("simple_cnn2", 1, 4, 16).train()
    env = ComponentEnv(3, 1, torch.Generator().manual_seed(0))
    component = Negatives(NegativesConfig(fgsm_steps=2, bn=bn), env)
    before = model.conv[1].running_mean.clone()
    x, y = torch.randn(8, 1, 16, 16), torch.zeros(8, dtype=torch.long)
    neg, labels = component.extra_examples(model, x, y)
    assert neg.shape == x.shape and bool((labels == 3).all()) and model.training
    moved = not torch.equal(model.conv[1].running_mean, before)
    assert moved == (bn == "code")
