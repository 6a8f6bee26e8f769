"""One checked plan: everything about a config that can fail without its data, checked once.

:func:`preflight` resolves the methods (with ``method_defaults`` beneath each spec), checks
the names a run uses, every method's requirements and the neighbour graph of peer methods,
and returns a frozen :class:`Plan`. The run (``run_experiment``, the one orchestrator) and
the Flower ServerApp execute a plan without checking it again; a sweep runs ``preflight`` on
every grid point before its first run, so a bad point is named before anything trains. A
Flower node gets its part of the plan (:meth:`Plan.node_config` and one method's resolved
spec), not the whole config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from oneshotfl.data.feature_skew import FeatureSkew
from oneshotfl.data.partition import Partitioner
from oneshotfl.protocol.contract import Method, PeerMethod, Topology
from oneshotfl.protocol.graph import Graph, GraphError, build_graph
from oneshotfl.runner.checks import (
    checked_names,
    merged_specs,
    requirement_problems,
    resolve_methods,
)
from oneshotfl.runner.config import ConfigError, ExperimentConfig
from oneshotfl.runner.config_values import SECTIONS
from oneshotfl.runner.errors import refuse

Schedules = Mapping[int, tuple[tuple[int, ...], ...]]
"""Receiver → its encounter schedule (the senders of each collection window)."""

SERVER_ONLY = ("methods", "method_defaults", "workers", "group", *SECTIONS["server"].values())
"""Config keys only the server reads — the run's methods, how it runs locally, its report
group and the ``server`` section's settings: a Flower node's instruction leaves them out."""


def build_run_graph(cfg: ExperimentConfig) -> Graph:
    """The neighbour graph of ``cfg``, drawn with the partition seed.

    Raises:
        ConfigError: for a graph spec that cannot be built.
    """
    try:
        return build_graph(cfg.graph, cfg.clients, cfg.data_seed)
    except GraphError as exc:
        raise ConfigError(str(exc)) from None  # its text names the graph already


@dataclass(frozen=True)
class Plan:
    """A config checked once, with what the checks resolved.

    Attributes:
        cfg: the experiment config.
        methods: (key, method) in run order; a key is the spec as written.
        specs: key → the spec a Flower node builds that method from (the method's name and
            every knob, ``method_defaults`` included).
        archs: every client's architecture, by client id.
        partitioner: the configured partitioner.
        feature_skew: the configured feature skew, if any.
        graph: the neighbour graph when a peer method runs, else ``None``.
        schedules: per peer method (by key), every receiver's encounter schedule, drawn once
            (:func:`draw_schedules`).
    """

    cfg: ExperimentConfig
    methods: tuple[tuple[str, Method[Any]], ...]
    specs: dict[str, str]
    archs: tuple[str, ...]
    partitioner: Partitioner
    feature_skew: FeatureSkew | None
    graph: Graph | None
    schedules: Mapping[str, Schedules] = field(default_factory=dict)

    def node_config(self) -> dict[str, Any]:
        """The config keys a Flower node needs (every key but :data:`SERVER_ONLY`)."""
        return {k: v for k, v in self.cfg.to_dict().items() if k not in SERVER_ONLY}


def node_specs(cfg: ExperimentConfig) -> dict[str, str]:
    """Method key → the spec a node builds it from: the spec as written with the knobs of
    ``method_defaults`` beneath its own (so a node needs no ``method_defaults``)."""
    return {key: spec.key for key, spec in merged_specs(cfg.methods, cfg.method_defaults)}


def draw_schedules(key: str, method: PeerMethod[Any], graph: Graph, seed: int) -> Schedules:
    """Every receiver's encounter schedule of peer method ``key`` over ``graph``
    (:meth:`~oneshotfl.protocol.contract.PeerMethod.schedule`, drawn from the partition
    ``seed``), checked to name only the receiver's graph neighbours.

    Raises:
        ConfigError: for a schedule that names a client that is not a neighbour.
    """
    out: dict[int, tuple[tuple[int, ...], ...]] = {}
    for receiver in range(graph.clients):
        neighbours = graph.senders(receiver)
        windows = tuple(tuple(w) for w in method.schedule(receiver, neighbours, seed))
        unknown = sorted({s for w in windows for s in w} - set(neighbours))
        if unknown:
            raise ConfigError(
                f"{key}: its schedule for client {receiver} names non-neighbours {unknown}"
            )
        out[receiver] = windows
    return out


def preflight(cfg: ExperimentConfig) -> Plan:
    """Check everything about ``cfg`` that can fail without its data (see the module docs).

    Raises:
        ConfigError: for an unknown or badly set name or method, or a bad graph.
        RequirementError: for a method whose requirements the config does not meet.
    """
    methods = resolve_methods(cfg.methods, cfg.method_defaults)
    archs, partitioner, skew = checked_names(cfg)
    problems = requirement_problems(cfg, methods, archs, cfg.public_size > 0, bool(cfg.encoder))
    if problems:
        refuse(problems)
    peer = any(m.requires.topology is Topology.PEER for _, m in methods)
    graph = build_run_graph(cfg) if peer else None
    specs = node_specs(cfg)
    schedules = {
        key: draw_schedules(key, method, graph, cfg.data_seed)
        for key, method in methods
        if graph is not None and isinstance(method, PeerMethod)
    }
    return Plan(cfg, tuple(methods), specs, archs, partitioner, skew, graph, schedules)


def federation_plan(cfg: ExperimentConfig) -> Plan:
    """A plan with no methods: the names of ``cfg`` checked, for what needs only the
    federation — a Flower node (each instruction names the method it runs; a receiver draws
    the graph when it receives) and the encoder commands.

    Raises:
        ConfigError: for an unknown or badly set name.
    """
    archs, partitioner, skew = checked_names(cfg)
    return Plan(cfg, (), {}, archs, partitioner, skew, None)
