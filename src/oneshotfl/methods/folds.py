"""Folds the methods share (:mod:`oneshotfl.protocol.fold`): the weighted average of the
clients' models, one payload at a time.

FedAvg, FedProx and multi-round FedAvg average the models their clients send; the server
adds a_k·θ_k and a_k (:class:`~oneshotfl.functional.WeightedSum`) as each payload arrives and
divides once at the end, so it never holds more than one client's model besides the sums.
:func:`~oneshotfl.methods.common.average_models` (the plain mean) runs through the same fold:
the two paths give the same bits.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from torch import nn

from oneshotfl.functional import WeightedSum, Weighting, client_weights
from oneshotfl.payload import Payload
from oneshotfl.protocol.fields import model_from_fields
from oneshotfl.protocol.fold import Fold
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.protocol.spec import PayloadError, WireDims

PREFIX = "model."


def model_state(payload: Payload) -> dict[str, np.ndarray]:
    """The model tensors a payload carries (``model.*`` arrays), by parameter name."""
    return {k[len(PREFIX) :]: v for k, v in payload.arrays.items() if k.startswith(PREFIX)}


def _outcome(model: nn.Module) -> Outcome:
    return GlobalModel(model)


class ModelAverage(Fold):
    """Σ_k a_k θ_k / Σ_k a_k over the clients' models, folded (the module docs), built as
    the architecture of the first client folded (the lowest id). ``weighting``: ``size``
    (a_k = n_k, the client's reported example count) or ``uniform`` (a_k = 1) — the weightings
    one client's payload decides alone (``clipped`` needs every size's median: not a fold).
    ``outcome`` wraps the averaged model (default: a :class:`GlobalModel`)."""

    def __init__(
        self,
        dims: WireDims,
        weighting: Weighting = "size",
        outcome: Callable[[nn.Module], Outcome] = _outcome,
    ) -> None:
        if weighting not in ("size", "uniform"):
            raise ValueError(f"ModelAverage: expected size or uniform weighting, got {weighting}")
        self.dims, self.weighting, self.outcome = dims, weighting, outcome
        self.summed = WeightedSum()
        self.first: Payload | None = None  # its scalars name the architecture

    def add(self, client_id: int, payload: Payload) -> None:
        state = model_state(payload)
        size = float(payload.scalars["n_examples"])
        weight = float(client_weights([size], self.weighting)[0])
        problem = self.summed.problem(state, weight)
        if problem is not None:
            expected = "the tensors of the models folded before"
            raise PayloadError("model", expected, problem, client_id)
        self.summed.add(state, weight)
        if self.first is None:
            self.first = Payload({}, dict(payload.scalars))

    def averaged(self) -> nn.Module:
        """The averaged model."""
        if self.first is None:
            raise ValueError("ModelAverage: expected at least one model folded, got none")
        arrays = {PREFIX + k: v for k, v in self.summed.mean().items()}
        return model_from_fields(Payload(arrays, self.first.scalars), self.dims)

    def finish(self) -> Outcome:
        return self.outcome(self.averaged())


__all__ = ["ModelAverage", "model_state"]
