"""Plugin ``fens_authors``: FENS with the authors' server step, unedited.

Clients and rounds are ``fens``'s (the same cached client models of round 0, the same proxy
logits and one-batch SGD changes of the aggregator in rounds 1 … R). In every aggregator
round the server's update is the class ``FedAdam`` of ``sacs-epfl/fens``
(``distoptim/FedAdam.py``, commit a349903: its ``average()``, which all-reduces the
ratio-weighted deltas and takes the Adam step without bias correction, with their hard-coded
β₂ = 0.99 and ε (``adaptivity``) = 1e-3, β₁ = ``gmf`` and η = ``slr``), with
``communicate`` from ``comm_helpers.py`` (with ``flatten_tensors`` and
``unflatten_tensors``); with ``aggregator=nn`` (the default) the module it steps is their
``SmallNN`` (``models/smallnn.py``: Linear(K·C → K·d) → ReLU → Linear(K·d → C)), the same
architecture as our ``StackedAggregator`` ``nn`` (``fc1``/``fc2`` are our
``hidden_layer``/``out``; both initialised uniform in ±1/√fan_in — ours is the one
initialisation both start from).

Adaptations, all outside their code: their ranks are the clients of one
``torch.distributed`` job, each stepping a replica; here one replica stands for them. Each
round the server builds ``SmallNN`` from the current aggregator, and ``FedAdam`` with
``ratio`` 1 and its state restored (``old_init`` = the current weights, the two moment
buffers from the previous round; none in the first round, as in theirs). The ``dist`` in
their scope is a stand-in whose ``all_reduce`` is the sum over the ranks: it adds to the
replica's own (zero) change the clients' changes Δ_k weighted by their ``get_ratios``
(``n_seen`` / Σ ``n_seen``), flattened in ``communicate``'s order. The result goes back
into our aggregator (names mapped) for the broadcast and the evaluation.
``aggregator=linear`` steps our linear aggregator with their ``FedAdam`` (their
``LinearAggregator`` has one scalar bias, ours one per class: the shapes differ).
``beta2`` and ``eps`` must stay at their values (their code hard-codes them).

Needs ``FENS_REPO`` = a checkout of that repository.
"""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import Optimizer, required

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import authors_definitions, authors_functions

from oneshotfl.methods.base import register_method
from oneshotfl.methods.fens import FENS, FENSConfig, ServerAggregator
from oneshotfl.params import require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ServerContext

ENV = "FENS_REPO"
OURS_TO_THEIRS = {"hidden_layer": "fc1", "out": "fc2"}
"""Our ``StackedAggregator`` ``nn`` layers by the names of their ``SmallNN``'s."""


class Ranks:
    """The stand-in for their ``torch.distributed``: ``all_reduce`` is the sum over the ranks,
    the replica's own buffer plus every client's change of the round (``sent``)."""

    def __init__(self) -> None:
        self.sent: list[torch.Tensor] = []

    def all_reduce(self, tensor: torch.Tensor) -> None:
        for t in self.sent:
            tensor.add_(t)


@functools.cache
def authors_code() -> tuple[dict[str, type], Ranks]:
    """Their ``FedAdam`` (over a :class:`Ranks` as ``dist``) and ``SmallNN``, loaded once."""
    ranks = Ranks()
    helpers = ("flatten_tensors", "unflatten_tensors", "communicate")
    comm = authors_functions(ENV, "comm_helpers.py", helpers, {"torch": torch})
    scope = {"torch": torch, "Optimizer": Optimizer, "required": required, **comm}
    scope["dist"] = ranks
    fedadam = authors_definitions(ENV, "distoptim/FedAdam.py", ("FedAdam",), scope)["FedAdam"]
    smallnn = authors_definitions(ENV, "models/smallnn.py", ("SmallNN",), {"nn": nn, "F": F})[
        "SmallNN"
    ]
    return {"FedAdam": fedadam, "SmallNN": smallnn}, ranks


def theirs(name: str) -> str:
    layer, _, rest = name.partition(".")
    return f"{OURS_TO_THEIRS.get(layer, layer)}.{rest}"


@dataclass(frozen=True)
class FENSAuthorsConfig(FENSConfig):
    """``fens``'s; ``beta2`` and ``eps`` fixed at the values their FedAdam hard-codes."""

    def validate(self) -> None:
        super().validate()
        require(
            self.beta2 == 0.99, "beta2", "0.99 (hard-coded in the authors' FedAdam)", self.beta2
        )
        require(self.eps == 1e-3, "eps", "1e-3 (hard-coded in the authors' FedAdam)", self.eps)


@register_method(
    "fens_authors",
    "NOT one-shot: FENS, the authors' FedAdam server step and SmallNN aggregator (plugin)",
)
class FENSAuthors(FENS):
    """``fens``'s clients and rounds; the authors' FedAdam (and SmallNN) on the server."""

    Config = FENSAuthorsConfig
    config: FENSAuthorsConfig

    def server_step(
        self,
        agg: ServerAggregator,
        mean: Mapping[str, torch.Tensor],
        payloads: Mapping[int, Payload],
        shares: Mapping[int, float],
        ctx: ServerContext,
    ) -> ServerAggregator:
        """Their FedAdam's ``average()`` on their SmallNN (or our linear aggregator), its
        all-reduce fed every client's change times its share (their ``get_ratios``)."""
        cfg, device = self.config, next(agg.parameters()).device
        ours = dict(agg.named_parameters())
        code, ranks = authors_code()
        ranks.sent = sent = []
        if cfg.aggregator == "nn":
            net: nn.Module = code["SmallNN"](cfg.hidden, agg.members, agg.classes).to(device)
            names = {theirs(n): n for n in ours}
            net.load_state_dict({k: ours[n].detach().clone() for k, n in names.items()})
        else:
            net = ServerAggregator(agg.kind, agg.members, agg.classes, agg.hidden).to(device)
            net.load_state_dict(agg.state_dict())
            names = {n: n for n in ours}
        params = dict(net.named_parameters())
        order = list(params)  # communicate's order: the optimiser's parameters
        for cid, share in sorted(shares.items()):  # get_ratios: n_seen / Σ n_seen
            parts = [payloads[cid].arrays[f"delta.{names[k]}"] for k in order]
            flat = torch.cat([torch.from_numpy(a).reshape(-1) for a in parts]).to(device)
            sent.append(flat.mul_(share))
        opt = code["FedAdam"](
            net.parameters(), ratio=1.0, gmf=cfg.beta1, lr=cfg.client_lr, slr=cfg.server_lr
        )
        for k, p in params.items():
            state: dict[str, torch.Tensor] = {"old_init": p.detach().clone()}
            if ctx.round > 1:  # their buffers exist from the second aggregation on
                m, v = agg.moments[names[k]]
                state["global_momentum_buffer"] = m.clone()
                state["global_second_moment_buffer"] = v.clone()
            opt.state[p] = state
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "This overload of add_ is deprecated")
            opt.average()
        new = ServerAggregator(agg.kind, agg.members, agg.classes, agg.hidden)
        new.load_state_dict({names[k]: p.detach() for k, p in net.named_parameters()})
        new.to(device)
        new.moments = {}
        for k, p in net.named_parameters():
            s = opt.state[p]
            new.moments[names[k]] = (
                s["global_momentum_buffer"].detach().clone(),
                s["global_second_moment_buffer"].detach().clone(),
            )
        return new
