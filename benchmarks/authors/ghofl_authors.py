"""Plugin ``ghofl_authors``: GH-OFL's closed-form heads with the authors' server step, unedited.

Clients are ``ghofl``'s (the same cached messages: counts, per-class sums and the head's
second moments of the shared frozen encoder's features, float64). The server runs, from
``FabioTur-dev/One-Shot-FL`` (``server/GH_OFL_server.py``, commit fd6daf2):

* ``aggregate_clients_x`` — their summation and estimators (μ_c, π_c, log π_c, Σ_pool, the NB
  variances, the per-class covariances with the Σ_pool fallback), with ``symmetrize``; its
  ``safe_load_pt(path)`` (``torch.load`` of a client file) is replaced in the scope by a
  look-up of the in-memory client messages, each renamed to their schema (``A_per_class_x``
  ← sums, ``N_per_class`` ← counts, ``SUMSQ_per_class_x`` ← sumsq, ``B_global_x`` ← gram,
  ``S_per_class_x`` ← grams);
* ``shrink_cov`` and the constant ``MIN_EPS`` (read from the file), then the head of
  ``head``: ``logits_nbdiag_cpu`` (NB, float64), ``logits_lda_cpu`` (LDA, float64, on
  Σ_pool shrunk by ``lda_shrink`` with ``MIN_EPS``·I added, as their ``main()`` prepares it,
  then ``shrink=0.0`` as their evaluation calls it — so ε is added twice, as in theirs) or the
  class ``QDAFullFastGPU`` (QDA, float32 Cholesky on the run's device, ``qda_shrink``),
  called on every batch of encoder features inside an ``nn.Module`` on top of the encoder,
  like ``ghofl``'s outcome.

Adaptation: our clients send only their head's second moment (theirs send all of them), so
the fields a head does not read are filled with placeholders before ``aggregate_clients_x``:
``head=nb`` gets ``B_global_x`` = 0 (it only feeds Σ_pool and the QDA fallback, unused by
NB); ``head=lda`` gets ``SUMSQ_per_class_x`` = 0 (it only feeds the NB variances, unused by
LDA; without it their code prints a warning and falls back); ``head=qda`` gets
``B_global_x`` = Σ_c S_c per client (the identity their client's messages satisfy) and the
NB variances from diag(S) by their own code. Their test features come from the encoder under
fp16 autocast on a GPU; ours are float32.

Needs ``GHOFL_REPO`` = a checkout of that repository.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import authors_definitions, authors_functions

from oneshotfl.methods.base import register_method
from oneshotfl.methods.common import encoded_head
from oneshotfl.methods.ghofl import SECOND_MOMENT, GhOfl
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ServerContext
from oneshotfl.protocol.outcome import GlobalModel, Outcome

ENV = "GHOFL_REPO"
FILE = "server/GH_OFL_server.py"
FUNCTIONS = (
    "symmetrize",
    "shrink_cov",
    "aggregate_clients_x",
    "logits_nbdiag_cpu",
    "logits_lda_cpu",
)


def authors_code(load_pt: Callable[[str], Any]) -> dict[str, Any]:
    """Their functions, the class ``QDAFullFastGPU`` and ``MIN_EPS``, in one scope whose
    ``safe_load_pt`` is ``load_pt``."""
    scope: dict[str, Any] = {"torch": torch, "nn": nn, "np": np, "safe_load_pt": load_pt}
    scope.update(List=list, Dict=dict, Optional=Optional, Tuple=tuple)
    scope.update(authors_definitions(ENV, FILE, ("MIN_EPS",), scope))
    scope.update(authors_functions(ENV, FILE, FUNCTIONS, scope))
    scope.update(authors_definitions(ENV, FILE, ("QDAFullFastGPU",), scope))
    return scope


_HEAD_CODE: dict[str, Any] = {}


def head_code() -> dict[str, Any]:
    """Their logit functions and ``QDAFullFastGPU``, loaded once per process."""
    if not _HEAD_CODE:
        _HEAD_CODE.update(authors_code(lambda path: None))
    return _HEAD_CODE


def authors_message(payload: Payload, head: str) -> dict[str, torch.Tensor]:
    """A client's message in their file schema (placeholders: see the module docs)."""
    a = payload.arrays
    sums = torch.from_numpy(np.asarray(a["sums"], np.float64))
    c, d = sums.shape
    out = {"A_per_class_x": sums, "N_per_class": torch.from_numpy(np.asarray(a["counts"]))}
    if head == "nb":
        out["SUMSQ_per_class_x"] = torch.from_numpy(np.asarray(a["sumsq"], np.float64))
        out["B_global_x"] = torch.zeros(d, d, dtype=torch.float64)
    elif head == "lda":
        out["B_global_x"] = torch.from_numpy(np.asarray(a["gram"], np.float64))
        out["SUMSQ_per_class_x"] = torch.zeros(c, d, dtype=torch.float64)
    else:
        grams = torch.from_numpy(np.asarray(a["grams"], np.float64))
        out["S_per_class_x"] = grams
        out["B_global_x"] = grams.sum(0)
    return out


