"""FENS's aggregator on the wire: its weights in the server's broadcast (``aggregator.*``)
and a client's change to them (``delta.*``), checked by one field group.

The aggregator's shapes follow the number of client models K it combines, which the receiver
reads off the arrays themselves: every array must agree on one K, at most the federation's
client count, so the group's byte bound is that of an aggregator over every client.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from oneshotfl.models.aggregator import AggregatorKind, StackedAggregator
from oneshotfl.payload import Payload
from oneshotfl.protocol.spec import FieldGroup, PayloadError, WireDims


def parameter_shapes(kind: AggregatorKind, k: int, c: int, d: int) -> dict[str, tuple[int, ...]]:
    """The aggregator's parameters by name and shape for K models, C classes, d hidden."""
    if kind == "nn":
        return {
            "hidden_layer.weight": (k * d, k * c),
            "hidden_layer.bias": (k * d,),
            "out.weight": (c, k * d),
            "out.bias": (c,),
        }
    return {"weight": (k,), "bias": (c,)}


@dataclass(frozen=True)
class AggregatorFields(FieldGroup):
    """The arrays ``<prefix>.<parameter>`` of a ``kind`` aggregator with ``hidden`` units
    per model (see the module docs)."""

    prefix: str
    kind: AggregatorKind
    hidden: int

    def members(self, payload: Payload, dims: WireDims, client: int | None) -> int:
        """K, the models the arrays are sized for.

        Raises:
            PayloadError: for a missing array or one that names no whole K.
        """
        key = f"{self.prefix}.{'hidden_layer.weight' if self.kind == 'nn' else 'weight'}"
        if key not in payload.arrays:
            raise PayloadError(key, "an array", "nothing (missing)", client)
        shape = payload.arrays[key].shape
        width = shape[-1] if self.kind == "nn" else (shape[0] if shape else 0)
        per = dims.num_classes if self.kind == "nn" else 1
        k = width // per if per else 0
        limit = len(dims.archs) or None
        if k < 1 or k * per != width or (limit is not None and k > limit):
            most = f", at most {limit} (the federation's clients)" if limit else ""
            raise PayloadError(key, f"a width of K·{per} for K >= 1{most}", str(shape), client)
        return k

    def check(self, payload: Payload, dims: WireDims, client: int | None) -> None:
        k = self.members(payload, dims, client)
        want = parameter_shapes(self.kind, k, dims.num_classes, self.hidden)
        got = {key[len(self.prefix) + 1 :] for key in payload.arrays if self.owns(key)}
        for name in sorted(set(want) - got):
            raise PayloadError(f"{self.prefix}.{name}", "an array", "nothing (missing)", client)
        for name in sorted(got - set(want)):
            raise PayloadError(f"{self.prefix}.{name}", "no such array", "one", client)
        for name, shape in want.items():
            key, value = f"{self.prefix}.{name}", payload.arrays[f"{self.prefix}.{name}"]
            if value.dtype != np.float32:
                raise PayloadError(key, "dtype float32", value.dtype.name, client)
            if tuple(value.shape) != shape:
                raise PayloadError(key, f"shape {shape} (K = {k})", str(value.shape), client)
            if not np.isfinite(value).all():
                raise PayloadError(key, "finite values", "NaN/inf entries", client)

    def bound(self, dims: WireDims, client: int | None) -> tuple[int, int] | None:
        if not dims.archs:
            return None
        shapes = parameter_shapes(self.kind, len(dims.archs), dims.num_classes, self.hidden)
        return 4 * sum(int(np.prod(s)) for s in shapes.values()), len(shapes)


def aggregator_arrays(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, np.ndarray]:
    """Named tensors as float32 wire arrays ``<prefix>.<name>``."""
    return {
        f"{prefix}.{name}": t.detach().float().cpu().numpy().copy() for name, t in tensors.items()
    }


def aggregator_from(
    payload: Payload, prefix: str, kind: AggregatorKind, k: int, classes: int, hidden: int
) -> StackedAggregator:
    """The aggregator whose weights a validated payload carries under ``prefix``."""
    agg = StackedAggregator(kind, k, classes, hidden)
    state = {
        name: torch.from_numpy(np.array(payload.arrays[f"{prefix}.{name}"]))
        for name in parameter_shapes(kind, k, classes, hidden)
    }
    agg.load_state_dict(state)
    return agg
