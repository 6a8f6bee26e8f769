"""Payload specifications (validated on receipt by :mod:`oneshotfl.protocol.validate`).

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
:func:`~oneshotfl.protocol.wire.byte_limit` gives the most bytes a payload of the spec can
take, so oversize bytes are refused before anything is decoded.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from oneshotfl.data.types import TaskInfo
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
    """Fields named ``<prefix>.<key>`` the group checks itself, after the payload's models:
    arrays whose keys and shapes follow a model of the same payload (per-layer statistics:
    :mod:`oneshotfl.protocol.layer_stats`), or a set of models keyed by client
    (:mod:`oneshotfl.protocol.model_set`, whose architecture scalars it owns too)."""

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
