"""Payload specifications and their validation on receipt.

A method declares what one client sends as a :class:`PayloadSpec`. Shapes may use symbolic
dimensions: ``"C"`` (number of classes), ``"CH"``, ``"H"``, ``"W"`` (input channels and size),
``"N_pub"`` (public pool size), ``"N_max"`` (the most training examples one client can hold:
the federation's training pool, a public fact), or any other name, which must then take one
value across the payload (e.g. ``"N"`` shared by latents and labels). Models travel as an
architecture name from the model registry plus a state dict; they are checked against a
freshly built reference — of the sending client's configured architecture when the receiver
knows it.

Nothing a client reports is trusted unbounded: integers must fit in int64 and floats be
finite, a count may be bounded by ``N_max`` or tied to the rows it sends (``equals``), and
:func:`byte_limit` gives the most bytes a payload of the spec can take, so oversize bytes are
refused before anything is decoded.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from oneshotfl.data.types import TaskInfo
from oneshotfl.models import MODELS, create_model
from oneshotfl.models.state import model_from_state
from oneshotfl.payload import Payload

Dim = int | str


class PayloadError(ValueError):
    """A payload that does not match its method's :class:`PayloadSpec`.

    Attributes:
        client: the sending client's id (``None`` when unknown).
        field: the offending field name.
    """

    def __init__(self, field: str, expected: str, got: str, client: int | None = None) -> None:
        self.client = client
        self.field = field
        who = f"client {client}: " if client is not None else ""
        super().__init__(f"{who}payload field {field!r}: expected {expected}, got {got}")


@dataclass(frozen=True)
class ArraySpec:
    """One named array.

    Attributes:
        name: the array's key in the payload.
        shape: dimensions, each an int or a symbol (see module docs).
        dtypes: allowed dtype names.
        value_range: inclusive (low, high) every element must lie in, or ``None``.
        simplex: rows along the last axis must sum to 1 (probability vectors).
        min_sum: the least the elements may sum to (e.g. 1 for label counts), or ``None``.
        max_sum: the most the elements may sum to (e.g. ``N_max`` for label counts), or
            ``None``.
    """

    name: str
    shape: tuple[Dim, ...]
    dtypes: tuple[str, ...] = ("float32",)
    value_range: tuple[float, float] | None = None
    simplex: bool = False
    min_sum: float | None = None
    max_sum: float | None = None


@dataclass(frozen=True)
class ModelSpec:
    """A model: scalar ``<prefix>.arch`` plus arrays ``<prefix>.<state-dict key>``.

    Attributes:
        prefix: field prefix (``"model"``).
        extra_outputs: outputs beyond the class count (1 for an abstention class).
        archs: allowed architectures; empty means any registered model.
        input_dims: ``(in_channels, image_size)`` of the model's input when it is not the
            task's images — a head on d-dimensional embeddings is ``(d, 1)``.
    """

    prefix: str = "model"
    extra_outputs: int = 0
    archs: tuple[str, ...] = ()
    input_dims: tuple[int, int] | None = None

    def model_dims(self, dims: WireDims) -> WireDims:
        """``dims`` with the input replaced by :attr:`input_dims` when set."""
        if self.input_dims is None:
            return dims
        channels, size = self.input_dims
        return replace(dims, in_channels=channels, image_size=size)

    @property
    def arch_key(self) -> str:
        return f"{self.prefix}.arch"

    def owns(self, key: str) -> bool:
        return key.startswith(self.prefix + ".")


@dataclass(frozen=True)
class ScalarSpec:
    """One named scalar of a given Python type (``int`` also accepts a bool-free integer).

    Attributes:
        minimum: the least value, or ``None``.
        maximum: the largest value: a number, or a symbol of the wire dims (``"N_max"``);
            an unbound symbol sets no bound.
        equals: a symbol bound by the payload's array shapes the value must equal (a count
            the payload proves by the rows it sends, e.g. ``"N"``).
    """

    name: str
    kind: type = float
    minimum: float | None = None
    maximum: float | str | None = None
    equals: str | None = None


def n_examples_spec() -> ScalarSpec:
    """The self-reported training-set size: an integer in [1, N_max]."""
    return ScalarSpec("n_examples", int, 1, maximum="N_max")


class FieldGroup(ABC):
    """Arrays named ``<prefix>.<key>`` whose keys and shapes follow a model of the same
    payload (per-layer statistics: :mod:`oneshotfl.protocol.layer_stats`); the group checks
    them itself, after the payload's models."""

    prefix: str

    def owns(self, key: str) -> bool:
        return key.startswith(self.prefix + ".")

    @abstractmethod
    def check(self, payload: Payload, dims: WireDims, client: int | None) -> None:
        """Raise :class:`PayloadError` on the first problem."""

    @abstractmethod
    def bound(self, dims: WireDims, client: int | None) -> tuple[int, int] | None:
        """``(bytes, tensors)`` at most, or ``None`` when not bounded here."""


