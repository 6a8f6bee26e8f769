"""Folds the methods share (:mod:`oneshotfl.protocol.fold`): the weighted average of the
clients' models, one payload at a time.

FedAvg, FedProx and multi-round FedAvg average the models their clients send; the server
adds a_k·θ_k and a_k (:class:`~oneshotfl.functional.WeightedSum`) as each payload arrives and
divides once at the end, so it never holds more than one client's model besides the sums.
:func:`~oneshotfl.methods.common.average_models` (the plain mean) runs through the same fold:
the two paths give the same bits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

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


PER_PAYLOAD: tuple[Weighting, ...] = ("size", "uniform")
"""The weightings one client's payload decides alone (a fold reads a_k as it arrives)."""


def held_weights(payloads: Mapping[int, Payload], weighting: Weighting) -> dict[int, float] | None:
    """a_k of every held client (:func:`~oneshotfl.functional.client_weights` over their
    reported ``n_examples``) for a weighting that needs every size at once (``clipped``: the
    median of all), to fold the held payloads with; ``None`` for a weighting in
    :data:`PER_PAYLOAD`, which the fold reads from each payload itself."""
    if weighting in PER_PAYLOAD:
        return None
    ids = sorted(payloads)
    sizes = [float(payloads[c].scalars["n_examples"]) for c in ids]
    return dict(zip(ids, client_weights(sizes, weighting).tolist(), strict=True))


class ClientWeight:
    """a_k of a client as a fold reads it: from its own payload's ``n_examples`` for the
    weightings one payload decides (``size``: a_k = n_k; ``uniform``: a_k = 1), or from
    ``weights`` computed over every held payload (:func:`held_weights`; ``clipped`` needs every
    size's median, so it is folded only over payloads already held)."""

    def __init__(self, weighting: Weighting, weights: Mapping[int, float] | None = None) -> None:
        if weights is None and weighting not in PER_PAYLOAD:
            raise ValueError(
                f"a fold: expected size or uniform weighting, or every client's weights, got "
                f"{weighting}"
            )
        self.weighting, self.weights = weighting, weights

    def __call__(self, client_id: int, payload: Payload) -> float:
        if self.weights is not None:
            return float(self.weights[client_id])
        return float(client_weights([float(payload.scalars["n_examples"])], self.weighting)[0])


class ModelAverage(Fold):
    """Σ_k a_k θ_k / Σ_k a_k over the clients' models, folded (the module docs), built as
    the architecture of the first client folded (the lowest id). a_k: :class:`ClientWeight`
    of ``weighting`` (or of ``weights``, every client's, for a weighting one payload cannot
    decide). ``outcome`` wraps the averaged model (default: a :class:`GlobalModel`)."""

    def __init__(
        self,
        dims: WireDims,
        weighting: Weighting = "size",
        outcome: Callable[[nn.Module], Outcome] = _outcome,
        weights: Mapping[int, float] | None = None,
    ) -> None:
        self.dims, self.outcome = dims, outcome
        self.weight = ClientWeight(weighting, weights)
        self.summed = WeightedSum()
        self.first: Payload | None = None  # its scalars name the architecture

    def add(self, client_id: int, payload: Payload) -> None:
        state = model_state(payload)
        weight = self.weight(client_id, payload)
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


__all__ = ["ClientWeight", "ModelAverage", "held_weights", "model_state"]
