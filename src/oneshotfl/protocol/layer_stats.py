"""Per-layer statistics of a model, sent beside it: what merging methods need besides the
weights (FedFisher's diagonal Fisher, RegMean's input Gram matrices).

A :class:`LayerStatistics` group names arrays ``<prefix>.<key>`` whose keys and shapes follow
the architecture the payload's model field carries (``model.arch``), so a client cannot send
statistics of another network, a missing layer or an extra one:

* ``diagonal`` — one non-negative float32 tensor per trainable parameter, of its shape
  (a diagonal curvature, e.g. the Fisher information's diagonal);
* ``gram`` — one symmetric float32 ``[d_in, d_in]`` matrix per ``nn.Linear`` layer (keyed by
  the module's name) with a non-negative diagonal: the layer's input second moments
  E[x xᵀ];
* ``kfac`` — two symmetric float32 matrices with non-negative diagonals per ``nn.Linear`` and
  ungrouped ``nn.Conv2d`` layer (:func:`kfac_layers`): ``<layer>.A`` ``[d, d]`` over the
  layer's inputs (d = in_features, or in_channels·kh·kw for a convolution, plus 1 where the
  layer has a bias) and ``<layer>.G`` ``[out, out]`` over its output gradients — a Kronecker
  factored curvature A ⊗ G (FedLPA's and FedFisher's K-FAC).

Every entry must be finite. The receiver builds the reference once per architecture on the
meta device (shapes only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import nn

from oneshotfl.models import MODELS, create_model
from oneshotfl.payload import Payload
from oneshotfl.protocol.spec import FieldGroup, ModelSpec, PayloadError, WireDims
from oneshotfl.protocol.validate import expected_arch

StatisticsKind = Literal["diagonal", "gram", "kfac"]

SYMMETRY_TOLERANCE = 1e-4
"""|G − Gᵀ| may reach this fraction of max |G| (float32 sums in another order)."""

_SHAPES: dict[tuple[str, str, int, int, int], dict[str, tuple[int, ...]]] = {}


def linear_layers(model: nn.Module) -> dict[str, nn.Linear]:
    """The model's ``nn.Linear`` modules by name (the layers RegMean merges in closed form)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}


def kfac_layers(model: nn.Module) -> dict[str, nn.Linear | nn.Conv2d]:
    """The model's layers with a Kronecker-factored curvature: ``nn.Linear`` and ``nn.Conv2d``
    with ``groups == 1`` (a depthwise convolution, like BatchNorm, has none)."""
    return {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) or (isinstance(m, nn.Conv2d) and m.groups == 1)
    }


def kfac_input_size(layer: nn.Linear | nn.Conv2d) -> int:
    """d, the side of a layer's factor A: its weight's fan-in, plus 1 for a bias."""
    fan_in = int(layer.weight[0].numel())
    return fan_in + (layer.bias is not None)


def statistic_shapes(arch: str, dims: WireDims, kind: StatisticsKind) -> dict[str, tuple[int, ...]]:
    """The keys and shapes of ``kind`` statistics for ``arch`` built for this federation."""
    key = (arch, kind, dims.in_channels, dims.num_classes, dims.image_size)
    if key not in _SHAPES:
        with torch.device("meta"):
            model = create_model(arch, dims.in_channels, dims.num_classes, dims.image_size)
        if kind == "diagonal":
            shapes = {k: tuple(p.shape) for k, p in model.named_parameters()}
        elif kind == "gram":
            shapes = {k: (m.in_features, m.in_features) for k, m in linear_layers(model).items()}
        else:
            shapes = {}
            for k, m in kfac_layers(model).items():
                shapes[f"{k}.A"] = (kfac_input_size(m),) * 2
                shapes[f"{k}.G"] = (m.weight.shape[0],) * 2
        _SHAPES[key] = shapes
    return _SHAPES[key]


@dataclass(frozen=True)
class LayerStatistics(FieldGroup):
    """Statistics ``<prefix>.<key>`` of the model in field ``of`` (see the module docs)."""

    prefix: str
    kind: StatisticsKind
    of: ModelSpec = field(default_factory=ModelSpec)

    def check(self, payload: Payload, dims: WireDims, client: int | None) -> None:
        arch = str(payload.scalars[self.of.arch_key])
        want = statistic_shapes(arch, self.of.model_dims(dims), self.kind)
        got = {k[len(self.prefix) + 1 :]: v for k, v in payload.arrays.items() if self.owns(k)}
        what = {"diagonal": "a diagonal statistic", "gram": "an input Gram matrix"}.get(
            self.kind, "a Kronecker factor"
        )
        for key in sorted(set(want) - set(got)):
            raise PayloadError(f"{self.prefix}.{key}", f"{what} of {arch}", "nothing", client)
        for key in sorted(set(got) - set(want)):
            raise PayloadError(f"{self.prefix}.{key}", f"no such layer in {arch}", "one", client)
        for key, shape in want.items():
            _check_statistic(f"{self.prefix}.{key}", got[key], shape, self.kind, client)

    def bound(self, dims: WireDims, client: int | None) -> tuple[int, int] | None:
        configured = expected_arch(self.of, dims, client)
        archs = [configured] if configured else list(self.of.archs or MODELS.names())
        largest, count = 0, 0
        for arch in archs:
            try:
                shapes = statistic_shapes(arch, self.of.model_dims(dims), self.kind)
            except Exception:  # cannot be built here: a payload naming it is refused anyway
                continue
            largest = max(largest, 4 * sum(int(np.prod(s)) for s in shapes.values()))
            count = max(count, len(shapes))
        return (largest, count) if count else None


def _check_statistic(
    name: str, value: np.ndarray, shape: tuple[int, ...], kind: StatisticsKind, client: int | None
) -> None:
    if tuple(value.shape) != shape:
        raise PayloadError(name, f"shape {shape}", str(value.shape), client)
    if value.dtype.name != "float32":
        raise PayloadError(name, "dtype float32", value.dtype.name, client)
    if not np.isfinite(value).all():
        raise PayloadError(name, "finite values", "NaN/inf entries", client)
    diagonal = value if kind == "diagonal" else np.diagonal(value)
    if (diagonal < 0).any():
        where = "entries" if kind == "diagonal" else "diagonal entries"
        raise PayloadError(
            name, f"non-negative {where}", f"{int((diagonal < 0).sum())} negative", client
        )
    if kind != "diagonal":
        scale = float(np.abs(value).max(initial=0.0))
        if float(np.abs(value - value.T).max(initial=0.0)) > SYMMETRY_TOLERANCE * max(scale, 1e-30):
            raise PayloadError(name, "a symmetric matrix", "an asymmetric one", client)
