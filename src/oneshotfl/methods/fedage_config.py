"""FedAGE's hyper-parameters and its two readings (``paper``, ``authors``): every knob's
value under each, as :mod:`oneshotfl.methods.fedage` documents them (with the line
references), shared by the method and its server (:mod:`oneshotfl.methods.fedage_server`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from oneshotfl.models import MODELS
from oneshotfl.params import Params, require

Reading = Literal["paper", "authors"]
READINGS: dict[str, dict[str, Any]] = {  # an epochs knob of None means ``epochs``
    "paper": {
        "phase2": "kl",
        "ensemble_weighting": "none",
        "beta_on": "hard",
        "tau_squared": False,
        "previous": "snapshot",
        "block_epochs": None,
        "ensemble_epochs": None,
        "optimizer_state": "fresh",
        "ensemble_lr_scale": 1.0,
    },
    "authors": {
        "phase2": "kl+ce",
        "ensemble_weighting": "confidence",
        "beta_on": "soft",
        "tau_squared": True,
        "previous": "live",
        "block_epochs": 50,
        "ensemble_epochs": 50,
        "optimizer_state": "shared",
        "ensemble_lr_scale": 0.5,
    },
}
"""Every knob's value under each reading (see the module docs for the line references)."""


@dataclass(frozen=True)
class FedAGEConfig(Params):
    """FedAGE hyper-parameters (Table 5's Fashion-MNIST values where it gives them).

    Attributes:
        reading: ``authors`` (``pipeline.py``; default) or ``paper`` (Algorithm 1's text):
            the values of the knobs below that are left ``None``.
        head: client head architecture(s), comma-separated to cycle over client ids.
        server_head: the server head architecture.
        epochs: epochs of client head training.
        steps: a floor in client-head optimiser steps: a head trains the fewest whole
            epochs, at least ``epochs``, that make this many steps over its client's latents
            (0: exactly ``epochs``, Table 5's 7, where a small client's head stays far from
            converged; None: the federation's ``local_steps``).
        block_epochs: phase-1 epochs per client block (None: the reading's).
        ensemble_epochs: phase-2 epochs (0 skips phase 2; None: the reading's).
        schedule: phase 1 as ``sequential`` blocks (all epochs on client 1, then client 2…)
            or ``interleaved`` cycles (each epoch visits every client in order).
        lr: Adam learning rate of heads and server.
        batch_size: batch size of heads and server.
        tau: softmax temperature τ of teacher and student.
        beta: β of Eq. (1), on the loss ``beta_on`` names.
        gamma: γ, weight of the current teacher in the knowledge mix (Eq. 5).
        previous: P_s^(i−1) from a frozen ``snapshot`` or the ``live`` server head.
        order: client order of phase 1: ``id``, ``size`` (largest first) or ``random``.
        phase2: ``kl`` (Eq. 4) or ``kl+ce`` (+ CE on own-client pseudo-labels).
        ensemble_weighting: phase-2 confidence weight, ``none`` (Eq. 4) or ``confidence``.
        beta_on: β weighs the ``hard`` (Eq. 1) or the ``soft`` loss (the other gets 1−β).
        tau_squared: the KL terms are multiplied by τ² (Hinton et al.'s gradient scale).
        optimizer_state: phase 1 starts a ``fresh`` Adam per client block or keeps one
            ``shared`` through all blocks.
        ensemble_lr_scale: phase 2's fresh Adam runs at ``lr`` × this.
        dp_epsilon: local DP on the uploaded latents: clip each to L2 ≤ ``clip`` and add
            analytic-Gaussian noise for (ε, ``dp_delta``) per record (None = no DP).
        dp_delta: δ of the latents' guarantee.
        clip: the L2 bound C (sensitivity 2C under replace-one adjacency).
        head_source: with DP, train the head on the ``noised`` latents (default) or the
            ``clean`` ones.
        label_epsilon: label DP: each client trains its head on labels passed through k-ary
            randomized response with this ε (None = the true labels).
    """

    reading: Reading = "authors"
    head: str = "head_mlp"
    server_head: str = "head_mlp"
    epochs: int = 7
    steps: int | None = None
    block_epochs: int | None = None
    ensemble_epochs: int | None = None
    schedule: Literal["sequential", "interleaved"] = "sequential"
    lr: float = 1e-3
    batch_size: int = 64
    tau: float = 2.0
    beta: float = 0.5
    gamma: float = 0.75
    previous: Literal["snapshot", "live"] | None = None
    order: Literal["id", "size", "random"] = "id"
    phase2: Literal["kl", "kl+ce"] | None = None
    ensemble_weighting: Literal["none", "confidence"] | None = None
    beta_on: Literal["hard", "soft"] | None = None
    tau_squared: bool | None = None
    optimizer_state: Literal["fresh", "shared"] | None = None
    ensemble_lr_scale: float | None = None
    dp_epsilon: float | None = None
    dp_delta: float = 1e-5
    clip: float = 1.0
    head_source: Literal["noised", "clean"] = "noised"
    label_epsilon: float | None = None

    def validate(self) -> None:
        heads = [h.strip() for h in self.head.split(",")]
        for name in [*heads, self.server_head]:
            require(name in MODELS, "head", "registered models", name)
        for name in ("epochs", "batch_size"):
            require(getattr(self, name) >= 1, name, ">= 1", getattr(self, name))
        require(self.steps is None or self.steps >= 0, "steps", ">= 0 or None", self.steps)
        for name in ("block_epochs", "ensemble_epochs"):
            value = getattr(self, name)
            low = 1 if name == "block_epochs" else 0
            require(value is None or value >= low, name, f">= {low} or None", value)
        require(self.lr > 0, "lr", "> 0", self.lr)
        require(self.tau > 0, "tau", "> 0", self.tau)
        require(0 <= self.beta <= 1, "beta", "in [0, 1]", self.beta)
        require(0 <= self.gamma <= 1, "gamma", "in [0, 1]", self.gamma)
        scale = self.ensemble_lr_scale
        require(scale is None or scale > 0, "ensemble_lr_scale", "> 0 or None", scale)
        for name in ("dp_epsilon", "label_epsilon"):
            value = getattr(self, name)
            require(value is None or value > 0, name, "> 0 or None", value)
        require(0 < self.dp_delta < 1, "dp_delta", "in (0, 1)", self.dp_delta)
        require(self.clip > 0, "clip", "> 0", self.clip)

    def setting(self, name: str) -> Any:
        """A reading knob's value: the field when set, else the reading's (epochs knobs
        whose reading value is None fall back to ``epochs``)."""
        value = getattr(self, name)
        if value is None:
            value = READINGS[self.reading][name]
        return self.epochs if value is None else value

    def resolved(self) -> dict[str, Any]:
        """Every reading knob with its effective value (for result files and ``describe``)."""
        return {name: self.setting(name) for name in READINGS[self.reading]}

    def client_head(self, client_id: int) -> str:
        heads = [h.strip() for h in self.head.split(",")]
        return heads[client_id % len(heads)]
