"""The client side on a Flower node: its own shard, one ``client_update``, one reply.

A node learns which client it is from its node config (``--node-config``):

* ``partition-id`` (required): the client id, ``0 <= partition-id < clients``;
* ``num-partitions`` (optional): when given, must equal the experiment's ``clients``;
* ``data-root`` (optional): where this node's copy of the dataset lies (else the config's
  ``data_root``, ``$ONESHOTFL_DATA`` and system paths);
* ``cache-dir`` (optional): this node's artefact cache (else the config's ``cache_dir``).

It loads the dataset from its own disk and carves the federation with the experiment's
partition seed exactly as the simulation does, and gives the method only its own shard
(plus the public pool and test split, which every party may have): no other client's data
ever crosses the network, and the client code sees none. The same
:func:`~oneshotfl.runner.simulation.client_step` as in the simulation runs the method.
Nothing here imports flwr.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oneshotfl.data.datasets import load_dataset
from oneshotfl.data.types import Dataset
from oneshotfl.federation.payload import Payload
from oneshotfl.methods import METHODS, build_method, parse_method_spec
from oneshotfl.runner.config import ConfigError, make_config
from oneshotfl.runner.simulation import (
    ClientReply,
    Setup,
    client_step,
    local_accuracies,
    prepare,
    receive_broadcast,
    shard_context,
    wire_dims,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeIdentity:
    """Which client this node is, and where its data and cache lie."""

    partition_id: int
    num_partitions: int | None = None
    data_root: str | None = None
    cache_dir: str | None = None


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
    for name, value in (("data-root", root), ("cache-dir", cache)):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"node config: {name} must be a path string, got {value!r}")
    return NodeIdentity(pid, num, root or None, cache or None)


@dataclass
class NodeState:
    """A node's view of the federation: its own shard only, plus public facts."""

    key: str
    setup: Setup
    client_id: int
    local_stats: dict[str, float] = dataclasses.field(default_factory=dict)


_SETUPS: dict[str, Setup] = {}  # one entry: the federation of the config last served
_STATES: dict[tuple[str, int], NodeState] = {}  # the virtual nodes of that federation


def node_state(config: Mapping[str, Any], identity: NodeIdentity) -> NodeState:
    """Load (or reuse) this node's shard for an experiment config.

    The federation is carved once per process and config; the node's :class:`NodeState`
    holds a setup whose federation has only this node's shard. (Flower's simulation engine
    plays many virtual nodes, one after the other, in one worker process; a SuperNode's
    ClientApp process serves one node.)

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
    if (key, identity.partition_id) in _STATES:
        return _STATES[key, identity.partition_id]
    if key not in _SETUPS:
        _SETUPS.clear()
        _STATES.clear()
        _SETUPS[key] = prepare(cfg, dataset=_dataset(cfg.dataset, cfg.data_root, cfg.download))
    full = _SETUPS[key]
    shard = full.federation.clients[identity.partition_id]
    own = dataclasses.replace(
        full,
        federation=dataclasses.replace(full.federation, clients=(shard,)),
        trained=set(),
        local_stats={},
    )
    _STATES[key, identity.partition_id] = NodeState(key, own, identity.partition_id)
    return _STATES[key, identity.partition_id]


_DATASETS: dict[tuple[str, str | None, bool], Dataset] = {}  # one entry


def _dataset(name: str, root: str | None, download: bool) -> Dataset:
    """The dataset from this node's disk, loaded once per process."""
    key = (name, root, download)
    if key not in _DATASETS:
        _DATASETS.clear()
        _DATASETS[key] = load_dataset(name, root, download)
    return _DATASETS[key]


def run_update(
    state: NodeState, method_spec: str, round_index: int, payloads: Mapping[str, bytes]
) -> ClientReply:
    """One round of one method on this node: validate what the server sent, run
    ``client_update`` on the node's own shard, return the reply (with the local model's
    accuracies when this update trained it).

    Raises:
        ConfigError: for a method this node's oneshotfl does not know.
        WireError, PayloadError: for a server message that fails validation.
    """
    spec = parse_method_spec(method_spec)
    if spec.name not in METHODS:
        raise ConfigError(
            f"unknown method {spec.name!r}; expected one of: {', '.join(METHODS.names())}"
        )
    method = build_method(spec)
    unknown = sorted(set(payloads) - {"server"})
    if unknown:
        raise ConfigError(
            f"{spec.key}: this node runs star-topology methods and expected at most a "
            f"'server' broadcast, got payloads from {unknown}"
        )
    broadcast: Payload | None = receive_broadcast(
        method, payloads.get("server"), wire_dims(state.setup)
    )
    setup = state.setup
    ctx = shard_context(setup, setup.federation.clients[0])
    reply = client_step(method, ctx, round_index, broadcast)
    if reply.train_s is not None and round_index == 0:
        if not state.local_stats:  # computed once per node and config
            state.local_stats = local_accuracies(ctx, setup.federation.test, setup.device)
        reply = dataclasses.replace(reply, local_stats=dict(state.local_stats))
    log.info(
        "client %d: %s round %d: %d bytes", ctx.client_id, spec.key, round_index, len(reply.data)
    )
    return reply
