"""A set of client models in one message, keyed by client id: ``<prefix>.<id>.arch`` and
``<prefix>.<id>.<state-dict key>`` for every model.

A server that hands every client the models of the others (FENS's second broadcast: each
client runs all of them on its own held-out data) sends them as a :class:`ModelSet`. The
receiver checks every model as a client's own upload is checked
(:func:`~oneshotfl.protocol.validate.check_model`): the architecture client ``<id>`` is
configured with, every tensor's shape and dtype, finite values, finite outputs. Ids must be
clients of the federation, at least ``min_models`` of them, so the message is bounded by the
federation's models: its bytes never exceed the sum of every client's architecture.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from torch import nn

from oneshotfl.payload import Payload, Scalar
from oneshotfl.protocol.fields import model_fields, model_from_fields
from oneshotfl.protocol.spec import FieldGroup, ModelSpec, PayloadError, WireDims
from oneshotfl.protocol.validate import check_model, reference_state


@dataclass(frozen=True)
class ModelSet(FieldGroup):
    """Models keyed by the id of the client each came from (see the module docs).

    Attributes:
        prefix: field prefix (``"members"``).
        min_models: the fewest models the set may hold.
    """

    prefix: str = "members"
    min_models: int = 1

    def ids(self, payload: Payload) -> list[int]:
        """The client ids the payload's fields name, ascending.

        Raises:
            PayloadError: for a field whose id is not a decimal client number.
        """
        found: set[int] = set()
        for key in [*payload.arrays, *payload.scalars]:
            if not self.owns(key):
                continue
            part = key[len(self.prefix) + 1 :].split(".", 1)[0]
            if not part.isdecimal():
                raise PayloadError(key, f"{self.prefix}.<client id>.<field>", repr(key), None)
            found.add(int(part))
        return sorted(found)

    def check(self, payload: Payload, dims: WireDims, client: int | None) -> None:
        ids = self.ids(payload)
        if len(ids) < self.min_models:
            raise PayloadError(
                self.prefix, f"at least {self.min_models} model(s)", f"{len(ids)}", client
            )
        for cid in ids:
            if dims.archs and cid >= len(dims.archs):
                raise PayloadError(
                    f"{self.prefix}.{cid}",
                    f"a client id below {len(dims.archs)}, the federation's clients",
                    str(cid),
                    client,
                )
            spec = ModelSpec(prefix=f"{self.prefix}.{cid}")
            if spec.arch_key not in payload.scalars:
                raise PayloadError(spec.arch_key, "a scalar", "nothing (missing)", client)
            check_model(payload, spec, dims, cid)

    def bound(self, dims: WireDims, client: int | None) -> tuple[int, int] | None:
        if not dims.archs:
            return None
        total, tensors = 0, 0
        for arch in dims.archs:
            try:
                state = reference_state(arch, dims)
            except Exception:  # cannot be built here: a model naming it is refused anyway
                continue
            total += sum(v.numel() * v.element_size() for v in state.values())
            tensors += len(state)
        return total, tensors


def model_set_fields(models: Mapping[int, nn.Module], prefix: str = "members") -> Payload:
    """``models`` (client id → model) as the fields of a :class:`ModelSet`."""
    arrays: dict[str, np.ndarray] = {}
    scalars: dict[str, Scalar] = {}
    for cid in sorted(models):
        fields = model_fields(models[cid].cpu(), f"{prefix}.{cid}")
        arrays.update(fields.arrays)
        scalars.update(fields.scalars)
    return Payload(arrays, scalars)


def models_from_set(
    payload: Payload, dims: WireDims, prefix: str = "members"
) -> dict[int, nn.Module]:
    """The models a validated :class:`ModelSet` carries, by client id (ascending)."""
    ids = ModelSet(prefix).ids(payload)
    return {cid: model_from_fields(payload, dims, f"{prefix}.{cid}").eval() for cid in ids}
