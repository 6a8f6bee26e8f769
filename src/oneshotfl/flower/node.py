"""The client side on a Flower node: its own shard, one ``client_update``, one reply.

A node learns which client it is from its node config (``--node-config``):

* ``partition-id`` (required): the client id, ``0 <= partition-id < clients``;
* ``num-partitions`` (optional): when given, must equal the experiment's ``clients``;
* ``data-root`` (optional): where this node's copy of the dataset lies (else the config's
  ``data_root``, ``$ONESHOTFL_DATA`` and system paths);
* ``cache-dir`` (optional): this node's artefact cache (else the config's ``cache_dir``);
* ``shared-data`` (optional): the folder of the machine's memory-mapped copy of the
  dataset, shared by every node process there (:mod:`oneshotfl.data.shared`; default
  ``$ONESHOTFL_SHARED_DATA`` or the temp folder; ``off``: each process loads its own);
* ``dataset`` (optional): the node's own data, ``npz:path=FILE``, ``csv:path=FILE`` or
  ``folder:path=DIR`` (options in :mod:`oneshotfl.data.user`), used whole as its shard
  instead of a carved one.

It loads the dataset from its own disk and carves the federation with the experiment's
partition seed exactly as the simulation does, and gives the method only its own shard
(plus the public pool and test split, which every party may have): no other client's data
ever crosses the network, and the client code sees none. A node with its own ``dataset``
takes every example of it as its shard (labels by class name for a folder, by index for
npz; the task's image shape; at most ``N_max`` examples, so set the config's
``max_client_examples``), holds out its validation split as a carved shard would, and
reports its sizes and label counts with its first reply, as every node does: the server
counts nothing itself. A node's own table is standardised on its own training data (as
every table is by default); to have every node normalise alike, declare the federation's
values in its spec (``:mean=M:std=S``) or keep the features as given
(``:standardise=false``). The same steps as in the simulation run the method:
:func:`~oneshotfl.runner.transport.client_step` for an update,
:func:`~oneshotfl.runner.transport.peer_step` for a peer method's receipt (the node
validates its neighbours' bytes, builds its own model and evaluates it itself).
Nothing here imports flwr.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from oneshotfl.data.datasets import DatasetFormatError, DatasetNotFoundError
from oneshotfl.data.federated import ClientShard, OwnDataError, own_shard
from oneshotfl.data.shared import load_shared, shared_folder
from oneshotfl.data.types import Dataset
from oneshotfl.data.user import UserDataError, is_user_spec, load_user_dataset, parse_user_spec
from oneshotfl.flower.messages import sender_id
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import Method, PeerMethod
from oneshotfl.runner.checks import resolve_methods
from oneshotfl.runner.config import ConfigError, make_config
from oneshotfl.runner.federation import Federation
from oneshotfl.runner.plan import build_run_graph, federation_plan
from oneshotfl.runner.transport import (
    ClientReply,
    PeerReport,
    receipt_on,
    receive_broadcast,
    update_on,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeIdentity:
    """Which client this node is, and where its data and cache lie."""

    partition_id: int
    num_partitions: int | None = None
    data_root: str | None = None
    cache_dir: str | None = None
    dataset: str | None = None
    shared_data: str | None = None


def node_identity(node_config: Mapping[str, Any]) -> NodeIdentity:
    """Read a node's identity from its Flower node config.

    Raises:
        ConfigError: when ``partition-id`` is missing or a value has the wrong type.
    """
    pid = node_config.get("partition-id")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid < 0:
        raise ConfigError(
            "node config: expected partition-id = a client id >= 0 (e.g. "
            f"--node-config 'partition-id=0'), got {pid!r}"
        )
    num = node_config.get("num-partitions")
    if num is not None and (not isinstance(num, int) or isinstance(num, bool)):
        raise ConfigError(f"node config: num-partitions must be an integer, got {num!r}")
    root, cache = node_config.get("data-root"), node_config.get("cache-dir")
    shared = node_config.get("shared-data")
    for name, value in (("data-root", root), ("cache-dir", cache), ("shared-data", shared)):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"node config: {name} must be a path string, got {value!r}")
    own = node_config.get("dataset") or None
    if own is not None and not (isinstance(own, str) and is_user_spec(own)):
        raise ConfigError(
            f"node config: dataset must be the node's own data, npz:path=FILE, "
            f"csv:path=FILE or folder:path=DIR, got {own!r}"
        )
    if own is not None:
        try:
            parse_user_spec(own)
        except UserDataError as exc:
            raise ConfigError(f"node config: {exc}") from None
    return NodeIdentity(pid, num, root or None, cache or None, own, shared or None)


@dataclass(frozen=True)
class NodeState:
    """A node's view of the federation: its own shard only, plus public facts."""

    key: str
    federation: Federation
    client_id: int

    @cached_property
    def receiving(self) -> Federation:
        """The node's federation with the neighbour graph a receiver needs (drawn once per
        node, with the partition seed, the first time it receives)."""
        fed = self.federation
        return fed if fed.graph is not None else replace(fed, graph=build_run_graph(fed.cfg))


