"""The method contract: methods declare, runners execute.

A method is a registered :class:`Method` subclass with

* ``requires`` — what it needs from the federation (:class:`Requires`), checked by the runner
  before any training;
* ``Config`` — a frozen dataclass of its hyper-parameters, validated in ``__post_init__``;
* :meth:`Method.payload_spec` — what one client sends, checked on receipt;
* :meth:`Method.client_update` — runs on one client and sees only that client's data;
* :meth:`Method.aggregate` — runs on the server and sees only payloads and what the server
  legitimately has: :class:`ServerContext` has no field through which client data could flow.

Nothing here loops over clients, touches transport, or imports flwr.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar, Generic, TypeVar

import torch

from oneshotfl.data.types import LabelledData, UnlabelledData
from oneshotfl.federation.artefacts import ArtefactStore, tensor_fingerprint
from oneshotfl.federation.outcome import Outcome
from oneshotfl.federation.payload import Payload
from oneshotfl.federation.spec import PayloadSpec, WireDims
from oneshotfl.training.loop import TrainConfig
from oneshotfl.training.progress import NullTracker, Tracker


class Topology(enum.StrEnum):
    """Who talks to whom: clients to one server, or clients to peers."""

    STAR = "star"
    PEER = "peer"


@dataclass(frozen=True)
class Requires:
    """What a method needs from the federation.

    Attributes:
        public_data: an unlabelled public pool (``public_size > 0``).
        shared_encoder: a frozen encoder known to every party.
        same_architecture: every client uses the same model architecture.
        server_model: a server architecture (``server_model``) is configured.
        topology: star (server) or peer (server-free).
        min_clients: fewest clients the method can work with.
    """

    public_data: bool = False
    shared_encoder: bool = False
    same_architecture: bool = False
    server_model: bool = False
    topology: Topology = Topology.STAR
    min_clients: int = 1


@dataclass(frozen=True)
class TaskInfo:
    """Public facts of the learning task that every party knows."""

    dataset: str
    num_classes: int
    in_channels: int
    image_size: int
    class_names: tuple[str, ...] = ()

    def dims(self, public_size: int = 0) -> WireDims:
        return WireDims(self.num_classes, self.in_channels, self.image_size, public_size)


@dataclass
class ClientContext:
    """Everything one client may use: its own data, public facts, and its tools.

    Attributes:
        client_id: this client's id.
        data: the client's private training data.
        val: the client's private validation split (``None`` when ``val_fraction`` is 0).
        task: public task facts.
        arch: this client's model architecture.
        train_config: the federation's local training settings.
        public: the unlabelled public pool, if the federation has one.
        device: compute device.
        seed: the model-seed root (streams derive from it).
        store: artefact cache.
        tracker: progress display.
        notes: facts a recipe records for the result file (``train_seconds``,
            ``cache_hit``); never sent anywhere.
        encoder: the shared frozen encoder (``Encoder``), when the federation has one.
        round: the communication round, from 0 (always 0 for one-shot methods).
        broadcast: the server's validated message of this round (multi-round methods
            only; ``None`` in one-shot methods, whose clients hear nothing from the server).
    """

    client_id: int
    data: LabelledData
    val: LabelledData | None
    task: TaskInfo
    arch: str
    train_config: TrainConfig
    public: UnlabelledData | None
    device: torch.device
    seed: int
    store: ArtefactStore = field(default_factory=ArtefactStore)
    tracker: Tracker = field(default_factory=NullTracker)
    notes: dict[str, float | bool] = field(default_factory=dict)
    encoder: Any = None
    round: int = 0
    broadcast: Payload | None = None

    @cached_property
    def data_fingerprint(self) -> str:
        """A hash of this client's training data (part of every artefact key)."""
        return tensor_fingerprint(self.data.x, self.data.y)

    @property
    def dims(self) -> WireDims:
        return self.task.dims(0 if self.public is None else len(self.public))


