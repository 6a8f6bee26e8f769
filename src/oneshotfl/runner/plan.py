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

from dataclasses import dataclass
from typing import Any

from oneshotfl.data.feature_skew import FeatureSkew
from oneshotfl.data.partition import Partitioner
from oneshotfl.methods import MethodSpec, parse_method_spec
from oneshotfl.protocol.contract import Method, Topology
from oneshotfl.protocol.graph import Graph, GraphError, build_graph
from oneshotfl.runner.checks import (
    checked_names,
    method_defaults,
    requirement_problems,
    resolve_methods,
)
from oneshotfl.runner.config import ConfigError, ExperimentConfig
from oneshotfl.runner.errors import RequirementError

SERVER_ONLY = (
    "methods",
    "method_defaults",
    "server_model",
    "server_epochs",
    "server_steps",
    "server_batch_size",
    "server_lr",
    "server_optimizer",
    "min_clients",
    "workers",
    "group",
)
"""Config keys only the server reads: a Flower node's instruction leaves them out."""


def build_run_graph(cfg: ExperimentConfig) -> Graph:
    """The neighbour graph of ``cfg``, drawn with the partition seed.

    Raises:
        ConfigError: for a graph spec that cannot be built.
    """
    try:
        return build_graph(cfg.graph, cfg.clients, cfg.data_seed)
    except GraphError as exc:
        raise ConfigError(f"graph: {exc}") from None


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
    """

    cfg: ExperimentConfig
    methods: tuple[tuple[str, Method[Any]], ...]
    specs: dict[str, str]
    archs: tuple[str, ...]
    partitioner: Partitioner
    feature_skew: FeatureSkew | None
    graph: Graph | None

    @property
    def keys(self) -> list[str]:
        """The methods' keys, in run order."""
        return [key for key, _ in self.methods]

    def node_config(self) -> dict[str, Any]:
        """The config keys a Flower node needs (every key but :data:`SERVER_ONLY`)."""
        return {k: v for k, v in self.cfg.to_dict().items() if k not in SERVER_ONLY}


def node_specs(cfg: ExperimentConfig) -> dict[str, str]:
    """Method key → the spec a node builds it from: the spec as written with the knobs of
    ``method_defaults`` beneath its own (so a node needs no ``method_defaults``)."""
    base = method_defaults(cfg.method_defaults)
    out = {}
    for text in cfg.methods:
        spec = parse_method_spec(text)
        out[spec.key] = MethodSpec(spec.name, {**base.get(spec.name, {}), **spec.params}).key
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
        raise RequirementError("cannot run: " + "; ".join(problems))
    peer = any(m.requires.topology is Topology.PEER for _, m in methods)
    graph = build_run_graph(cfg) if peer else None
    specs = node_specs(cfg)
    return Plan(cfg, tuple(methods), specs, archs, partitioner, skew, graph)


def federation_plan(cfg: ExperimentConfig) -> Plan:
    """A plan with no methods: the names of ``cfg`` checked, for what needs only the
    federation — a Flower node (each instruction names the method it runs; a receiver draws
    the graph when it receives) and the encoder commands.

    Raises:
        ConfigError: for an unknown or badly set name.
    """
    archs, partitioner, skew = checked_names(cfg)
    return Plan(cfg, (), {}, archs, partitioner, skew, None)
