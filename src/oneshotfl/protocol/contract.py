"""The method contract: methods declare, runners execute.

A method is a registered :class:`Method` subclass with

* ``requires`` — what it needs from the federation (:class:`Requires`), checked by the runner
  before any training;
* ``Config`` — a frozen :class:`~oneshotfl.params.Params` dataclass of its hyper-parameters;
* :meth:`Method.payload_spec` — what one client sends, checked on receipt;
* :meth:`Method.client_update` — runs on one client and sees only that client's data;
* :meth:`Method.local_model` — the model the client trained, if any (its local accuracy is
  reported; it is never sent);
* a receiver: :meth:`Method.aggregate` for the **star** topology — it runs on the server and
  sees only payloads and what the server legitimately has (:class:`ServerContext` has no field
  through which client data could flow) — or :meth:`PeerMethod.aggregate_for` for the **peer**
  topology, where every client receives its graph neighbours' payloads and builds its own
  model with its own private context; a star method whose server step is a sum over
  clients also offers it as a :meth:`Method.fold` (:mod:`oneshotfl.protocol.fold`), which the
  runner feeds one payload at a time.

Contexts are frozen: a round number and a broadcast are inputs of a client's context
(:meth:`ClientContext.for_round`), never fields written from outside. Nothing here loops over
clients, touches transport, or imports flwr.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import nn

from oneshotfl.data.types import LabelledData, TaskInfo, UnlabelledData
from oneshotfl.params import Params
from oneshotfl.payload import Payload
from oneshotfl.protocol.fold import Fold
from oneshotfl.protocol.limits import KnownLimit
from oneshotfl.protocol.outcome import Outcome
from oneshotfl.protocol.requires import Requires as Requires
from oneshotfl.protocol.requires import Topology as Topology
from oneshotfl.protocol.requires import wire_dims as wire_dims
from oneshotfl.protocol.spec import PayloadSpec, WireDims
from oneshotfl.training.loop import TrainConfig, budget_epochs
from oneshotfl.training.recipe import ClientRecipe
from oneshotfl.training.services import ArtefactStore, Encoder, NullTracker, Tracker


@dataclass(frozen=True)
class ClientContext:
    """Everything one client may read: its own data, public facts, its training settings and
    handles to its services (its view of the artefact store, the tracker, the frozen encoder).
    Data only: what acts on it — training a recipe once, a cached artefact — is the training
    layer's (:mod:`oneshotfl.training.services`); a simulated attack is the transport's.

    Attributes:
        client_id: this client's id.
        data: the client's private training data.
        val: the client's private validation split (``None`` when ``val_fraction`` is 0).
        task: public task facts.
        arch: this client's model architecture.
        train_config: the federation's local training settings, its budget resolved over
            this client's data (``epochs`` already meets the ``min_steps`` floor:
            :func:`~oneshotfl.training.loop.resolve_budget`); ``train_config.init`` is the
            run's initialisation of every model a method builds.
        public: the unlabelled public pool, if the federation has one.
        device: compute device.
        seed: the model-seed root (streams derive from it).
        store: artefact cache.
        tracker: progress display.
        encoder: the shared frozen encoder, when the federation has one.
        round: the communication round, from 0 (always 0 for one-shot methods).
        broadcast: the server's validated message of this round (multi-round methods
            only; ``None`` in one-shot methods, whose clients hear nothing from the server).
        client_archs: every client's architecture by client id (public configuration; a
            peer receiver checks its senders' models against it).
        max_examples: ``N_max``, the most examples one client can hold (0: unknown).
        neighbours: on a peer receiver, its in-neighbours in the graph (public topology; a
            method's encounter schedule is drawn over them); empty elsewhere.
        topology_seed: on a peer receiver, the partition seed the graph and the encounter
            schedules of :meth:`PeerMethod.schedule` are drawn from.
        schedule: on a peer receiver, its encounter schedule as the run's plan drew it once
            (:meth:`PeerMethod.schedule`: the senders of each collection window); empty
            elsewhere.
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
    encoder: Encoder | None = None
    round: int = 0
    broadcast: Payload | None = None
    client_archs: tuple[str, ...] = ()
    max_examples: int = 0
    neighbours: tuple[int, ...] = ()
    topology_seed: int = 0
    schedule: tuple[tuple[int, ...], ...] = ()

    @cached_property
    def data_fingerprint(self) -> str:
        """A hash of this client's training data (part of every artefact key)."""
        return self.data.fingerprint()

    @property
    def dims(self) -> WireDims:
        """The wire dims payloads resolve against (``D`` when there is an encoder)."""
        return wire_dims(self.task, self.public, self.encoder, self.client_archs, self.max_examples)

    def for_round(self, round_index: int, broadcast: Payload | None) -> ClientContext:
        """This context in round ``round_index``, with the server's validated broadcast."""
        return dataclasses.replace(self, round=round_index, broadcast=broadcast)

    def recipe(self, **changes: Any) -> ClientRecipe:
        """The federation's plain local-training recipe for this client (ERM on its own
        architecture, initialisation and training settings), with ``changes`` applied."""
        plain = ClientRecipe(self.arch, self.train_config)
        return dataclasses.replace(plain, **changes)

    def epochs_for(self, epochs: int | None) -> int:
        """A method's own epoch knob as a budget on this client: ``None`` is the federation's
        (already resolved) epochs; a number gets the federation's ``min_steps`` floor over
        this client's data, so a curriculum built for it matches what training runs."""
        if epochs is None:
            return self.train_config.epochs
        own = dataclasses.replace(self.train_config, epochs=epochs)
        return budget_epochs(own, len(self.data))


@dataclass(frozen=True)
class ServerContext:
    """What the server legitimately has. By construction it holds no client data.

    Attributes:
        task: public task facts.
        public: the public pool's inputs, never its labels.
        server_arch: the configured server architecture, if any.
        client_archs: the federation's configured client architectures, by client id
            (public configuration, not data).
        train_config: training settings for server-side learning; with a public pool, its
            epochs already meet the ``server_steps`` floor over the pool (and ``min_steps``
            is 0, so every server training runs exactly ``epochs``).
        client_train_config: the clients' local training settings (public configuration).
        device: compute device.
        seed: the model-seed root.
        store: artefact cache.
        tracker: progress display.
        encoder: the shared frozen encoder, when the federation has one.
        max_examples: ``N_max``, the most examples one client can hold (0: unknown).
        round: the round whose payloads :meth:`Method.aggregate` builds from, from 0.
        previous: the outcome the server built in the round before (``None`` in round 0
            and in one-shot methods): a multi-round method's server state travels in it.
    """

    task: TaskInfo
    public: UnlabelledData | None
    server_arch: str | None
    client_archs: tuple[str, ...]
    train_config: TrainConfig
    client_train_config: TrainConfig
    device: torch.device
    seed: int
    store: ArtefactStore = field(default_factory=ArtefactStore)
    tracker: Tracker = field(default_factory=NullTracker)
    encoder: Encoder | None = None
    max_examples: int = 0
    round: int = 0
    previous: Outcome | None = None

    @property
    def dims(self) -> WireDims:
        """The wire dims payloads resolve against (``D`` when there is an encoder)."""
        return wire_dims(self.task, self.public, self.encoder, self.client_archs, self.max_examples)

    def for_round(self, round_index: int, previous: Outcome | None) -> ServerContext:
        """This context aggregating round ``round_index``, after the outcome ``previous``."""
        return dataclasses.replace(self, round=round_index, previous=previous)


@dataclass(frozen=True)
class NoConfig(Params):
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
        known_limits: the settings where it is expected below training alone or the plain
            ensemble, and why (:mod:`oneshotfl.protocol.limits`; ``oneshotfl describe``).
        cost: what a run of it costs in the number of clients n, in words (``oneshotfl
            describe``): N is the examples the clients hold together, |P| the public pool.

    One-shot is the default: one call of ``client_update`` per client, one ``aggregate``.
    A multi-round method (star only: ``fedavg_rounds``, FENS's aggregator rounds) overrides
    :meth:`num_rounds`, :meth:`broadcast_spec` and :meth:`server_message` (and
    :meth:`round_payload_spec` when its clients send something else after round 0); the
    runner then repeats broadcast → clients → aggregate, counting every round's bytes, hands
    :meth:`aggregate` the round and the previous outcome (``ctx.round``, ``ctx.previous``)
    and evaluates the outcome of the rounds :meth:`evaluates_round` names.
    """

    name: ClassVar[str] = ""
    requires: ClassVar[Requires] = Requires()
    Config: ClassVar[type] = NoConfig
    communicates: ClassVar[bool] = True
    known_limits: ClassVar[tuple[KnownLimit, ...]] = ()
    cost: ClassVar[str] = "clients: one update each on their own shard; server: not stated"
    _server_free: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A method's declared topology and its base class must agree (the engine dispatches
        on the declaration): peer ⇔ :class:`PeerMethod`."""
        super().__init_subclass__(**kwargs)
        if (cls.requires.topology is Topology.PEER) != cls._server_free:
            want = "topology=Topology.PEER" if cls._server_free else "a star topology"
            raise TypeError(
                f"{cls.__qualname__}: a {'PeerMethod' if cls._server_free else 'Method'} must "
                f"declare {want} in requires, got {cls.requires.topology}"
            )

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

    def fold(self, ctx: ServerContext) -> Fold | None:
        """The server step as a fold over the payloads, one at a time
        (:mod:`oneshotfl.protocol.fold`), when it is a sum over clients; ``None`` (the
        default): it needs every payload together, and :meth:`aggregate` gets them."""
        return None

    def local_model(self, ctx: ClientContext) -> nn.Module | None:
        """The model this method's client trained (for its local accuracy), or ``None``
        when it trains no classifier of its own. Called after :meth:`client_update` on the
        same context, so a recipe's model is a cache hit."""
        return None

    def client_recipe(self, ctx: ClientContext) -> ClientRecipe | None:
        """The recipe :meth:`client_update` of round 0 trains through ``train_model`` on
        ``ctx``, when it trains one (``None``: none, or not known beforehand). A runner with
        ``client_batch > 1`` trains it for many clients together before their updates
        (:mod:`oneshotfl.training.vectorised`), and the update then finds it trained."""
        return None

    def setting_problems(self, client_train: TrainConfig) -> list[str]:
        """What this method cannot do with the federation's client training settings (e.g. a
        pruning schedule longer than the epoch budget), checked before any training."""
        return []

    def client_facts(self, ctx: ClientContext) -> dict[str, float]:
        """Facts about this client's update for the result file — measured on the client,
        never sent to a receiver (e.g. how much of its private data its message discloses).
        Called after :meth:`client_update` on the same context; none by default."""
        return {}

    def num_rounds(self) -> int:
        """Communication rounds (1 for every one-shot method)."""
        return 1

    def round_payload_spec(self, dims: WireDims, round_index: int) -> PayloadSpec:
        """What one client's payload of round ``round_index`` must hold (default: the same
        :meth:`payload_spec` every round)."""
        return self.payload_spec(dims)

    def broadcast_spec(self, dims: WireDims, round_index: int) -> PayloadSpec | None:
        """What the server's message before round ``round_index`` must hold (``None``: it
        sends none)."""
        return None

    def evaluates_round(self, round_index: int) -> bool:
        """Whether the runner evaluates the outcome of round ``round_index`` for the run's
        ``rounds_history`` (the last round's is always evaluated); default: every round."""
        return True

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

    def notes(self, diagnostics: Mapping[str, Any]) -> list[str]:
        """One-line notes on what this run did that a reader of its accuracy should know,
        read from its diagnostics (a server method's outcome ``info``; a peer method's
        receiver id → its outcome's ``info``). The engine logs them and keeps them in the
        result (``notes``). Default: none."""
        return []

    def describe(self) -> dict[str, Any]:
        """Name and resolved hyper-parameters, for result files."""
        config: Any = self.config
        is_instance = dataclasses.is_dataclass(config) and not isinstance(config, type)
        params = dataclasses.asdict(config) if is_instance else {}
        return {"method": self.name, "params": params}


class PeerMethod(Method[ConfigT]):
    """A server-free method: every client sends its one message to the neighbours the graph
    (and :meth:`schedule`) name, and each receiver builds its own model from what it got
    and its own private context (:meth:`aggregate_for`). The result is per client."""

    requires: ClassVar[Requires] = Requires(topology=Topology.PEER)
    _server_free: ClassVar[bool] = True

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        raise TypeError(f"{self.name} is server-free: there is no server to aggregate on")

    @abstractmethod
    def aggregate_for(self, ctx: ClientContext, payloads: Mapping[int, Payload]) -> Outcome:
        """Run on the receiving client: build its model from its neighbours' validated
        payloads (sender id → payload, ascending; possibly empty) and its own context."""

    def senders_for(self, receiver: int, neighbours: Sequence[int], seed: int) -> tuple[int, ...]:
        """Which of the receiver's graph neighbours send to it (default: all of them); only
        these edges carry bytes. A method whose senders arrive in collection windows
        overrides :meth:`schedule` instead."""
        return tuple(neighbours)

    def schedule(
        self, receiver: int, neighbours: Sequence[int], seed: int
    ) -> tuple[tuple[int, ...], ...]:
        """The receiver's encounter schedule: which of its graph neighbours send to it, in
        which collection window, drawn from ``seed`` (the partition seed). The run's plan
        draws it once per receiver (:func:`oneshotfl.runner.plan.draw_schedules`); the
        engine routes the union of its windows and the receiver's context holds it
        (``ClientContext.schedule``). Default: one window, :meth:`senders_for`."""
        return (tuple(self.senders_for(receiver, neighbours, seed)),)
