"""The experiment: what a run fixes once for all its methods, and the run itself.

:meth:`Experiment.prepare` turns an :class:`~oneshotfl.runner.config.ExperimentConfig` into
a frozen :class:`Experiment` — the federated data carved from the dataset, the client
architectures, the device, the artefact cache, the shared encoder and the neighbour graph —
checking every name before any data is loaded. The experiment hands out the contexts
methods run in (a client's own shard; the server's public view), checks each method's
``requires`` before any training, runs the methods in order through a transport (in
process by default; Flower passes its own) and writes the result document.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from oneshotfl.data.datasets import load_dataset
from oneshotfl.data.feature_skew import dataset_stats
from oneshotfl.data.federated import ClientShard, FederatedData, carve_federated_data
from oneshotfl.data.types import Dataset
from oneshotfl.devices import resolve_device
from oneshotfl.encoders import Encoder, EncoderError, build_encoder
from oneshotfl.protocol.contract import (
    ClientContext,
    Requires,
    ServerContext,
    Topology,
    wire_dims,
)
from oneshotfl.protocol.graph import Graph, GraphError, build_graph
from oneshotfl.protocol.spec import WireDims
from oneshotfl.runner.accounting import attribute_client_time
from oneshotfl.runner.checks import (
    Methods,
    check_models_fit,
    checked_names,
    requirement_problems,
    resolve_methods,
)
from oneshotfl.runner.config import ConfigError, ExperimentConfig
from oneshotfl.runner.engine import RequirementError, run_method
from oneshotfl.runner.pool import open_transport
from oneshotfl.runner.results import MethodResult, result_document
from oneshotfl.runner.transport import LocalTransport, ShardReport, Transport
from oneshotfl.security.threats import Attack, build_attacks
from oneshotfl.training.artefacts import ArtefactStore
from oneshotfl.training.loop import resolve_budget
from oneshotfl.training.memo import memoised_logits
from oneshotfl.training.progress import NullTracker, Tracker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Experiment:
    """A prepared run (see the module docs).

    Attributes:
        cfg: the experiment config.
        data: the federated data (a Flower node holds only its own shard).
        archs: every client's architecture, by client id.
        device: compute device.
        store: artefact cache.
        tracker: progress display.
        encoder: the shared frozen encoder, when configured.
        train_pool: ``N_max`` on the wire, the most examples one client can claim: the
            config's ``max_client_examples``, else the examples the federation's clients
            hold together (train and validation).
        ledger: the clients' :class:`~oneshotfl.runner.transport.ShardReport` s, by client
            id, as the engine admitted them (the first valid report of each client): the
            server's only source for client sizes and label histograms.
        save_to: a run folder to save every star method's final model(s) into
            (:mod:`oneshotfl.protocol.saved`), or None.

    The neighbour graph (:attr:`graph`) is built only when a peer method runs — checked by
    :meth:`check` before any training — so star runs and Flower nodes never need it.
    """

    cfg: ExperimentConfig
    data: FederatedData
    archs: tuple[str, ...]
    device: torch.device
    store: ArtefactStore
    tracker: Tracker
    encoder: Encoder | None = None
    train_pool: int = 0
    ledger: dict[int, ShardReport] = field(default_factory=dict, compare=False)
    save_to: Path | None = None

    @classmethod
    def prepare(
        cls, cfg: ExperimentConfig, tracker: Tracker | None = None, dataset: Dataset | None = None
    ) -> Experiment:
        """Check names, load the data (unless ``dataset`` is given), carve the federation,
        build the encoder and the graph.

        Raises:
            ConfigError: for an unknown model, a bad encoder or graph spec.
        """
        archs, partitioner, skew = checked_names(cfg)
        if dataset is None:
            dataset = load_dataset(cfg.dataset, cfg.data_root, cfg.download)
        data = carve_federated_data(
            dataset,
            clients=cfg.clients,
            partitioner=partitioner,
            seed=cfg.data_seed,
            public_size=cfg.public_size,
            max_train=cfg.max_train,
            val_fraction=cfg.val_fraction,
            feature_skew=skew,
            stats=dataset_stats(dataset.name),
        )
        check_models_fit(archs, cfg.server_model, data.task)
        store = ArtefactStore(Path(cfg.cache_dir) if cfg.cache_dir else None)
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
        sizes = [len(s.train) + (0 if s.val is None else len(s.val)) for s in data.clients]
        pool = cfg.max_client_examples or sum(sizes)
        if max(sizes) > pool:
            raise ConfigError(
                f"max_client_examples: expected at least the largest client's {max(sizes)} "
                f"examples, got {pool}"
            )
        return cls(cfg, data, archs, device, store, tracker or NullTracker(), encoder, pool)

    @cached_property
    def graph(self) -> Graph:
        """The neighbour graph of peer methods, drawn with the partition seed.

        Raises:
            ConfigError: for a graph spec that cannot be built.
        """
        try:
            return build_graph(self.cfg.graph, self.cfg.clients, self.cfg.data_seed)
        except GraphError as exc:
            raise ConfigError(f"graph: {exc}") from None

    def only(self, client_id: int, shard: ClientShard | None = None) -> Experiment:
        """This experiment as one node sees it: its own shard only (``shard``: the node's own
        data instead of the carved shard)."""
        return replace(self, data=self.data.only(client_id, shard), ledger={})

    def shard_report(self, client_id: int) -> ShardReport:
        """What client ``client_id`` reports about its own (clean) shard."""
        shard = self.data.shard(client_id)
        return ShardReport.of(shard.train, shard.val, self.data.task.num_classes)

    def label_histograms(self) -> np.ndarray:
        """``[clients, classes]`` label counts as the clients reported them (:attr:`ledger`);
        NaN rows for clients that have not."""
        out = np.full((self.cfg.clients, self.data.task.num_classes), np.nan)
        for cid, report in self.ledger.items():
            out[cid] = report.label_histogram
        return out

    @property
    def dims(self) -> WireDims:
        """The public facts payload shapes resolve against (``D`` with an encoder)."""
        return wire_dims(
            self.data.task, self.data.public, self.encoder, self.archs, self.train_pool
        )

    @cached_property
    def attacks(self) -> tuple[Attack, ...]:
        """What the simulated malicious clients do (``malicious``/``attack``), in turn."""
        return build_attacks(self.cfg.attack) if self.cfg.attack else ()

    def attack_of(self, client_id: int) -> Attack | None:
        """The attack client ``client_id`` follows: the ``i mod k``-th of the ``k`` attacks
        for a malicious client ``i`` (id below ``malicious``), else none."""
        if client_id >= self.cfg.malicious or not self.attacks:
            return None
        return self.attacks[client_id % len(self.attacks)]

    def client_context(self, client_id: int) -> ClientContext:
        """Client ``client_id``'s context: its own shard and the federation's public facts; a
        simulated malicious client (id below ``malicious``) gets its attack and its poisoned
        data."""
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

    def receiver_context(self, client_id: int) -> ClientContext:
        """Client ``client_id``'s context as a peer receiver: its own context plus its
        in-neighbours in the graph and the partition seed the graph was drawn with."""
        return replace(
            self.client_context(client_id),
            neighbours=self.graph.senders(client_id),
            topology_seed=self.cfg.data_seed,
        )

    def server_context(self, requires: Requires | None = None) -> ServerContext:
        """The server's context: public facts and configuration, no client data; no public
        pool either for a method whose ``requires`` say it is data-free."""
        data_free = requires is not None and requires.data_free
        public = None if data_free else self.data.public
        server = self.cfg.server_train_config()
        if public is not None:  # the server_steps floor, over the pool
            server = resolve_budget(server, len(public))
        return ServerContext(
            task=self.data.task,
            public=public,
            server_arch=self.cfg.server_model,
            client_archs=self.archs,
            train_config=replace(server, min_steps=0),
            client_train_config=self.cfg.client_train_config(),
            device=self.device,
            seed=self.cfg.seed,
            store=self.store.scoped("server"),
            tracker=self.tracker,
            encoder=self.encoder,
            max_examples=self.train_pool,
        )

    def check(self, methods: Methods) -> None:
        """Raise :class:`RequirementError` listing every unmet requirement of every method."""
        cfg = self.cfg
        problems = requirement_problems(
            cfg, methods, self.archs, self.data.public is not None, self.encoder is not None
        )
        for attack in () if problems else self.attacks[: cfg.malicious]:  # the ones dealt out
            for key, method in methods:  # an attack that cannot act on this payload
                misfit = attack.misfit(method.payload_spec(self.dims))
                if misfit:
                    problems.append(f"{key}: attack {attack.spec!r} {misfit}")
        if problems:
            raise RequirementError("cannot run: " + "; ".join(problems))
        if any(m.requires.topology is Topology.PEER for _, m in methods):
            _ = self.graph  # a bad graph spec fails here, before any training

    def run(self, methods: Methods, transport: Transport | None = None) -> list[MethodResult]:
        """Run ``methods`` in order (they share trained client artefacts)."""
        transport = transport or LocalTransport(self)
        results = []
        with memoised_logits(self.data.test.x) as memo:  # each model runs over the test once
            for key, method in methods:
                log.info("running %s", key)
                results.append(run_method(key, method, self, transport))
                warn_at_chance(results[-1], self.data.task.num_classes)
        stats = memo()
        log.debug("test logits: %d models run, %d answers memoised", stats.misses, stats.hits)
        return results


def warn_at_chance(result: MethodResult, classes: int) -> None:
    """Log a warning when a method ends at chance (its own metric — personal accuracy for a
    server-free method — below 1.5 / classes): usually an undertrained budget."""
    peer = result.topology is not None
    value = result.personal_accuracy if peer else result.accuracy
    if value is not None and classes > 1 and value < 1.5 / classes:
        log.warning(
            "%s ended at chance: %.1f%% with %d classes (chance %.1f%%); a budget this small "
            "may not train it (local_steps, local_epochs, lr, server_steps)",
            result.key, 100 * value, classes, 100 / classes,
        )  # fmt: skip


Connect = Callable[[Experiment, Methods], Transport]
"""Given the prepared, checked experiment and its methods, the transport to run them over."""


def run_experiment(
    cfg: ExperimentConfig,
    tracker: Tracker | None = None,
    connect: Connect | None = None,
    save_to: Path | None = None,
) -> dict[str, Any]:
    """Run every configured method on one federation; return the result document.

    The sequence is the same everywhere: resolve the methods, prepare the experiment, check
    every requirement, connect a transport (``connect``; default: in process), run, document.
    """
    started, t0 = datetime.now(UTC), time.perf_counter()
    methods = resolve_methods(cfg.methods, cfg.method_defaults)
    exp = replace(Experiment.prepare(cfg, tracker), save_to=save_to)
    exp.check(methods)
    if connect is not None:
        results, workers = exp.run(methods, connect(exp, methods)), 1
    else:
        with open_transport(exp) as (transport, workers):  # in process, or worker processes
            results = exp.run(methods, transport)
    attributed, shared = attribute_client_time(results)
    return result_document(exp, attributed, started, t0, workers, shared)
