"""FOL: its four stages as pure functions, the peer method, its presets and Flower."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch
from torch import nn

from helpers import prepare, run_config
from oneshotfl.data.types import LabelledData
from oneshotfl.methods import build_method
from oneshotfl.methods.fol import Fol, FolConfig
from oneshotfl.methods.fol_stages import (
    align_prune,
    alignment_scores,
    encounter_schedule,
    ensemble_weights,
    regularised_distillation,
    top_k,
    validation_scores,
    weighted_logits,
)
from oneshotfl.models import create_model
from oneshotfl.runner.errors import RequirementError
from oneshotfl.seeding import seeded_torch, torch_generator
from oneshotfl.training.loop import TrainConfig
from oneshotfl.training.services import train_model
from oneshotfl.training.structured import channel_groups

FOL = "fol:rounds=2:kd_epochs=1:weight_steps=20"


def test_the_encounter_schedule_meets_each_neighbour_once_and_respects_q() -> None:
    neighbours = (1, 2, 3, 4, 5)
    windows = encounter_schedule(0, neighbours, 7, rounds=3, per_round=1, contact=1.0)
    assert [len(w) for w in windows] == [1, 1, 1]
    met = [s for w in windows for s in w]
    assert len(set(met)) == 3 and set(met) <= set(neighbours)
    # a shorter schedule is a prefix: E = 1's work is E = 3's first round
    assert encounter_schedule(0, neighbours, 7, 1, 1, 1.0) == windows[:1]
    everyone = encounter_schedule(0, neighbours, 7, rounds=2, per_round=0, contact=1.0)
    assert everyone == (neighbours, ())
    assert encounter_schedule(0, neighbours, 7, 3, 0, contact=1e-9) == ((), (), ())
    sparse = encounter_schedule(0, neighbours, 7, rounds=2, per_round=0, contact=0.5)
    assert 0 < len(sparse[0]) < len(neighbours)  # some neighbours out of range in round 1


def test_top_k_ranks_by_validation_score_and_breaks_ties_by_cosine() -> None:
    scores = torch.tensor([0.8, 0.9, 0.8, 0.5])
    cosines = torch.tensor([1.0, 0.2, 0.7, 0.9])
    assert top_k(scores, cosines, 3) == [1, 0, 2]
    assert top_k(scores, cosines, 0) == [1, 0, 2, 3]
    logits = torch.tensor([[[2.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]])
    assert validation_scores(logits, torch.tensor([0, 1])).tolist() == [1.0, 0.5]


def test_learned_weights_stay_on_the_simplex_and_beat_uniform_when_a_teacher_is_wrong() -> None:
    with seeded_torch(0, "fol", "weights"):
        y = torch.randint(0, 4, (200,))
        right = torch.nn.functional.one_hot(y, 4).float() * 3 + 0.5 * torch.randn(200, 4)
        wrong = torch.nn.functional.one_hot((y + 1) % 4, 4).float() * 3
    logits = torch.stack([right, wrong, right * 0.5])
    w = ensemble_weights(logits, y, steps=200, lr=0.05)
    assert torch.all(w >= 0) and torch.isclose(w.sum(), torch.tensor(1.0))
    assert w[1] < 0.05  # the wrong teacher is all but switched off

    def loss(weights: torch.Tensor) -> float:
        return float(torch.nn.functional.cross_entropy(weighted_logits(logits, weights), y))

    assert loss(w) < loss(torch.full((3,), 1 / 3)) - 0.5


def test_the_regulariser_pulls_the_student_toward_its_start_when_lambda_is_large() -> None:
    with seeded_torch(0, "fol", "kd"):
        student = create_model("mlp", 1, 10, 8)
        x = torch.randn(64, 1, 8, 8)
        teacher = torch.randn(64, 10) * 5
    start = [p.detach().clone() for p in student.parameters()]
    cfg = TrainConfig(epochs=5, batch_size=16, lr=0.05)

    def moved(lam: float) -> float:
        s = copy.deepcopy(student)
        regularised_distillation(
            s,
            x,
            teacher,
            temperature=2.0,
            lam=lam,
            cfg=cfg,
            generator=torch_generator(0, "kd"),
            device=torch.device("cpu"),
        )
        return sum(
            float((p.detach() - q).pow(2).sum()) for p, q in zip(s.parameters(), start, strict=True)
        )

    free, held = moved(0.0), moved(10.0)
    assert held < 0.05 * free


def test_align_prune_returns_a_smaller_dense_model_that_still_classifies() -> None:
    with seeded_torch(0, "fol", "prune"):
        model, own = create_model("cnn", 1, 4, 8), create_model("cnn", 1, 4, 8)
        x = torch.randn(96, 1, 8, 8)
        y = (x.mean((1, 2, 3)) > 0).long() + 2 * (x[:, 0, 0, 0] > 0).long()
    data = LabelledData(x, y)
    pruned, keep, report = align_prune(
        model,
        own,
        data,
        TrainConfig(epochs=2, batch_size=32, lr=0.05),
        gamma=0.01,
        lambda_p=0.1,
        ratio=0.5,
        probe=64,
        generator=torch_generator(0, "p"),
        device=torch.device("cpu"),
    )
    assert report["params_after"] < 0.6 * report["params_before"]
    assert 0.0 <= report["alignment"] <= 1.0
    assert keep["conv.0"].tolist() == sorted(keep["conv.0"].tolist()) and len(keep["conv.0"]) == 3
    assert pruned(x).shape == (96, 4)


def test_fol_personalises_every_client_from_models_only(tiny_config: Any, monkeypatch: Any) -> None:
    seen: list[tuple[int, int, list[str]]] = []
    original = Fol.aggregate_for

    def spy(self: Fol, ctx: Any, payloads: Any) -> Any:
        fields = sorted({k.split(".")[0] for p in payloads.values() for k in p.arrays})
        seen.append((ctx.client_id, len(ctx.data), fields))
        return original(self, ctx, payloads)

    monkeypatch.setattr(Fol, "aggregate_for", spy)
    cfg = tiny_config(
        methods=["local", FOL, "fol-an:rounds=2:kd_epochs=1:top_k=0:weights=uniform"],
        graph="ring",
        clients=4,
        val_fraction=0.2,
    )
    exp = prepare(cfg)
    doc = run_config(cfg)
    fol = doc["methods"][1]
    assert fol["outcome"] == "Personalised" and fol["clients_used"] == [0, 1, 2, 3]
    for client, size, fields in seen:
        assert size == len(exp.data.shard(client).train)  # its own data, nobody else's
        assert fields in ([], ["model"])  # neighbours sent models, never data
    rounds = fol["diagnostics"]["0"]["rounds"]
    assert [len(r["met"]) for r in rounds] == [1, 1]  # Q = 1 on a ring of degree 2
    assert all(len(r["top_k"]) <= 3 and abs(sum(r["weights"]) - 1) < 1e-3 for r in rounds)
    assert all(
        a["params_after"] < a["params_before"] for r in rounds for a in r["aligned"].values()
    )
    for receiver in range(4):  # the edges that carried bytes are the windows the receiver met
        met = {s for r in fol["diagnostics"][str(receiver)]["rounds"] for s in r["met"]}
        assert met == {s for s, r, _ in fol["topology"]["edges"] if r == receiver}
    an = doc["methods"][2]["diagnostics"]["0"]["rounds"]
    assert [len(r["met"]) for r in an] == [2, 0] and len(an[0]["top_k"]) == 3  # A: all; K=all
    assert "alignment" not in an[0]["aligned"]["1"]  # N: fine-tuned, not pruned
    again = run_config(cfg)  # every stage is cached: identical results, nothing recomputed
    assert again["methods"][1]["client_personal_accuracy"] == fol["client_personal_accuracy"]
    assert again["cache"]["misses"] == 0
    changed = run_config(dataclasses.replace(cfg, methods=(FOL + ":gamma=0.5",)))
    assert changed["cache"]["misses"] >= 8  # a new pruning strength: every alignment anew


def test_alignment_scores_and_pruning_single_out_the_units_foreign_to_the_own_model() -> None:
    with seeded_torch(0, "fol", "align"):
        own = create_model("mlp", 1, 4, 8)
        x = torch.randn(128, 1, 8, 8)
        y = torch.randint(0, 4, (128,))
        foreign = torch.randn(50, 64) * 0.3
    model = copy.deepcopy(own)
    with torch.no_grad():
        model.features[1].weight[:50] = foreign  # 50 hidden units no own unit resembles
    groups = channel_groups(model)
    scores = alignment_scores(model, own, groups, x)[0]
    assert torch.all(scores[50:] > 0.999) and scores[:50].mean() < 0.8
    _, keep, _ = align_prune(
        model, own, LabelledData(x, y), TrainConfig(epochs=1, batch_size=32, lr=0.01),
        gamma=0.0, lambda_p=50.0, ratio=0.25, probe=128,
        generator=torch_generator(0, "a"), device=torch.device("cpu"),
    )  # fmt: skip
    removed = set(range(200)) - set(keep["features.1"].tolist())
    assert len(removed & set(range(50))) >= 45


def test_a_neighbour_that_fails_is_left_out_and_named(tiny_config: Any, monkeypatch: Any) -> None:
    original = Fol._aligned

    def failing(self: Fol, ctx: Any, sender: int, payload: Any, own: Any) -> Any:
        if sender == 1:
            raise FloatingPointError("training: loss became nan at step 3")
        return original(self, ctx, sender, payload, own)

    monkeypatch.setattr(Fol, "_aligned", failing)
    cfg = tiny_config(methods=["fol-a:kd_epochs=1"], graph="ring", clients=4, val_fraction=0.2)
    fol = run_config(cfg)["methods"][0]
    assert fol["clients_used"] == [0, 1, 2, 3]
    for receiver in (0, 2):
        diagnostics = fol["diagnostics"][str(receiver)]
        assert "loss became nan" in diagnostics["dropped"]["1"]
        assert 1 not in diagnostics["rounds"][0]["candidates"]


def test_a_candidate_with_non_finite_outputs_is_never_chosen(tiny_config: Any) -> None:
    class Broken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.full((len(x), 10), float("nan"))

    exp = prepare(tiny_config(clients=3, graph="ring", val_fraction=0.2))
    ctx = exp.receiver_context(0)
    method = build_method("fol:top_k=0")
    assert isinstance(method, Fol)
    chosen, weights, _ = method._ensemble(ctx, [train_model(ctx, ctx.recipe()), Broken()])
    assert chosen == [0] and weights.tolist() == [1.0]


def test_fol_needs_a_validation_split(tiny_config: Any) -> None:
    with pytest.raises(RequirementError, match="validation split"):
        run_config(tiny_config(methods=["fol"], graph="ring", clients=3))


def test_the_presets_are_fol_with_their_letters() -> None:
    assert isinstance(build_method("fol-a").config, FolConfig)
    assert build_method("fol-a").config.per_round == 0
    assert build_method("fol-n").config.prune is False
    an = build_method("fol-an").config
    assert an.per_round == 0 and an.prune is False
    assert build_method("fol").config == FolConfig()
    with pytest.raises(ValueError, match="contact"):
        build_method("fol:contact=0")


def test_the_weight_split_reading_fits_the_teacher_weights_on_the_split_it_names(
    tiny_config: Any, monkeypatch: Any
) -> None:
    import oneshotfl.methods.fol as fol_module

    fitted: list[int] = []
    original = fol_module.ensemble_weights

    def spy(logits: torch.Tensor, y: torch.Tensor, steps: int, lr: float) -> torch.Tensor:
        fitted.append(len(y))
        return original(logits, y, steps, lr)

    monkeypatch.setattr(fol_module, "ensemble_weights", spy)
    base = "fol:kd_epochs=1:weight_steps=5:top_k=0"
    cfg = tiny_config(methods=[base], graph="ring", clients=3, val_fraction=0.3)
    exp = prepare(cfg)
    train = {len(exp.data.shard(c).train) for c in range(3)}
    val = {len(exp.data.shard(c).val) for c in range(3)}
    assert train.isdisjoint(val)  # the two splits are told apart by their sizes
    run_config(cfg)
    assert fitted and set(fitted) <= train  # the paper's reading: D_train
    fitted.clear()
    run_config(dataclasses.replace(cfg, methods=(base + ":weight_split=val",)))
    assert fitted and set(fitted) <= val


def test_a_teacher_that_is_each_clients_own_model_is_noted() -> None:
    from oneshotfl.methods.fol_stages import (
        own_model_receivers,
        own_weight,
        prediction_agreement,
    )

    own = {"rounds": [{"top_k": [0, 2], "weights": [0.9951, 0.0049]}]}
    mixed = {"rounds": [{"top_k": [2, 1], "weights": [0.6, 0.4]}]}
    late = {
        "rounds": [{"top_k": [0, 1], "weights": [0.001, 0.999]}, {"top_k": [1], "weights": [1.0]}]
    }
    assert own_weight(own["rounds"][0], 0) == 0.9951 and own_weight(mixed["rounds"][0], 2) == 0.6
    assert own_weight(mixed["rounds"][0], 0) == 0.0  # not chosen
    assert own_model_receivers({"0": own, "2": mixed, "1": late}) == [0, 1]
    same = {**mixed, "own_agreement": 1.0}  # mixed weights, yet it predicts as its own model
    assert own_model_receivers({"2": same, "3": {**mixed, "own_agreement": 0.9}}) == [2]
    assert prediction_agreement(torch.eye(4), torch.eye(4) * 2) == 1.0
    assert prediction_agreement(torch.eye(4), torch.eye(4).flip(1)) == 0.0
    fol = build_method("fol")
    (note,) = fol.notes({"0": own, "2": mixed})
    assert note.startswith("for clients [0] (1 of 2) the teacher put >= 99% of its weight")
    assert note.endswith("their result is local training")
    assert fol.notes({"0": own})[0].startswith("for every client (1 of 1)")
    assert fol.notes({"2": mixed}) == [] and fol.notes({}) == []
