"""Plugin ``fedpft_authors``: FedPFT with the Flower baseline's server step, unedited.

Clients are ``fedpft``'s (the same cached messages: per class the count and a K-component
Gaussian mixture of the shared frozen encoder's features, in float16). The server runs
``FedPFT.aggregate_fit`` of ``adap/flower`` ``baselines/fedpft`` (``fedpft/strategy.py``,
at the mirror's commit fdef7af, last changed in 7e1d226), with its helpers ``chunks``,
``ndarrays_to_gmmparam`` and ``GMMParameters`` (``fedpft/utils.py``) and ``train``
(``fedpft/models.py``): it rebuilds every (client, class) mixture as a scikit-learn
``GaussianMixture`` with ``random_state`` = the config's seed 0 (so every mixture draws the
same noise: our ``fedpft:noise=shared``), samples as many features as the client counted,
and trains ``nn.Linear(d, C)`` on them with AdamW, cross-entropy, shuffled batches.

Adaptations, all outside their code: each client's message is encoded as their client's
Flower parameters (``[label, means, weights, covariances, num_samples]`` per class sent, the
order of their ``gmmparam_to_ndarrays``) in a ``FitRes`` of ``flwr``; their
``on_fit_config_fn`` is given ``n_mixtures`` = ``components``, ``cov_type`` =
``covariance``, ``seed`` 0, ``tol`` and ``max_iter`` from the config; their
``server_opt.lr``, ``server_batch_size`` and ``num_epochs`` are ``lr``, ``batch_size`` and
``epochs`` raised to meet ``min_steps`` as ours is (``fedpft_authors:lr=0.0001:min_steps=0``
is the baseline's 1e-4 for exactly 50 epochs); their AdamW has PyTorch's default weight
decay 0.01 (so ``weight_decay`` must stay 0.01). Their per-epoch ``log`` goes to the debug
level. Their server samples the counts as sent — our bound of each client's counts at twice
the median client's is not applied. The head's initialisation and the loader's shuffling
draw from torch's global RNG, seeded from the run's seed around the call.

Needs ``FEDPFT_REPO`` = a checkout of ``adap/flower`` (or of its ``baselines/fedpft``'s
parent: the folder holding ``baselines/fedpft``).
"""

from __future__ import annotations

import logging
import math
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import authors_definitions, authors_functions

from oneshotfl.methods.base import register_method
from oneshotfl.methods.common import encoded_head
from oneshotfl.methods.fedpft import FedPft, FedPftConfig
from oneshotfl.params import require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ServerContext
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.seeding import seeded_torch

ENV = "FEDPFT_REPO"
BASE = "baselines/fedpft/fedpft"
LOG = logging.getLogger(__name__)


def authors_strategy() -> type:
    """Their ``FedPFT`` strategy class, over their helpers (see the module docs)."""
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import FedAvg
    from numpy.typing import NDArray
    from sklearn.mixture import GaussianMixture

    def log(level: int, msg: str, *args: Any) -> None:  # their per-epoch log, kept quiet
        LOG.debug(msg, *args)

    typing = {"Dict": dict, "List": list, "Optional": Optional, "Tuple": tuple, "Union": Union}
    scope: dict[str, Any] = {"np": np, "torch": torch, "NDArray": NDArray, **typing}
    scope.update(dataclass=dataclass)
    scope.update(authors_definitions(ENV, f"{BASE}/utils.py", ("GMMParameters",), scope))
    helpers = ("chunks", "ndarrays_to_gmmparam")
    scope.update(authors_functions(ENV, f"{BASE}/utils.py", helpers, scope))
    train_scope = {"torch": torch, "nn": nn, "DataLoader": DataLoader, "logging": logging}
    train_scope.update(log=log, Optional=Optional)
    scope.update(authors_functions(ENV, f"{BASE}/models.py", ("train",), train_scope))
    scope.update(FedAvg=FedAvg, GMM=GaussianMixture, DataLoader=DataLoader)
    scope.update(parameters_to_ndarrays=parameters_to_ndarrays)
    scope.update(ndarrays_to_parameters=ndarrays_to_parameters)
    from flwr.common import FitRes, Parameters, Scalar
    from flwr.server.client_proxy import ClientProxy

    scope.update(FitRes=FitRes, Parameters=Parameters, Scalar=Scalar, ClientProxy=ClientProxy)
    scope.update(DictConfig=object)
    return authors_definitions(ENV, f"{BASE}/strategy.py", ("FedPFT",), scope)["FedPFT"]


def client_ndarrays(payload: Payload) -> list[np.ndarray]:
    """A client's message as their client's Flower parameters: per class sent, ``[label,
    means, weights, covariances, num_samples]``."""
    a = payload.arrays
    out: list[np.ndarray] = []
    for c in np.flatnonzero(np.asarray(a["counts"])):
        out += [np.array(int(c)), np.asarray(a["means"][c]), np.asarray(a["weights"][c])]
        out += [np.asarray(a["covariances"][c]), np.array(int(a["counts"][c]))]
    return out


@dataclass(frozen=True)
class FedPftAuthorsConfig(FedPftConfig):
    """``fedpft``'s; ``weight_decay`` fixed at their AdamW's (PyTorch's default 0.01)."""

    def validate(self) -> None:
        super().validate()
        ok = self.weight_decay == 0.01
        require(ok, "weight_decay", "0.01 (the baseline's AdamW default)", self.weight_decay)


@register_method("fedpft_authors", "FedPFT, the Flower baseline's server step (plugin)")
class FedPftAuthors(FedPft):
    """``fedpft``'s clients; the baseline's ``FedPFT.aggregate_fit`` on the server."""

    Config = FedPftAuthorsConfig
    config: FedPftAuthorsConfig

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
        from flwr.common import parameters_to_ndarrays as to_arrays

        cfg = self.config
        ids = sorted(payloads)
        means = np.asarray(payloads[ids[0]].arrays["means"])
        classes, d = means.shape[0], means.shape[-1]
        total = sum(int(np.asarray(payloads[c].arrays["counts"]).sum()) for c in ids)
        steps = math.ceil(total / cfg.batch_size) if total else 1
        epochs = max(cfg.epochs, math.ceil(cfg.min_steps / steps))
        fit_config = {
            "n_mixtures": cfg.components,
            "cov_type": cfg.covariance,
            "seed": 0,
            "tol": cfg.tol,
            "max_iter": cfg.max_iter,
        }
        results = []
        for c in ids:
            arrays = client_ndarrays(payloads[c])
            n = int(np.asarray(payloads[c].arrays["counts"]).sum())
            res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), n, {})
            results.append((None, res))
        strategy = authors_strategy()(
            num_classes=classes,
            feature_dimension=d,
            server_opt=types.SimpleNamespace(lr=cfg.lr),
            server_batch_size=cfg.batch_size,
            num_epochs=epochs,
            device=ctx.device,
            on_fit_config_fn=lambda _round: fit_config,
            fraction_fit=1,
            fraction_evaluate=1,
            accept_failures=False,
        )
        with seeded_torch(ctx.seed, "fedpft_authors", "server"):
            parameters, _ = strategy.aggregate_fit(1, results, [])
        weight, bias = (torch.from_numpy(a.copy()) for a in to_arrays(parameters))
        head = nn.Linear(d, classes)
        head.load_state_dict({"weight": weight, "bias": bias})
        info = {
            "sampled_features": float(total),
            "classes_sent": float(sum(len(client_ndarrays(payloads[c])) // 5 for c in ids)),
            "server_epochs": float(epochs),
        }
        return GlobalModel(encoded_head(ctx, head.eval()), info)
