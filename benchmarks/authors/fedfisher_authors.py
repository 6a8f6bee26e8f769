"""Plugin ``fedfisher_authors``: FedFisher (Diag) with the authors' server step, unedited, in
the authors' setting — a server holding labelled training examples.

Clients are ``fedfisher``'s (the same cached models and true-Fisher diagonals), and each also
sends ``labelled`` (50) of its own training examples with their labels: ten clients give the
500 labelled examples the authors' server draws from the training set, which no oneshotfl
method holds. The server calls ``one_shot_fisher_diag`` of ``Divyansh03/FedFisher``
(``algs/fisher_avg.py``, commit ebea799; its ``test_img`` from ``utils/compute_accuracy.py``):
2000 Adam-like steps from FedAvg, keeping the iterate of steps 0, 100, …, 1900 most accurate
on those examples. Without compression (the authors quantise to 15 bits).

Needs ``FEDFISHER_REPO`` = a checkout of that repository.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import authors_functions

from oneshotfl.methods.base import register_method
from oneshotfl.methods.common import average_models, client_shares
from oneshotfl.methods.fedfisher import FedFisher, FedFisherConfig
from oneshotfl.params import require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, ServerContext
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.protocol.spec import ArraySpec, PayloadSpec, WireDims
from oneshotfl.seeding import numpy_rng


@dataclass(frozen=True)
class FedFisherAuthorsConfig(FedFisherConfig):
    """Attributes: labelled: training examples (with labels) each client sends the server."""

    labelled: int = 50

    def validate(self) -> None:
        super().validate()
        require(self.labelled >= 1, "labelled", ">= 1", self.labelled)


@register_method("fedfisher_authors", "FedFisher (Diag), the authors' server step (plugin)")
class FedFisherAuthors(FedFisher):
    """``fedfisher``'s clients plus labelled examples; the authors' server step."""

    Config = FedFisherAuthorsConfig
    config: FedFisherAuthorsConfig

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        base = super().payload_spec(dims)
        m = self.config.labelled
        labels = ArraySpec("val_y", (m,), ("int64",), value_range=(0, dims.num_classes - 1))
        extra = (ArraySpec("val_x", (m, "CH", "H", "W")), labels)
        return PayloadSpec(
            arrays=base.arrays + extra, models=base.models, scalars=base.scalars, groups=base.groups
        )

    def client_update(self, ctx: ClientContext) -> Payload:
        rng = numpy_rng(ctx.seed, "fedfisher_authors", ctx.client_id)
        pick = rng.choice(len(ctx.data), self.config.labelled, replace=True)
        shown = {"val_x": ctx.data.x[pick].numpy(), "val_y": ctx.data.y[pick].numpy()}
        return super().client_update(ctx).merged(Payload(shown))

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        scope = {"torch": torch, "copy": __import__("copy"), "DataLoader": DataLoader, "F": F}
        scope.update(parameters_to_vector=parameters_to_vector)
        scope.update(vector_to_parameters=vector_to_parameters)
        test_img = authors_functions(
            "FEDFISHER_REPO", "utils/compute_accuracy.py", ("test_img",), scope
        )["test_img"]
        scope["test_img"] = test_img
        server = authors_functions(
            "FEDFISHER_REPO", "algs/fisher_avg.py", ("one_shot_fisher_diag",), scope
        )["one_shot_fisher_diag"]
        ids = sorted(payloads)
        net = average_models(payloads, ctx.dims, self.config.weighting).to(ctx.device)
        names = [k for k, _ in net.named_parameters()]

        def flat(c: int, prefix: str) -> torch.Tensor:
            parts = [torch.from_numpy(payloads[c].arrays[f"{prefix}.{k}"]).flatten() for k in names]
            return torch.cat(parts).to(ctx.device)

        p = client_shares(payloads, self.config.weighting)
        f_sum = sum(pk * flat(c, "fisher") for pk, c in zip(p, ids, strict=True))
        b = sum(pk * flat(c, "fisher") * flat(c, "model") for pk, c in zip(p, ids, strict=True))
        x = torch.from_numpy(np.concatenate([payloads[c].arrays["val_x"] for c in ids]))
        y = torch.from_numpy(np.concatenate([payloads[c].arrays["val_y"] for c in ids]))
        args = {"bs": 64, "device": ctx.device}
        fisher_args = {"eta": self.config.lr, "T": self.config.steps}
        best = server(net, f_sum, b, np.asarray(p), TensorDataset(x, y), fisher_args, args)
        vector_to_parameters(best, net.parameters())
        return GlobalModel(net.cpu(), {"labelled_at_server": float(len(y))})
