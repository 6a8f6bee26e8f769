"""Plugin ``fedlpa_authors``: FedLPA with the authors' server step, unedited.

Clients are ``fedlpa``'s (the same cached models and K-FAC factors, damped by √(1 − coor)
as the authors' clients do); the server calls ``newton_solve`` of
``lebronlambert/FedLPA_NeurIPS2024`` (``experiments_our.py``, commit 08dd729: the expectation
approximation, then 10,000 gradient steps at lr 1 on the MSE of the residual, in float32) on
each layer, and keeps the other tensors at FedAvg as their script does. It is our
``fedlpa:solver=gd`` in their code.

Needs ``FEDLPA_REPO`` = a checkout of that repository.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import authors_functions

from oneshotfl.methods.base import register_method
from oneshotfl.methods.fedlpa import FedLPA
from oneshotfl.methods.kfac import damped, merge_kfac_layers
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ServerContext
from oneshotfl.protocol.outcome import GlobalModel, Outcome


@register_method("fedlpa_authors", "FedLPA, the server step of the authors' code (plugin)")
class FedLPAAuthors(FedLPA):
    """``fedlpa``'s clients; the authors' ``newton_solve`` on the server."""

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        names = ("newton_solve", "newton_solve_auto_gradient")
        code = authors_functions("FEDLPA_REPO", "experiments_our.py", names, {"torch": torch})
        gamma = self.config.damping

        def solve(
            start: torch.Tensor, w: torch.Tensor, a: torch.Tensor, g: torch.Tensor, p: torch.Tensor
        ) -> torch.Tensor:
            a_k = [f.float() for f in damped(a, gamma)]
            b_k = [f.float() for f in damped(g, gamma)]
            freqs = p.tolist()
            z = sum(freqs[k] * b_k[k] @ w[k].float() @ a_k[k] for k in range(len(a_k)))
            return code["newton_solve"](freqs, a_k, b_k, z, ctx.device).detach().double()

        merged = merge_kfac_layers(payloads, ctx.dims, self.config.weighting, solve, ctx.device)
        return GlobalModel(merged, {"damping": gamma})
