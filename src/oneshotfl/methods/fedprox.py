"""One-shot FedProx: one round of Li et al. (2020), "Federated Optimization in Heterogeneous
Networks" (MLSys).

Every client starts from the shared initial model w0 and minimises its local loss plus the
proximal term, h_k(w; w0) = F_k(w) + (μ/2)·‖w − w0‖² (the paper's Eq. 2), for the federation's
local epochs; it sends its weights with its example count n_k, and the server returns
FedAvg's size-weighted parameter average.

Deviations from the paper and choices where it is vague:

* One round: the anchor w^t of the proximal term is the shared initialisation w0, not a
  trained global model (the one-shot form FedOL compares against).
* Full participation and no stragglers: every client runs the full local budget, so the
  paper's γ-inexact partial work and device dropping do not arise.
* Aggregation: the paper samples devices with probability p_k = n_k/n and averages their
  models uniformly; with every client present we use the size-weighted average Σ p_k w_k,
  which is that estimator's expectation (and exactly FedAvg's server, reused from
  :mod:`oneshotfl.methods.fedavg`).
* Local solver: the federation's client optimiser (SGD with momentum by default), where the
  paper uses plain SGD.
* μ is fixed (``mu``); the paper's heuristic of adapting μ to the training loss needs many
  rounds and is not used.
* The proximal term covers the trainable parameters only; buffers (BatchNorm statistics)
  are not optimised by gradient and are averaged as FedAvg averages them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from oneshotfl.federation.contract import ClientContext, Requires, ServerContext
from oneshotfl.federation.outcome import GlobalModel, Outcome
from oneshotfl.federation.payload import Payload
from oneshotfl.federation.spec import model_fields
from oneshotfl.methods.base import register_method
from oneshotfl.methods.fedavg import FedAvg
from oneshotfl.methods.recipes import Regulariser, SendsTrainedModel, trained_local_model


@dataclass(frozen=True)
class FedProxConfig:
    """FedProx hyper-parameters.

    Attributes:
        mu: weight μ of the proximal term (μ/2)·‖w − w0‖²; > 0 (μ = 0 is FedAvg).
    """

    mu: float = 0.01

    def __post_init__(self) -> None:
        if not self.mu > 0:
            raise ValueError(f"mu: expected > 0, got {self.mu!r}")


def proximal_penalty(
    params: Iterable[torch.Tensor], anchor: Iterable[torch.Tensor], mu: float
) -> torch.Tensor:
    """(μ/2)·Σ_i ‖p_i − a_i‖² over aligned parameter tensors (gradients flow into ``params``).

    Raises:
        ValueError: when the two sequences differ in length or a pair differs in shape.
    """
    ps, anchors = list(params), list(anchor)
    if len(ps) != len(anchors):
        raise ValueError(
            f"proximal_penalty: expected as many anchor tensors as parameters ({len(ps)}), "
            f"got {len(anchors)}"
        )
    if not ps:
        return torch.zeros(())
    total = ps[0].new_zeros(())
    for p, a in zip(ps, anchors, strict=True):
        if p.shape != a.shape:
            raise ValueError(
                f"proximal_penalty: expected anchor shape {tuple(p.shape)}, got {tuple(a.shape)}"
            )
        total = total + (p - a.to(p.device, p.dtype)).pow(2).sum()
    return 0.5 * mu * total


def proximal_regulariser(mu: float) -> Callable[[nn.Module], Regulariser]:
    """Given the initial model, snapshot its trainable parameters as w0 and return
    ``model ↦ (μ/2)·‖w − w0‖²`` (the ``make_regulariser`` of the local-training recipe)."""

    def make(initial: nn.Module) -> Regulariser:
        names = [n for n, p in initial.named_parameters() if p.requires_grad]
        anchor = {n: p.detach().clone() for n, p in initial.named_parameters() if p.requires_grad}

        def regulariser(model: nn.Module) -> torch.Tensor:
            current = dict(model.named_parameters())
            for n in names:  # the anchor follows the model to its device once
                if anchor[n].device != current[n].device:
                    anchor[n] = anchor[n].to(current[n].device)
            return proximal_penalty((current[n] for n in names), (anchor[n] for n in names), mu)

        return regulariser

    return make


@register_method("fedprox", "one round of FedProx: proximal local training, FedAvg average")
class FedProx(SendsTrainedModel[FedProxConfig]):
    """One-shot FedProx (Li et al. 2020)."""

    Config = FedProxConfig
    requires = Requires(same_architecture=True)

    def client_update(self, ctx: ClientContext) -> Payload:
        mu = self.config.mu
        model = trained_local_model(
            ctx,
            recipe="fedprox",
            make_regulariser=proximal_regulariser(mu),
            recipe_params={"mu": mu},
        )
        return model_fields(model.cpu()).merged(Payload({}, {"n_examples": len(ctx.data)}))

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        outcome = FedAvg().aggregate(payloads, ctx)  # the size-weighted parameter average
        if not isinstance(outcome, GlobalModel):  # pragma: no cover - FedAvg's contract
            raise TypeError(f"fedavg: expected a GlobalModel, got {type(outcome).__name__}")
        return GlobalModel(outcome.model, {**outcome.info, "mu": self.config.mu})