@dataclass(frozen=True)
class PayloadSpec:
    """Everything one client's payload must contain, and nothing else."""

    arrays: tuple[ArraySpec, ...] = ()
    models: tuple[ModelSpec, ...] = ()
    scalars: tuple[ScalarSpec, ...] = ()
    groups: tuple[FieldGroup, ...] = ()


@dataclass(frozen=True)
class WireDims:
    """The federation's public facts that symbolic dimensions resolve to."""

    num_classes: int
    in_channels: int
    image_size: int
    public_size: int = 0
    extra: Mapping[str, int] = field(default_factory=dict)
    archs: tuple[str, ...] = ()  # the federation's client architectures (public configuration)
    max_examples: int = 0  # N_max: the federation's training pool (0 = not known here)

    def symbols(self) -> dict[str, int]:
        base = {
            "C": self.num_classes,
            "CH": self.in_channels,
            "H": self.image_size,
            "W": self.image_size,
            "N_pub": self.public_size,
        }
        if self.max_examples > 0:
            base["N_max"] = self.max_examples
        return {**base, **self.extra}

    def client_arch(self, client: int | None) -> str | None:
        """The architecture client ``client`` is configured with, when known here."""
        if client is None or not 0 <= client < len(self.archs):
            return None
        return self.archs[client]


def task_dims(
    task: TaskInfo,
    public_size: int = 0,
    embedding_dim: int | None = None,
    archs: tuple[str, ...] = (),
    max_examples: int = 0,
) -> WireDims:
    """The wire dims of a task: its classes and images, the public pool's size, ``D``, the
    shared encoder's embedding size, when the federation has an encoder, and the clients'
    architectures (a payload whose shapes follow the architecture, e.g. MA-Echo's
    projections, is specified from them) and ``N_max``, the federation's training pool."""
    extra = {} if embedding_dim is None else {"D": embedding_dim}
    return WireDims(
        task.num_classes, task.in_channels, task.image_size, public_size, extra, archs, max_examples
    )


def validate_payload(
    payload: Payload, spec: PayloadSpec, dims: WireDims, client: int | None = None
) -> None:
    """Check ``payload`` against ``spec``; raise :class:`PayloadError` on the first problem.

    Checks names (missing and unexpected), dtypes, shapes, finite values, value ranges,
    probability rows, scalar types, and each model's architecture, keys, shapes, dtypes and
    class count.
    """
    owners: list[ModelSpec | FieldGroup] = [*spec.models, *spec.groups]
    model_keys = {k for k in payload.arrays if any(m.owns(k) for m in owners)}
    _check_names(payload, spec, model_keys, client)
    bound: dict[str, int] = dims.symbols()
    for array_spec in spec.arrays:
        _check_array(payload.arrays[array_spec.name], array_spec, bound, client)
    for scalar_spec in spec.scalars:
        _check_scalar(payload.scalars[scalar_spec.name], scalar_spec, bound, client)
    for model_spec in spec.models:
        _check_model(payload, model_spec, dims, client)
    for group in spec.groups:
        group.check(payload, dims, client)


