"""Plugin ``fedcgs_authors``: FedCGS with the authors' server step, unedited.

Clients are ``fedcgs``'s (the same cached messages: counts, per-class sums and the Gram matrix
of the shared frozen encoder's features, float64). The server runs, from ``Yuqin-G/FedCGS``
(commit 25402e6):

* ``main_fedcgs.py`` lines 80–102 as written — the sums over the clients, N, the global mean,
  the total covariance ``Sx`` with ``torch.ger``, the class means, γ from their
  ``gamma_list = [0]``, ``np.linalg.inv`` and the call of their ``eval`` — in a scope where the
  names those lines read are bound as their lines 52–78 bind them: per client ``cs1`` (sums,
  float64), ``cc1`` (counts, float32, as their ``torch.zeros``), ``Ax1`` (the sum of all
  features, Σ_c sums: our clients do not send it) and ``Bx1`` (the Gram), in the lists
  ``cs_l``, ``cc_l``, ``Ax_l``, ``Bx_l``; ``num_d`` the features' dimension; ``device`` the run's;
* ``utils_fl.py``'s ``eval`` (their ``W = Aj S⁻¹``, the bias loop and the deep copy of the model
  with its ``fc`` overwritten), loaded alone; the ``model`` it copies is a stand-in holding
  an ``fc`` layer of the right shape (their ResNet-18's other layers are the shared encoder
  here), and the ``test`` it calls keeps the model it is handed instead of scoring it — the
  run evaluates the outcome like every method's.

Their code prints the test accuracy of that final head once (``test``): no epoch or γ is chosen
on the test set, so the printed number is the honest one. It fails where ours does not (see
``fedcgs``'s docs): a class no client holds makes its mean 0/0 and its logits NaN, and a
singular covariance has no inverse — so a run with an absent class is refused here.

Their calls that recent torch warns about (``.T`` of a 1-D tensor, ``torch.tensor`` of a tensor)
run as written, their UserWarnings silenced. Needs ``FEDCGS_REPO`` = a checkout of that
repository.
"""

from __future__ import annotations

import copy
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import authors_functions, authors_lines

from oneshotfl.methods.base import register_method
from oneshotfl.methods.common import encoded_head
from oneshotfl.methods.fedcgs import FedCgs
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ServerContext
from oneshotfl.protocol.outcome import GlobalModel, Outcome

ENV = "FEDCGS_REPO"
SERVER_LINES = (80, 102)
"""Their server step in ``main_fedcgs.py`` (inside its ``__main__`` loop)."""


class StandIn(nn.Module):
    """What their ``eval`` copies: a model whose ``fc`` it overwrites."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(features, classes)


def authors_head(payloads: Mapping[int, Payload], device: torch.device) -> nn.Linear:
    """Their lines 80–102 on the clients' messages; the ``fc`` layer their ``eval`` writes."""
    kept: list[nn.Module] = []

    def keep(model: nn.Module, test_loader: Any, device: str = "cuda:0") -> float:
        kept.append(model)
        return float("nan")

    scope: dict[str, Any] = {"torch": torch, "np": np, "copy": copy, "test": keep}
    their_eval = authors_functions(ENV, "utils_fl.py", ("eval",), scope)["eval"]
    cs_l, cc_l, ax_l, bx_l = [], [], [], []
    for c in sorted(payloads):
        a = payloads[c].arrays
        sums = torch.from_numpy(np.asarray(a["sums"], np.float64))
        cs_l.append(sums)
        cc_l.append(torch.from_numpy(np.asarray(a["counts"])).float())
        ax_l.append(sums.sum(0))
        bx_l.append(torch.from_numpy(np.asarray(a["gram"], np.float64)))
    classes, d = cs_l[0].shape
    total = torch.stack(cc_l).sum(0)
    if bool((total == 0).any()):
        raise ValueError(
            "fedcgs_authors: expected every class held by some client (their class means are "
            f"0/0 otherwise), got counts {total.tolist()}"
        )
    scope.update(cs_l=cs_l, cc_l=cc_l, Ax_l=ax_l, Bx_l=bx_l, num_d=d, device=device)
    scope.update(model=StandIn(d, classes), test_loader=None, eval=their_eval)
    with warnings.catch_warnings():  # their 1-D ``.T`` and ``torch.tensor(tensor)``
        warnings.simplefilter("ignore", UserWarning)
        try:
            authors_lines(ENV, "main_fedcgs.py", *SERVER_LINES, scope)
        except np.linalg.LinAlgError as exc:  # γ = 0 and a singular covariance
            raise ValueError(
                f"fedcgs_authors: their inverse of the total covariance failed ({exc}); "
                "expected more examples than feature dimensions"
            ) from None
    (model,) = kept
    return model.fc  # type: ignore[return-value]


@register_method("fedcgs_authors", "FedCGS, the authors' server step (plugin)")
class FedCgsAuthors(FedCgs):
    """``fedcgs``'s clients; the authors' aggregation and head on the server."""

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        head = authors_head(payloads, ctx.device).cpu().float()
        counts = sum(np.asarray(p.arrays["counts"]) for p in payloads.values())
        info = {"classes_present": float((np.asarray(counts) > 0).sum())}
        return GlobalModel(encoded_head(ctx, head.eval()), info=info)
