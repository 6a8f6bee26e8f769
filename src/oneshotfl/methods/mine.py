"""MinE, the lowest-entropy vote: the baseline FedOL (Ye et al., "Towards a Larger Model via
One-Shot Federated Learning on Heterogeneous Client Models") lists as "MinE [20]: a voting
method that chooses the prediction with the lowest entropy", citing Grandvalet & Bengio (2004),
"Semi-supervised Learning by Entropy Minimization" (NeurIPS).

Clients train locally and send their softmax predictions p_k(x) on the unlabelled public pool.
For each public sample the server picks the client whose prediction has the lowest entropy,
k*(x) = argmin_k H(p_k(x)), takes ŷ(x) = argmax_c p_{k*(x)}(x) as the pseudo-label, and trains
a fresh ``server_model`` on (x, ŷ) with cross-entropy.

Deviations and choices where the description is vague:

* The cited paper is a semi-supervised regulariser (an entropy penalty on unlabelled inputs
  added to a supervised loss), not a federated vote; the server has no labelled data, so this
  implements FedOL's one-line description of its baseline, in one round.
* Target (``target``): FedOL says the vote "chooses the prediction"; ``hard`` (default)
  trains on its argmax, ``soft`` on the chosen probability vector itself.
* Server training (``epochs``): a fresh model from the shared initialisation of
  ``server_model``, trained with the server training config for ``epochs`` passes over the
  public pool (None = ``server_epochs``), without early stopping (no validation data).
* Entropies are those of the clients' plain softmax (T = 1, as in FedOL).
* Ties: among clients of equal entropy the lowest client id wins; among classes of equal
  probability the lowest class index (both exact float equality).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.data.types import LabelledData
from oneshotfl.functional import entropy
from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import shared_initial_model
from oneshotfl.methods.common import (
    STUDENT_LIMIT,
    SharesPredictions,
    stack_probabilities,
)
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import Requires, ServerContext
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.seeding import torch_generator
from oneshotfl.training.loop import Batch, fit, train_classifier


@dataclass(frozen=True)
class MinEConfig(Params):
    """MinE hyper-parameters.

    Attributes:
        target: train on the chosen prediction's argmax (``hard``) or on it (``soft``).
        epochs: server training epochs (None = ``server_epochs``).
    """

    target: Literal["hard", "soft"] = "hard"
    epochs: int | None = None

    def validate(self) -> None:
        require(self.epochs is None or self.epochs >= 1, "epochs", ">= 1 or None", self.epochs)


def lowest_entropy_client(probs: torch.Tensor) -> torch.Tensor:
    """k*(x) = argmin_k H(p_k(x)) per sample, ``[K, N, C] → [N]`` (ties: lowest k)."""
    if probs.ndim != 3 or probs.shape[0] == 0:
        raise ValueError(
            f"lowest_entropy_client: expected [K >= 1, N, C], got {tuple(probs.shape)}"
        )
    return entropy(probs).argmin(dim=0)  # argmin returns the first minimum


def lowest_entropy_predictions(probs: torch.Tensor) -> torch.Tensor:
    """p_{k*(x)}(x): the lowest-entropy client prediction per sample, ``[K, N, C] → [N, C]``."""
    chosen = lowest_entropy_client(probs)
    return probs[chosen, torch.arange(probs.shape[1])]


def lowest_entropy_labels(probs: torch.Tensor) -> torch.Tensor:
    """ŷ(x) = argmax_c p_{k*(x)}(x)_c, ``[K, N, C] → [N]`` int64 (ties: lowest k, then
    lowest c)."""
    return lowest_entropy_predictions(probs).argmax(dim=-1)  # argmax returns the first maximum


@register_method("mine", "MinE: pseudo-label by the lowest-entropy client prediction, train server")
class MinE(SharesPredictions[MinEConfig]):
    """The lowest-entropy vote over client predictions, distilled into a server model."""

    known_limits = (STUDENT_LIMIT,)

    Config = MinEConfig
    requires = Requires(public_data=True, server_model=True)

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        if ctx.public is None or ctx.server_arch is None:
            raise ValueError("mine needs a public pool and a server_model")
        ids = sorted(payloads)
        probs = stack_probabilities(payloads)
        chosen = lowest_entropy_client(probs)
        labels = lowest_entropy_labels(probs)
        base = ctx.train_config
        cfg = dataclasses.replace(base, epochs=self.config.epochs or base.epochs)
        server = shared_initial_model(ctx)
        generator = torch_generator(ctx.seed, "mine")
        description = f"mine server ({self.config.target} labels)"
        if self.config.target == "hard":
            train_classifier(
                server,
                LabelledData(ctx.public.x, labels),
                cfg,
                generator,
                ctx.device,
                tracker=ctx.tracker,
                description=description,
            )
        else:
            soft = lowest_entropy_predictions(probs)

            def loss_fn(model: nn.Module, batch: Batch) -> torch.Tensor:
                x, target = batch
                return F.cross_entropy(model(x), target)  # probability targets

            fit(
                server,
                (ctx.public.x, soft),
                loss_fn,
                cfg,
                generator,
                ctx.device,
                ctx.tracker,
                description,
            )
        share = torch.bincount(chosen, minlength=len(ids)).double() / max(1, len(chosen))
        info = {
            "pseudo_label_histogram": torch.bincount(
                labels, minlength=ctx.task.num_classes
            ).tolist(),
            "chosen_client_share": {str(c): float(s) for c, s in zip(ids, share, strict=True)},
        }
        return GlobalModel(server.eval(), info)