@dataclass
class ServerContext:
    """What the server legitimately has. By construction it holds no client data.

    Attributes:
        task: public task facts.
        public: the public pool's inputs, never its labels.
        server_arch: the configured server architecture, if any.
        client_archs: the federation's configured client architectures, by client id
            (public configuration, not data).
        train_config: training settings for server-side learning.
        client_train_config: the clients' local training settings (public configuration).
        num_clients: clients in the federation (including any that were rejected).
        device: compute device.
        seed: the model-seed root.
        store: artefact cache.
        tracker: progress display.
        encoder: the shared frozen encoder (``Encoder``), when the federation has one.
    """

    task: TaskInfo
    public: UnlabelledData | None
    server_arch: str | None
    client_archs: tuple[str, ...]
    train_config: TrainConfig
    client_train_config: TrainConfig
    num_clients: int
    device: torch.device
    seed: int
    store: ArtefactStore = field(default_factory=ArtefactStore)
    tracker: Tracker = field(default_factory=NullTracker)
    encoder: Any = None

    @property
    def dims(self) -> WireDims:
        return self.task.dims(0 if self.public is None else len(self.public))


@dataclass(frozen=True)
class NoConfig:
    """A method without hyper-parameters."""


ConfigT = TypeVar("ConfigT")


class Method(ABC, Generic[ConfigT]):
    """Base class of every registered method; see the module docs for the contract.

    Class attributes:
        name: registry name (set by the registry decorator).
        requires: federation requirements.
        Config: the hyper-parameter dataclass.
        communicates: ``False`` for reference methods that send nothing in reality
            (``local``): their payload only carries the model to the evaluator and counts
            as zero upload bytes.

    One-shot is the default: one call of ``client_update`` per client, one ``aggregate``.
    A multi-round reference method (``fedavg_rounds``) overrides :meth:`num_rounds`,
    :meth:`broadcast_spec` and :meth:`server_message`; the runner then repeats
    broadcast → clients → aggregate, counting every round's bytes, and evaluates the outcome
    of each round.
    """

    name: ClassVar[str] = ""
    requires: ClassVar[Requires] = Requires()
    Config: ClassVar[type] = NoConfig
    communicates: ClassVar[bool] = True

    def __init__(self, config: ConfigT | None = None) -> None:
        self.config: ConfigT = config if config is not None else self.Config()

    @abstractmethod
    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        """What one client's payload must hold."""

    @abstractmethod
    def client_update(self, ctx: ClientContext) -> Payload:
        """Run on one client; return its one message."""

    @abstractmethod
    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        """Build the outcome from validated payloads (client id → payload, ascending ids)."""

    def num_rounds(self) -> int:
        """Communication rounds (1 for every one-shot method)."""
        return 1

    def broadcast_spec(self, dims: WireDims) -> PayloadSpec | None:
        """What the server's per-round message must hold (``None``: it sends none)."""
        return None

    def server_message(
        self, round_index: int, previous: Outcome | None, ctx: ServerContext
    ) -> Payload | None:
        """The message broadcast to every client before round ``round_index``.

        Args:
            round_index: the round about to start, from 0.
            previous: the outcome of the previous round (``None`` before round 0).
            ctx: the server's context.
        """
        return None

    def describe(self) -> dict[str, Any]:
        """Name and resolved hyper-parameters, for result files."""
        config: Any = self.config
        is_instance = dataclasses.is_dataclass(config) and not isinstance(config, type)
        params = dataclasses.asdict(config) if is_instance else {}
        return {"method": self.name, "params": params}


def coerce_config(config_cls: type, params: Mapping[str, Any]) -> Any:
    """Build ``config_cls(**params)``, converting strings (from the CLI) to the field types.

    Raises:
        ValueError: for an unknown parameter or a value that does not convert.
    """
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(params) - set(fields))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {unknown} for {config_cls.__qualname__}; "
            f"expected some of {sorted(fields)}"
        )
    hints = typing.get_type_hints(config_cls)
    values = {k: _coerce(k, v, hints[k]) for k, v in params.items()}
    return config_cls(**values)


def _coerce(name: str, value: Any, hint: Any) -> Any:
    if not isinstance(value, str):
        if hint is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return value
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if value.lower() in ("none", "null"):
            return None
        hint = options[0] if len(options) == 1 else str
    try:
        if hint is bool:
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if hint in (int, float, str):
            return hint(value)
    except ValueError:
        raise ValueError(
            f"parameter {name!r}: expected {getattr(hint, '__name__', hint)}, got {value!r}"
        ) from None
    return value