MAX_CLIENTS_HELD = 256
"""How many clients' states (and in-memory artefacts) one node process keeps by default."""


@dataclass
class NodeCache:
    """What one node process keeps between instructions: the dataset it loaded, the
    federation of the config it last served (carved once, as indices: the shards gather
    their rows when read), the node states of that federation (Flower's simulation engine
    plays many virtual nodes in one process) and the methods built from the specs it
    received. One entry per config: a new config clears it.

    At most ``max_clients`` node states are kept, the least recently used dropped first
    with the artefacts its client made in memory (a client served again later makes them
    again, or reads them from the node's disk cache, ``cache-dir``, when there is one: the
    same bytes either way); the dataset is the machine's shared copy, so a process's memory
    grows with the clients it holds, not with those it has served.
    """

    datasets: dict[tuple[str, str | None, bool], Dataset] = field(default_factory=dict)
    federations: dict[str, Federation] = field(default_factory=dict)
    states: dict[tuple[str, int, int | None, str | None], NodeState] = field(default_factory=dict)
    methods: dict[str, Method[Any]] = field(default_factory=dict)
    max_clients: int = MAX_CLIENTS_HELD

    def hold(self, key: tuple[str, int, int | None, str | None], state: NodeState) -> NodeState:
        """Keep ``state`` under ``key``, dropping the least recently used beyond the bound."""
        self.states[key] = state
        while len(self.states) > self.max_clients:
            old_key, old = next(iter(self.states.items()))
            del self.states[old_key]
            old.federation.store.forget(f"client {old.client_id}")
        return state

    def dataset(
        self, name: str, root: str | None, download: bool, shared: str | None = None
    ) -> Dataset:
        """The dataset from this node's disk, loaded once per process (memory-mapped from the
        machine's shared copy, :mod:`oneshotfl.data.shared`, unless ``shared`` is ``off``)."""
        key = (name, root, download)
        if key not in self.datasets:
            self.datasets.clear()
            self.datasets[key] = load_shared(name, root, download, shared_folder(shared))
        return self.datasets[key]

    def method(self, spec: str) -> Method[Any]:
        """The method a resolved spec names (``method_defaults`` already folded in by the
        server's plan), built once.

        Raises:
            ConfigError: for a method this node's oneshotfl does not know, or a bad knob.
        """
        if spec not in self.methods:
            ((_, built),) = resolve_methods([spec])
            self.methods[spec] = built
        return self.methods[spec]


