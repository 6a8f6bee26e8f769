"""The federation: what a run fixes once for all its methods, as a frozen value.

:meth:`Federation.prepare` turns a checked :class:`~oneshotfl.runner.plan.Plan` into a frozen
:class:`Federation` — the federated data carved from the dataset, the client architectures,
the device, the artefact cache, the shared encoder, the neighbour graph (when a peer method
runs) and the simulated attacks — checking only what needs the data (that every
architecture takes the task's input, that every method gets the images it needs, that an
attack can act on each method's payload).

The value has three views, one per party:

* :meth:`Federation.only` — the federation as one Flower node sees it: its own shard only;
* :meth:`Federation.client_context` / :meth:`Federation.receiver_context` — what one client's
  method reads, built by a transport (which also deals out the client's attack,
  :meth:`Federation.attack_of`, applied when its message leaves);
* :meth:`Federation.server_view` — what the server holds: a :class:`ServerView` without any
  client shard (the public pool, the test split, the public configuration), from which the
  engine builds the server's context and the result document is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from oneshotfl.data.datasets import load_dataset
from oneshotfl.data.feature_skew import dataset_stats
from oneshotfl.data.federated import (
    ClientShard,
    FederatedData,
    carve_federated_data,
    diagnostic_split,
)
from oneshotfl.data.types import Dataset, LabelledData, TaskInfo, UnlabelledData
from oneshotfl.devices import resolve_device
from oneshotfl.encoders import EncoderError, build_encoder
from oneshotfl.environment import data_hash
from oneshotfl.protocol.contract import ClientContext, Method, Requires, ServerContext, wire_dims
from oneshotfl.protocol.graph import Graph
from oneshotfl.protocol.spec import WireDims
from oneshotfl.runner.checks import check_encoder_fits, check_models_fit, image_problems
from oneshotfl.runner.config import ConfigError, ExperimentConfig
from oneshotfl.runner.errors import first_line, refuse
from oneshotfl.runner.ledger import ShardReport
from oneshotfl.runner.plan import Plan, Schedules
from oneshotfl.security.threats import Attack, build_attacks
from oneshotfl.training.artefacts import ArtefactStore, MemoBudget
from oneshotfl.training.encoder import Encoder
from oneshotfl.training.loop import resolve_budget
from oneshotfl.training.progress import NullTracker, Tracker


@dataclass(frozen=True)
class ServerView:
    """What the server holds: public facts and configuration, never a client's shard.

    Attributes:
        cfg: the experiment config (public configuration).
        task: the task's public facts.
        public: the unlabelled public pool, if the federation has one.
        test: the test split (evaluation only).
        archs: every client's architecture, by client id.
        device: compute device.
        store: the server's scoped view of the artefact cache.
        tracker: progress display.
        encoder: the shared frozen encoder, when configured.
        train_pool: ``N_max``, the most examples one client can claim.
        graph: the neighbour graph of peer methods (``None`` in a star-only run).
        schedules: per peer method (by key), every receiver's encounter schedule as the
            plan drew it.
        attacks: the simulated attack specs, by client id (``None``: an honest client).
        data_hash: a hash of the run's data (result file).
        client_examples: the training examples the clients hold together (result file).
        save_to: a run folder to save every star method's final model(s) into, or ``None``.
    """

    cfg: ExperimentConfig
    task: TaskInfo
    public: UnlabelledData | None
    test: LabelledData
    archs: tuple[str, ...]
    device: torch.device
    store: ArtefactStore
    tracker: Tracker
    encoder: Encoder | None
    train_pool: int
    graph: Graph | None
    schedules: Mapping[str, Schedules]
    attacks: tuple[str | None, ...]
    data_hash: str
    client_examples: int
    save_to: Path | None = None

    @property
    def dims(self) -> WireDims:
        """The public facts payload shapes resolve against (``D`` with an encoder)."""
        return wire_dims(self.task, self.public, self.encoder, self.archs, self.train_pool)

    def server_context(self, requires: Requires | None = None) -> ServerContext:
        """The server's context: public facts and configuration, no client data; no public
        pool either for a method whose ``requires`` say it is data-free."""
        data_free = requires is not None and requires.data_free
        public = None if data_free else self.public
        server = self.cfg.server_train_config()
        if public is not None:  # the server_steps floor, over the pool
            server = resolve_budget(server, len(public))
        return ServerContext(
            task=self.task,
            public=public,
            server_arch=self.cfg.server_model,
            client_archs=self.archs,
            train_config=replace(server, min_steps=0),
            client_train_config=self.cfg.client_train_config(),
            device=self.device,
            seed=self.cfg.seed,
            store=self.store,
            tracker=self.tracker,
            encoder=self.encoder,
            max_examples=self.train_pool,
        )


@dataclass(frozen=True)
class Federation:
    """A prepared federation (see the module docs).

    Attributes:
        cfg: the experiment config.
        data: the federated data (a Flower node holds only its own shard).
        archs: every client's architecture, by client id.
        device: compute device.
        store: artefact cache (each party gets its scoped view).
        tracker: progress display.
        encoder: the shared frozen encoder, when configured.
        train_pool: ``N_max`` on the wire, the most examples one client can claim: the
            config's ``max_client_examples``, else the examples the federation's clients
            hold together (train and validation).
        graph: the neighbour graph, drawn with the partition seed when a peer method runs.
        schedules: per peer method (by key), every receiver's encounter schedule (the plan's).
        attacks: what the simulated malicious clients do (``malicious``/``attack``), in turn.
        diagnostic_test: the test examples each client's own model is checked on (the
            config's ``diagnostic_examples``, a stratified sample; ``None``: the whole split).
    """

    cfg: ExperimentConfig
    data: FederatedData
    archs: tuple[str, ...]
    device: torch.device
    store: ArtefactStore
    tracker: Tracker
    encoder: Encoder | None = None
    train_pool: int = 0
    graph: Graph | None = None
    attacks: tuple[Attack, ...] = ()
    schedules: Mapping[str, Schedules] = field(default_factory=dict)
    diagnostic_test: LabelledData | None = None

    @property
    def diagnostics(self) -> LabelledData:
        """What each client's own model is checked on (see ``diagnostic_test``)."""
        return self.data.test if self.diagnostic_test is None else self.diagnostic_test

    @classmethod
    def prepare(
        cls,
        plan: Plan,
        tracker: Tracker | None = None,
        dataset: Dataset | None = None,
        lazy: bool = False,
    ) -> Federation:
        """Load the data (unless ``dataset`` is given), carve the federation, build the
        encoder; check what needs the data (see the module docs). ``lazy``: the shards hold
        indices into ``dataset`` and gather their rows when read (a Flower process: see
        :func:`~oneshotfl.data.federated.carve_federated_data`).

        Raises:
            ConfigError: for a model that cannot take the data, a bad encoder or device, or
                a ``max_client_examples`` below the largest client.
            RequirementError: for a method that needs images the data does not have (a
                table's inputs, or too small a side), or an attack that cannot act on a
                method's payload.
        """
        cfg = plan.cfg
        if dataset is None:
            dataset = load_dataset(cfg.dataset, cfg.data_root, cfg.download)
        data = carve_federated_data(
            dataset,
            clients=cfg.clients,
            partitioner=plan.partitioner,
            seed=cfg.data_seed,
            public_size=cfg.public_size,
            max_train=cfg.max_train,
            val_fraction=cfg.val_fraction,
            feature_skew=plan.feature_skew,
            stats=dataset_stats(dataset.name),
            lazy=lazy,
        )
        check_models_fit(plan.archs, cfg.server_model, data.task)
        refuse(image_problems(plan.methods, data.task))  # before the encoder trains
        budget = MemoBudget(limit=cfg.memo_mb * 2**20)
        store = ArtefactStore(Path(cfg.cache_dir) if cfg.cache_dir else None, budget=budget)
        try:
            device = resolve_device(cfg.device)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        encoder = None
        if cfg.encoder:
            public = None if data.public is None else data.public.x
            try:
                encoder = build_encoder(
                    cfg.encoder, data.task, cfg.seed, public=public, store=store, device=device
                )
            except EncoderError as exc:
                raise ConfigError(str(exc)) from None
            except (RuntimeError, ValueError) as exc:  # a source that trains on the pool
                raise ConfigError(
                    f"encoder {cfg.encoder!r} cannot be built on this data ({data.task.in_channels}"
                    f" channel(s), side {data.task.image_size}): {first_line(exc)}"
                ) from None
            check_encoder_fits(encoder, data.task, device)
        sizes = [len(s.train) + (0 if s.val is None else len(s.val)) for s in data.clients]
        pool = cfg.max_client_examples or sum(sizes)
        if max(sizes) > pool:
            raise ConfigError(
                f"max_client_examples: expected at least the largest client's {max(sizes)} "
                f"examples, got {pool}"
            )
        attacks = build_attacks(cfg.attack) if cfg.attack else ()
        fed = cls(
            cfg, data, plan.archs, device, store, tracker or NullTracker(), encoder, pool,
            plan.graph, attacks, plan.schedules,
            diagnostic_split(data.test, cfg.diagnostic_size, cfg.data_seed),
        )  # fmt: skip
        fed.check_attacks(plan.methods)
        return fed

    def check_attacks(self, methods: Sequence[tuple[str, Method[Any]]]) -> None:
        """An attack dealt out to a client must be able to act on every method's payload.

        Raises:
            RequirementError: naming each attack and method that do not fit.
        """
        problems = []
        for attack in self.attacks[: self.cfg.malicious]:  # the ones dealt out
            for key, method in methods:
                misfit = attack.misfit(method.payload_spec(self.dims))
                if misfit:
                    problems.append(f"{key}: attack {attack.spec!r} {misfit}")
        refuse(problems)

    @property
    def dims(self) -> WireDims:
        """The public facts payload shapes resolve against (``D`` with an encoder)."""
        return wire_dims(
            self.data.task, self.data.public, self.encoder, self.archs, self.train_pool
        )

    def only(self, client_id: int, shard: ClientShard | None = None) -> Federation:
        """This federation as one node sees it: its own shard only (``shard``: the node's own
        data instead of the carved shard)."""
        return replace(self, data=self.data.only(client_id, shard))

    def server_view(self, save_to: Path | None = None) -> ServerView:
        """What the server holds (see :class:`ServerView`); ``save_to``: where star methods'
        final models are saved."""
        data = self.data
        return ServerView(
            cfg=self.cfg,
            task=data.task,
            public=data.public,
            test=data.test,
            archs=self.archs,
            device=self.device,
            store=self.store.scoped("server"),
            tracker=self.tracker,
            encoder=self.encoder,
            train_pool=self.train_pool,
            graph=self.graph,
            schedules=self.schedules,
            attacks=tuple(
                None if (a := self.attack_of(c)) is None else a.spec for c in range(len(self.archs))
            ),
            data_hash=data_hash(data),
            client_examples=int(sum(len(c.train) for c in data.clients)),
            save_to=save_to,
        )

    def attack_of(self, client_id: int) -> Attack | None:
        """The attack client ``client_id`` follows: the ``i mod k``-th of the ``k`` attacks
        for a malicious client ``i`` (id below ``malicious``), else none."""
        if client_id >= self.cfg.malicious or not self.attacks:
            return None
        return self.attacks[client_id % len(self.attacks)]

    def shard_report(self, client_id: int) -> ShardReport:
        """What client ``client_id`` reports about its own (clean) shard."""
        shard = self.data.shard(client_id)
        return ShardReport.of(shard.train, shard.val, self.data.task.num_classes)

    def client_context(self, client_id: int) -> ClientContext:
        """Client ``client_id``'s context: its own shard and the federation's public facts; a
        simulated malicious client's data comes poisoned by its attack."""
        shard = self.data.shard(client_id)
        train, val, attack = shard.train, shard.val, self.attack_of(client_id)
        if attack is not None:
            classes = self.data.task.num_classes
            train = attack.poison(train, classes)
            val = None if val is None else attack.poison(val, classes)
        return ClientContext(
            client_id=client_id,
            data=train,
            val=val,
            task=self.data.task,
            arch=self.archs[client_id],
            client_archs=self.archs,
            max_examples=self.train_pool,
            train_config=resolve_budget(self.cfg.client_train_config(), len(train)),
            public=self.data.public,
            device=self.device,
            seed=self.cfg.seed,
            store=self.store.scoped(f"client {client_id}"),
            tracker=self.tracker,
            encoder=self.encoder,
        )

    def receiver_context(
        self, client_id: int, schedule: tuple[tuple[int, ...], ...] = ()
    ) -> ClientContext:
        """Client ``client_id``'s context as a peer receiver: its own context plus its
        in-neighbours in the graph, the partition seed the graph was drawn with and its
        encounter ``schedule`` (from the plan; on Flower, from its receive instruction)."""
        if self.graph is None:
            raise RuntimeError("receiver_context: this federation has no graph (no peer method)")
        return replace(
            self.client_context(client_id),
            neighbours=self.graph.senders(client_id),
            topology_seed=self.cfg.data_seed,
            schedule=schedule,
        )
