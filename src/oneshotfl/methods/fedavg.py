"""One-shot FedAvg: one round of McMahan et al. (2017), "Communication-Efficient Learning of
Deep Networks from Decentralized Data" (AISTATS).

Every client starts from the shared initial model, trains ``local_epochs`` on its data and
sends its weights with its example count; the server returns the data-size-weighted average
of the parameters (and buffers: BatchNorm statistics are averaged the same way, integer
counters are rounded). Requires identical architectures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from oneshotfl.federation.contract import (
    NoConfig,
    Requires,
    ServerContext,
)
from oneshotfl.federation.outcome import GlobalModel, Outcome
from oneshotfl.federation.payload import Payload
from oneshotfl.federation.spec import WireDims, model_from_fields
from oneshotfl.methods.base import register_method
from oneshotfl.methods.recipes import SendsTrainedModel


def weighted_average(
    states: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]
) -> dict[str, np.ndarray]:
    """Σ_k w_k θ_k / Σ_k w_k per tensor; integer tensors are rounded back to their dtype.

    Raises:
        ValueError: for no states, mismatched keys, or non-positive total weight.
    """
    if not states:
        raise ValueError("weighted_average: expected at least one state, got none")
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (len(states),) or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weighted_average: expected {len(states)} non-negative weights, got {w}")
    w = w / w.sum()
    keys = list(states[0])
    if any(set(s) != set(keys) for s in states[1:]):
        raise ValueError("weighted_average: expected states with the same keys, got different")
    out: dict[str, np.ndarray] = {}
    for key in keys:
        stacked = np.stack([np.asarray(s[key], dtype=np.float64) for s in states])
        mean = np.tensordot(w, stacked, axes=1)
        dtype = states[0][key].dtype
        out[key] = np.asarray(np.rint(mean) if dtype.kind in "iub" else mean, dtype=dtype)
    return out


def average_models(payloads: Mapping[int, Payload], dims: WireDims) -> nn.Module:
    """The size-weighted average Σ_k (n_k/n)·w_k of the models in ``payloads`` (each with an
    ``n_examples`` scalar), built as the architecture of the lowest client id."""
    ids = sorted(payloads)
    prefix = "model."
    states = [
        {k[len(prefix) :]: v for k, v in payloads[c].arrays.items() if k.startswith(prefix)}
        for c in ids
    ]
    sizes = [float(payloads[c].scalars["n_examples"]) for c in ids]
    averaged = weighted_average(states, sizes)
    model = model_from_fields(payloads[ids[0]], dims)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in averaged.items()})
    return model


@register_method("fedavg", "one round of FedAvg: data-size-weighted parameter average")
class FedAvg(SendsTrainedModel[NoConfig]):
    """One-shot FedAvg (McMahan et al. 2017)."""

    requires = Requires(same_architecture=True)

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        return GlobalModel(average_models(payloads, ctx.dims))
