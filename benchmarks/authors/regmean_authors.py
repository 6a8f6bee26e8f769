"""Plugin ``regmean_authors``: RegMean with the authors' merge, unedited.

Clients are ``regmean``'s (the same cached models, input Grams of every linear layer and
n_k). The server runs ``avg_merge`` of ``Divyansh03/FedFisher`` (``algs/regmean.py``, commit
ebea799, the RegMean baseline of FedFisher's paper; it calls their ``filter_params_to_merge``,
``regmean_merge`` and ``reduce_non_diag``) on the clients' models rebuilt from their payloads,
their Grams (float32, as sent, keyed by layer name as their ``compute_gram`` keys them) and the
shares p_k (``weighting``), at a = ``alpha``: each linear weight merged in closed form (float32
``torch.pinverse``), every other parameter the uniform mean. ``copy_params_to_model`` puts
the result into the uniform average of the models (which gives the buffers their merge does
not hold, e.g. BatchNorm's statistics, as ``regmean:others=uniform`` does).

Not run: their ``regmean_global_merge`` around it — 15-bit quantisation of the models, the
Grams' compression, and the choice of a ∈ {0.1, 0.9} by accuracy on 500 labelled training
examples at the server (``alpha`` is a knob here, as in ``regmean``) — and their client step
``compute_gram``, which moves every batch to ``"cuda"``. ``others=weighted`` is refused:
their merge averages the other parameters uniformly.

Needs ``FEDFISHER_REPO`` = a checkout of that repository (as ``fedfisher_authors``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import authors_functions

from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import client_models
from oneshotfl.methods.common import average_models, client_shares
from oneshotfl.methods.regmean import RegMean, RegMeanConfig
from oneshotfl.params import require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ServerContext
from oneshotfl.protocol.layer_stats import linear_layers
from oneshotfl.protocol.outcome import GlobalModel, Outcome

ENV = "FEDFISHER_REPO"
FILE = "algs/regmean.py"
FUNCTIONS = (
    "filter_params_to_merge",
    "avg_merge",
    "copy_params_to_model",
    "reduce_non_diag",
    "regmean_merge",
)


@dataclass(frozen=True)
class RegMeanAuthorsConfig(RegMeanConfig):
    """``regmean``'s; ``others`` only ``uniform``, as their merge averages."""

    def validate(self) -> None:
        super().validate()
        require(
            self.others == "uniform",
            "others",
            "uniform (the authors' merge averages the other parameters uniformly)",
            self.others,
        )


@register_method("regmean_authors", "RegMean, the authors' merge from FedFisher's code (plugin)")
class RegMeanAuthors(RegMean):
    """``regmean``'s clients; the authors' ``avg_merge`` on the server."""

    Config = RegMeanAuthorsConfig
    config: RegMeanAuthorsConfig

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        cfg = self.config
        code = authors_functions(ENV, FILE, FUNCTIONS, {"torch": torch, "re": re})
        ids = sorted(payloads)
        models = client_models(payloads, ctx.dims)
        merged = average_models(payloads, ctx.dims, "uniform")
        layers = linear_layers(merged)
        grams = [
            {k: torch.from_numpy(payloads[c].arrays[f"gram.{k}"]).float() for k in layers}
            for c in ids
        ]
        p = client_shares(payloads, cfg.weighting)
        with torch.no_grad():
            params = code["avg_merge"](p, models, models[0], regmean_grams=grams, a=cfg.alpha)
            code["copy_params_to_model"](params, merged)
        return GlobalModel(merged, {"alpha": cfg.alpha, "merged_layers": float(len(layers))})
