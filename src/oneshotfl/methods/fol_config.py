"""FOL's hyper-parameters (:class:`FolConfig`; the method is :mod:`oneshotfl.methods.fol`,
whose docs name each knob after the paper)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from oneshotfl.params import Params, is_int, require


@dataclass(frozen=True)
class FolConfig(Params):
    """FOL's hyper-parameters (names as in the module docs).

    Attributes:
        rounds: E, the collection rounds; each meets new neighbours, aligns their models and
            distils again, starting from the last round's student.
        per_round: Q, the most neighbours met in one round (0: every neighbour in contact).
        contact: the chance that a neighbour is in range in a round (1: always).
        prune: prune each received model with the alignment-aware structured pruning
            (false: fine-tune it only, FOL-N).
        gamma: γ, the strength of the group-lasso sparsity term while pruning.
        lambda_p: λ_p, the strength of the alignment term (the received model's responses
            drawn towards the client's own) while pruning.
        prune_ratio: the fraction of each layer's filters and neurons removed, smallest
            group norms first.
        finetune_epochs: epochs a received model is fine-tuned on the client's training
            split before pruning.
        prune_epochs: epochs of the sparsity- and alignment-regularised training.
        post_epochs: epochs of fine-tuning after the pruning, to recover accuracy.
        probe: training inputs used to measure the alignment of responses.
        top_k: K, the candidates (own model and aligned ones, best validation accuracy
            first) that form the ensemble teacher (0: all).
        weights: how the teacher weighs its members: ``learned`` (on the simplex, by
            minimising the ensemble's cross-entropy) or ``uniform``.
        weight_split: the split the learned weights are fitted on: ``train`` (the paper's
            D_train) or ``val`` (the private validation split, which no member trained on).
        weight_steps: full-batch Adam steps of the weight fit.
        weight_lr: the weight fit's learning rate.
        distill: distil the teacher into the client's own model (false: the client keeps the
            weighted ensemble as its model).
        temperature: T, the softmax temperature of the distillation.
        kd_lambda: λ, the pull of the student towards its starting weights θ^(e)- (an L2
            penalty on the difference).
        kd_epochs: epochs of distillation on the client's training inputs.
    """

    rounds: int = 1
    per_round: int = 1
    contact: float = 1.0
    prune: bool = True
    gamma: float = 0.01
    lambda_p: float = 0.1
    prune_ratio: float = 0.3
    finetune_epochs: int = 1
    prune_epochs: int = 1
    post_epochs: int = 1
    probe: int = 256
    top_k: int = 3
    weights: Literal["learned", "uniform"] = "learned"
    weight_split: Literal["train", "val"] = "train"
    weight_steps: int = 200
    weight_lr: float = 0.05
    distill: bool = True
    temperature: float = 2.0
    kd_lambda: float = 1e-3
    kd_epochs: int = 5

    def validate(self) -> None:
        require(is_int(self.rounds, 1), "rounds", "an int >= 1", self.rounds)
        for name in ("per_round", "top_k", "weight_steps"):
            value = getattr(self, name)
            require(is_int(value, 0), name, "an int >= 0", value)
        for name in ("finetune_epochs", "prune_epochs", "post_epochs", "kd_epochs"):
            value = getattr(self, name)
            require(is_int(value, 0), name, "an int >= 0", value)
        require(is_int(self.probe, 2), "probe", "an int >= 2", self.probe)
        require(0 < self.contact <= 1, "contact", "in (0, 1]", self.contact)
        require(0 <= self.prune_ratio < 1, "prune_ratio", "in [0, 1)", self.prune_ratio)
        require(self.gamma >= 0, "gamma", ">= 0", self.gamma)
        require(self.lambda_p >= 0, "lambda_p", ">= 0", self.lambda_p)
        require(self.weight_lr > 0, "weight_lr", "> 0", self.weight_lr)
        require(self.temperature > 0, "temperature", "> 0", self.temperature)
        require(self.kd_lambda >= 0, "kd_lambda", ">= 0", self.kd_lambda)