class AuthorsGaussianHead(nn.Module):
    """Their closed-form head on d-dimensional features: their tensors as float64 buffers,
    their logit functions called on every batch (QDA's Cholesky factors built by their
    ``QDAFullFastGPU`` once per device)."""

    def __init__(self, head: str, tensors: Mapping[str, torch.Tensor], qda_shrink: float) -> None:
        super().__init__()
        self.kind, self.qda_shrink = head, qda_shrink
        for name, value in tensors.items():
            self.register_buffer(name, value.to(torch.float64))
        self._qda: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Picklable: without the QDA objects of their (exec-defined) class, rebuilt on use."""
        return {**self.__dict__, "_qda": {}}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = dict(self.named_buffers())
        code = head_code()
        if self.kind == "nb":
            return code["logits_nbdiag_cpu"](x.double(), b["mu"], b["var"], b["logp"]).float()
        if self.kind == "lda":
            return code["logits_lda_cpu"](x.double(), b["mu"], b["sigma"], b["logp"], 0.0).float()
        key = str(x.device)
        if key not in self._qda:
            cpu = {k: v.cpu() for k, v in b.items()}
            qda = code["QDAFullFastGPU"]
            self._qda[key] = qda(cpu["mu"], cpu["sigma"], cpu["logp"], self.qda_shrink, x.device)
        return self._qda[key].logits(x.float())


@register_method("ghofl_authors", "GH-OFL's closed-form heads, the authors' server step (plugin)")
class GhOflAuthors(GhOfl):
    """``ghofl``'s clients; the authors' aggregation and closed-form heads on the server."""

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        head, cfg = self.config.head, self.config
        messages = {str(c): authors_message(payloads[c], head) for c in sorted(payloads)}
        code = authors_code(messages.get)  # in-memory messages instead of torch.load
        classes = int(next(iter(messages.values()))["N_per_class"].shape[0])
        agg = code["aggregate_clients_x"](list(messages), num_classes=classes)
        tensors = {"mu": agg["mu"], "logp": agg["logp"]}
        if head == "nb":
            tensors["var"] = agg["Var_diag"]
        elif head == "lda":  # as their main() prepares it before evaluate_streaming
            shrunk = code["symmetrize"](code["shrink_cov"](agg["Sigma_pool"], cfg.lda_shrink))
            eye = torch.eye(shrunk.shape[0], dtype=torch.float64)
            tensors["sigma"] = shrunk + code["MIN_EPS"] * eye
        else:
            tensors["sigma"] = agg["Sigma_cls"]
        model = AuthorsGaussianHead(head, tensors, cfg.qda_shrink)
        counts = agg["pri"] * agg["N_total"]
        info = {
            "head": head,
            "second_moment": SECOND_MOMENT[head],
            "classes_present": float((counts > 0.5).sum()),
            "authors_files": float(agg["num_files"]),
        }
        return GlobalModel(encoded_head(ctx, model.eval()), info=info)