def _check_names(
    payload: Payload, spec: PayloadSpec, model_keys: set[str], client: int | None
) -> None:
    want_arrays = {a.name for a in spec.arrays}
    want_scalars = {s.name for s in spec.scalars} | {m.arch_key for m in spec.models}
    for name in sorted(want_arrays - set(payload.arrays)):
        raise PayloadError(name, "an array", "nothing (missing)", client)
    for name in sorted(want_scalars - set(payload.scalars)):
        raise PayloadError(name, "a scalar", "nothing (missing)", client)
    for name in sorted(set(payload.arrays) - want_arrays - model_keys):
        raise PayloadError(name, "no such array in the spec", "an unexpected array", client)
    for name in sorted(set(payload.scalars) - want_scalars):
        raise PayloadError(name, "no such scalar in the spec", "an unexpected scalar", client)


def _check_array(
    value: np.ndarray, spec: ArraySpec, bound: dict[str, int], client: int | None
) -> None:
    if value.dtype.name not in spec.dtypes:
        raise PayloadError(spec.name, f"dtype in {list(spec.dtypes)}", value.dtype.name, client)
    if value.ndim != len(spec.shape):
        raise PayloadError(
            spec.name, f"{len(spec.shape)} dims {spec.shape}", f"shape {value.shape}", client
        )
    for axis, (dim, got) in enumerate(zip(spec.shape, value.shape, strict=True)):
        want = dim if isinstance(dim, int) else bound.setdefault(dim, got)
        if want != got:
            label = "the class count " if dim == "C" else ""
            raise PayloadError(
                spec.name, f"{label}{want} on axis {axis} ({dim})", f"shape {value.shape}", client
            )
    _check_values(value, spec, client)


def _check_values(value: np.ndarray, spec: ArraySpec, client: int | None) -> None:
    if value.size == 0:
        return
    if value.dtype.kind == "f" and not np.isfinite(value).all():
        bad = int((~np.isfinite(value)).sum())
        raise PayloadError(spec.name, "finite values", f"{bad} NaN/inf entries", client)
    if spec.value_range is not None:
        low, high = spec.value_range
        vmin, vmax = value.min(), value.max()
        if vmin < low or vmax > high:
            raise PayloadError(
                spec.name, f"values in [{low}, {high}]", f"range [{vmin}, {vmax}]", client
            )
    total = float(value.astype(np.float64).sum())
    if spec.min_sum is not None and total < spec.min_sum:
        raise PayloadError(
            spec.name, f"elements summing to at least {spec.min_sum:g}", "less", client
        )
    if spec.max_sum is not None and total > spec.max_sum:
        raise PayloadError(
            spec.name, f"elements summing to at most {spec.max_sum:g}", f"{total:g}", client
        )
    if spec.simplex:
        sums = value.astype(np.float64).sum(axis=-1)
        worst = float(np.abs(sums - 1.0).max())
        if worst > 1e-2:
            raise PayloadError(spec.name, "rows summing to 1", f"a row off by {worst:.3g}", client)


INT64 = (-(2**63), 2**63 - 1)


def _check_scalar(
    value: object, spec: ScalarSpec, bound: Mapping[str, int], client: int | None
) -> None:
    ok = isinstance(value, spec.kind) and not (spec.kind is int and isinstance(value, bool))
    if spec.kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise PayloadError(spec.name, spec.kind.__name__, type(value).__name__, client)
    if not isinstance(value, int | float) or isinstance(value, bool):
        return
    if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
        raise PayloadError(
            spec.name, "an integer that fits in int64", f"{len(str(value))} digits", client
        )
    if isinstance(value, float) and not np.isfinite(value):
        raise PayloadError(spec.name, "a finite number", repr(value), client)
    if spec.minimum is not None and value < spec.minimum:
        raise PayloadError(spec.name, f"a value >= {spec.minimum}", repr(value), client)
    top = bound.get(spec.maximum) if isinstance(spec.maximum, str) else spec.maximum
    if top is not None and value > top:
        what = f" ({spec.maximum})" if isinstance(spec.maximum, str) else ""
        raise PayloadError(spec.name, f"a value <= {top}{what}", repr(value), client)
    if spec.equals is not None and spec.equals in bound and value != bound[spec.equals]:
        raise PayloadError(
            spec.name, f"{bound[spec.equals]}, the rows sent ({spec.equals})", repr(value), client
        )


