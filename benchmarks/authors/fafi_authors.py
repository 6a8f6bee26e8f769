"""Plugin ``fafi_authors``: FAFI with the authors' server step, unedited.

Clients are ``fafi``'s (the same cached models: encoder and prototypes trained on two views).
The server runs, from ``zenghui9977/FAFI_ICML25`` (commit 26cf90e,
``oneshot_algorithms/ours/our_main.py``):

* lines 183–188 as written — the clients' weights n_k / Σ n (``aggregated_by_datasize``, their
  configs' ``True``) — with ``client_idx_map`` holding each client's reported count and
  ``config`` those two settings;
* lines 268–274 as written — ``aggregate_local_protos`` (the unweighted mean of the clients'
  prototypes), ``WEnsembleFeature`` (the weighted sum of the clients' ``encoder`` features) and
  ``eval_with_proto`` (the accuracy of the cosine to the averaged prototypes on the test split,
  the number their run logs) — their three definitions loaded alone.

Adaptation: each client's model is handed to their code as an object with their model's
``encoder`` (our ``forward_features``) and, for their prototypes list, its head's weights (their
``get_proto()``). Their local models are still in training mode when their code evaluates (so
BatchNorm normalises each test batch by its own statistics); so are they here, for the number
their code prints, on their test loader (the test split in batches of 256, shuffled with a
seeded generator, normalised as the run normalises it — their test loader feeds raw [0, 1]
images on CIFAR-10). The outcome is their fused features and averaged prototypes with the
members in eval mode, evaluated by the run like every method's; ``authors_printed_accuracy``
is what their evaluation gives on those inputs and ``authors_evaluation_s`` its seconds (part
of ``server_wall_s``: ``scripts/paired.py times`` leaves them out). Their weights are the
clients' sizes (their configs' ``aggregated_by_datasize``); ``fafi``'s ``weighting`` knob does
not reach them.

Needs ``FAFI_REPO`` = a checkout of that repository.
"""

from __future__ import annotations

import copy
import logging
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import authors_definitions, authors_lines, test_split, timed

from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import client_models
from oneshotfl.methods.fafi import Fafi
from oneshotfl.models.base import ClassifierModel
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ServerContext
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.seeding import torch_generator

ENV = "FAFI_REPO"
FILE = "oneshot_algorithms/ours/our_main.py"
WEIGHT_LINES = (183, 188)
SERVER_LINES = (268, 274)


class Features(nn.Module):
    """A client model's features, as their model's ``encoder``."""

    def __init__(self, model: ClassifierModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.forward_features(x)


class TheirModel(nn.Module):
    """What their server reads of a client's model: ``encoder`` and ``get_proto()``."""

    def __init__(self, model: ClassifierModel) -> None:
        super().__init__()
        self.encoder = Features(model)
        self.proto = model.head.weight

    def get_proto(self) -> torch.Tensor:
        return self.proto


class AuthorsFused(nn.Module):
    """Their ``WEnsembleFeature`` and averaged prototypes, scored as their
    ``eval_with_proto`` scores (normalised fused features times the prototypes)."""

    def __init__(
        self, ensemble: nn.Module, members: Sequence[nn.Module], proto: torch.Tensor
    ) -> None:
        super().__init__()
        self.ensemble = ensemble
        self.members = nn.ModuleList(members)  # so eval() and to() reach them here
        self.register_buffer("proto", proto)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feature = F.normalize(self.ensemble(x), dim=1)
        proto = cast(torch.Tensor, self.proto)
        return feature @ proto.t()


def their_code() -> dict[str, Any]:
    """Their three server definitions, in a scope with what they read."""
    scope: dict[str, Any] = {"torch": torch, "logger": logging.getLogger("fafi_authors")}
    names = ("aggregate_local_protos", "WEnsembleFeature", "eval_with_proto")
    scope.update(authors_definitions(ENV, FILE, names, scope))
    return scope


@register_method("fafi_authors", "FAFI, the authors' server step (plugin)")
class FafiAuthors(Fafi):
    """``fafi``'s clients; the authors' prototype averaging, feature fusion and scoring."""

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        order = sorted(payloads)
        members = [
            cast(ClassifierModel, m) for m in client_models(payloads, ctx.dims, device=ctx.device)
        ]
        sizes = {i: int(payloads[c].scalars["n_examples"]) for i, c in enumerate(order)}
        config = {"client": {"num_clients": len(order)}, "server": {"aggregated_by_datasize": True}}
        scope = their_code()
        scope.update(config=config, client_idx_map={i: range(n) for i, n in sizes.items()})
        weights = authors_lines(ENV, FILE, *WEIGHT_LINES, scope)["weights"]
        theirs = [TheirModel(copy.deepcopy(m)).train() for m in members]  # as their run leaves them
        test = test_split(ctx.task, "fafi_authors")
        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(test.x, test.y), batch_size=256, shuffle=True,
            generator=torch_generator(ctx.seed, "fafi_authors", "test loader"),
        )  # fmt: skip
        spent: list[float] = []
        scope.update(
            eval_with_proto=timed(scope["eval_with_proto"], spent),
            local_models=theirs, local_protos=[m.get_proto().detach() for m in theirs],
            weights=weights, test_loader=loader, device=ctx.device, copy=copy,
            method_results=defaultdict(list),
        )  # fmt: skip
        ran = authors_lines(ENV, FILE, *SERVER_LINES, scope)
        outcome_members = [TheirModel(m).eval() for m in members]
        ensemble = scope["WEnsembleFeature"](model_list=outcome_members, weight_list=weights)
        fused = AuthorsFused(ensemble, outcome_members, ran["global_proto"]).eval()
        info = {
            "authors_printed_accuracy": float(ran["ens_proto_acc"]),
            "authors_evaluation_s": sum(spent),
            "authors_weights": [float(w) for w in weights],
        }
        return GlobalModel(fused, info=info)