def node_state(config: Mapping[str, Any], identity: NodeIdentity, cache: NodeCache) -> NodeState:
    """Load (or reuse, from ``cache``) this node's shard for the node's part of a plan.

    ``config`` holds the config keys a node needs (:meth:`oneshotfl.runner.plan.Plan.
    node_config`); the federation is carved once per process and config, and the node's
    :class:`NodeState` holds a federation whose data has only this node's shard.

    Raises:
        ConfigError: when the config does not fit this node (e.g. a partition id beyond
            the number of clients).
    """
    values = dict(config)
    if identity.data_root is not None:
        values["data_root"] = identity.data_root
    if identity.cache_dir is not None:
        values["cache_dir"] = identity.cache_dir
    key = json.dumps(values, sort_keys=True)
    state_key = (key, identity.partition_id, identity.num_partitions, identity.dataset)
    if state_key in cache.states:  # this config was read and this node checked before
        state = cache.states.pop(state_key)  # the most recently used again
        cache.states[state_key] = state
        return state
    cfg = make_config(values)
    if identity.num_partitions is not None and identity.num_partitions != cfg.clients:
        raise ConfigError(
            f"node config: num-partitions={identity.num_partitions}, but the experiment has "
            f"clients={cfg.clients}"
        )
    if identity.partition_id >= cfg.clients:
        raise ConfigError(
            f"node config: partition-id must be below clients={cfg.clients}, "
            f"got {identity.partition_id}"
        )
    if key not in cache.federations:
        cache.federations.clear()
        cache.states.clear()
        dataset = cache.dataset(cfg.dataset, cfg.data_root, cfg.download, identity.shared_data)
        cache.federations[key] = Federation.prepare(
            federation_plan(cfg), dataset=dataset, lazy=True
        )
    fed = cache.federations[key]
    shard = None if identity.dataset is None else _own_shard(fed, identity)
    own = fed.only(identity.partition_id, shard)
    return cache.hold(state_key, NodeState(key, own, identity.partition_id))


def _own_shard(fed: Federation, identity: NodeIdentity) -> ClientShard:
    """The node's shard from its own dataset (see the module docs).

    Raises:
        ConfigError: for data that cannot be read or does not fit the task or ``N_max``.
    """
    spec, cfg = identity.dataset, fed.cfg
    assert spec is not None
    if cfg.feature_skew:
        raise ConfigError(f"node config: dataset {spec!r} cannot take the config's feature_skew")
    try:
        shard = own_shard(
            load_user_dataset(spec, need_test=False),
            fed.data.task,
            identity.partition_id,
            val_fraction=cfg.val_fraction,
            seed=cfg.data_seed,
            by_name=parse_user_spec(spec)[0] == "folder",
        )
    except (DatasetNotFoundError, DatasetFormatError, OwnDataError) as exc:
        raise ConfigError(f"node config: {exc}") from None
    held = len(shard.train) + (0 if shard.val is None else len(shard.val))
    if held > fed.train_pool:
        raise ConfigError(
            f"node config: dataset {spec!r}: expected at most N_max = {fed.train_pool} examples "
            f"(set max_client_examples), got {held}"
        )
    log.info("client %d: its own dataset %s, %d examples", identity.partition_id, spec, held)
    return shard


def run_update(
    state: NodeState,
    method: Method[Any],
    method_spec: str,
    round_index: int,
    payloads: Mapping[str, bytes],
) -> ClientReply:
    """One round of one method on this node: validate what the server sent, run
    ``client_update`` on the node's own shard, return the reply (with the local model's
    accuracies in round 0).

    Raises:
        ConfigError: for a method this node's oneshotfl does not know, or a payload that is
            not a server broadcast.
        WireError, PayloadError: for a server message that fails validation.
    """
    unknown = sorted(set(payloads) - {"server"})
    if unknown:
        raise ConfigError(
            f"{method_spec}: an update takes at most a 'server' broadcast, got payloads from "
            f"{unknown}"
        )
    fed = state.federation
    broadcast: Payload | None = receive_broadcast(
        method, payloads.get("server"), fed.dims, round_index
    )
    reply = update_on(fed, method, state.client_id, round_index, broadcast)  # as simulated
    log.info(
        "client %d: %s round %d: %d bytes", state.client_id, method_spec, round_index,
        len(reply.data),
    )  # fmt: skip
    return reply


def run_receive(
    state: NodeState,
    method: Method[Any],
    method_spec: str,
    payloads: Mapping[str, bytes],
    schedule: tuple[tuple[int, ...], ...] = (),
) -> PeerReport:
    """A peer method's receipt on this node: its neighbours' bytes (relayed unchanged by the
    ServerApp) are validated here, the node builds its own model and evaluates it.

    Raises:
        ConfigError: for an unknown method or one that is not a peer method.
        ConfigError: for a payload not named ``client-<id>``.
    """
    if not isinstance(method, PeerMethod):
        raise ConfigError(f"{method_spec}: a receive step needs a peer method")
    deliveries = {sender_id(name): data for name, data in payloads.items()}
    report = receipt_on(state.receiving, method, state.client_id, deliveries, schedule)
    log.info("client %d: %s received %d payload(s)", state.client_id, method_spec, len(deliveries))
    return report
