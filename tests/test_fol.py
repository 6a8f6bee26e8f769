"""FOL: its four stages as pure functions, the peer method, its presets and Flower."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from helpers import prepare
from oneshotfl.data.types import LabelledData
from oneshotfl.methods import build_method
from oneshotfl.methods.fol import Fol, FolConfig
from oneshotfl.methods.fol_stages import (
    align_prune,
    encounter_schedule,
    ensemble_weights,
    regularised_distillation,
    top_k,
    validation_scores,
    weighted_logits,
)
from oneshotfl.models import create_model
from oneshotfl.runner.engine import RequirementError
from oneshotfl.runner.experiment import run_experiment
from oneshotfl.seeding import seeded_torch, torch_generator
from oneshotfl.training.loop import TrainConfig

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
    sparse = encounter_schedule(0, neighbours, 7, rounds=4, per_round=0, contact=0.3)
    assert sum(len(w) for w in sparse) < len(neighbours) * 4


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
    doc = run_experiment(cfg)
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
    assert sum(e[2] for e in fol["topology"]["edges"]) == sum(fol["upload_bytes_per_client"])
    an = doc["methods"][2]["diagnostics"]["0"]["rounds"]
    assert [len(r["met"]) for r in an] == [2, 0] and len(an[0]["top_k"]) == 3  # A: all; K=all
    assert "alignment" not in an[0]["aligned"]["1"]  # N: fine-tuned, not pruned
    again = run_experiment(cfg)  # every stage is cached: identical results
    assert again["methods"][1]["client_personal_accuracy"] == fol["client_personal_accuracy"]


def test_fol_needs_a_validation_split(tiny_config: Any) -> None:
    with pytest.raises(RequirementError, match="validation split"):
        run_experiment(tiny_config(methods=["fol"], graph="ring", clients=3))


def test_the_presets_are_fol_with_their_letters() -> None:
    assert isinstance(build_method("fol-a").config, FolConfig)
    assert build_method("fol-a").config.per_round == 0
    assert build_method("fol-n").config.prune is False
    an = build_method("fol-an").config
    assert an.per_round == 0 and an.prune is False
    assert build_method("fol").config == FolConfig()
    with pytest.raises(ValueError, match="contact"):
        build_method("fol:contact=0")