def _check_model(payload: Payload, spec: ModelSpec, dims: WireDims, client: int | None) -> None:
    arch = payload.scalars[spec.arch_key]
    allowed = spec.archs or tuple(MODELS.names())
    if not isinstance(arch, str) or arch not in allowed:
        raise PayloadError(spec.arch_key, f"an architecture in {list(allowed)}", repr(arch), client)
    configured = expected_arch(spec, dims, client)
    if configured is not None and arch != configured:
        raise PayloadError(
            spec.arch_key,
            f"{configured!r}, the architecture this client is configured with",
            repr(arch),
            client,
        )
    try:
        reference = reference_state(arch, spec.model_dims(dims), spec.extra_outputs)
    except Exception as exc:  # the registry refuses this task (e.g. an image too small)
        raise PayloadError(
            spec.arch_key,
            "an architecture that can be built for this task",
            f"{arch!r} ({type(exc).__name__}: {exc})",
            client,
        ) from None
    got = {k[len(spec.prefix) + 1 :]: v for k, v in payload.arrays.items() if spec.owns(k)}
    for key in sorted(set(reference) - set(got)):
        raise PayloadError(f"{spec.prefix}.{key}", f"a tensor of {arch}", "nothing", client)
    for key in sorted(set(got) - set(reference)):
        raise PayloadError(f"{spec.prefix}.{key}", f"no such tensor in {arch}", "one", client)
    for key, ref in reference.items():
        value, name = got[key], f"{spec.prefix}.{key}"
        if tuple(value.shape) != tuple(ref.shape):
            what = "the class count in " if key.startswith("head.") else ""
            raise PayloadError(name, f"{what}shape {tuple(ref.shape)}", str(value.shape), client)
        want_dtype = str(ref.dtype).removeprefix("torch.")
        if value.dtype.name != want_dtype:
            raise PayloadError(name, f"dtype {want_dtype}", value.dtype.name, client)
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            raise PayloadError(name, "finite values", "NaN/inf entries", client)
        if key.endswith("running_var") and (value < 0).any():
            raise PayloadError(name, "non-negative BatchNorm variances", "negative ones", client)
    _check_outputs(payload, spec, dims, client)


def _check_outputs(payload: Payload, spec: ModelSpec, dims: WireDims, client: int | None) -> None:
    """The model must answer a zero input with finite logits (weights that are each finite
    can still overflow, or a BatchNorm layer divide by a negative variance's root)."""
    model_dims = spec.model_dims(dims)
    model = model_from_state(
        str(payload.scalars[spec.arch_key]),
        payload.arrays,
        model_dims.in_channels,
        model_dims.num_classes + spec.extra_outputs,
        model_dims.image_size,
        spec.prefix,
    ).eval()
    side, device = model_dims.image_size, next(model.parameters()).device
    probe = torch.zeros(1, model_dims.in_channels, side, side, device=device)
    with torch.no_grad():
        out = model(probe)
    if not torch.isfinite(out).all():
        raise PayloadError(
            spec.arch_key,
            "a model with finite outputs",
            "non-finite logits on a zero input",
            client,
        )


def expected_arch(spec: ModelSpec, dims: WireDims, client: int | None) -> str | None:
    """The one architecture a model field may carry: the sending client's configured one for a
    model of the task's inputs without an allowed list (a head on embeddings, or a spec that
    names its architectures, is not the client's classifier); ``None`` when not known here."""
    if spec.archs or spec.input_dims is not None:
        return None
    return dims.client_arch(client)


_REFERENCE_CACHE: dict[tuple[str, int, int, int], dict[str, torch.Tensor]] = {}


def reference_state(arch: str, dims: WireDims, extra_outputs: int = 0) -> dict[str, torch.Tensor]:
    """The state dict (shapes and dtypes) of ``arch`` built for this federation; memoised."""
    key = (arch, dims.in_channels, dims.num_classes + extra_outputs, dims.image_size)
    if key not in _REFERENCE_CACHE:
        with torch.device("meta"):  # shapes and dtypes only: no memory, no RNG draws
            model = create_model(arch, dims.in_channels, key[2], dims.image_size)
        _REFERENCE_CACHE[key] = {k: v.detach() for k, v in model.state_dict().items()}
    return _REFERENCE_CACHE[key]
