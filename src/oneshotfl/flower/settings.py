"""The ServerApp's run config, validated (the keys are documented in
:mod:`oneshotfl.flower.server`)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from oneshotfl.runner.config import ConfigError


@dataclass(frozen=True)
class ServerSettings:
    """The ServerApp's run config, validated.

    Attributes:
        config: YAML experiment config path on the server, or ``None``.
        overrides: ``key=value`` config overrides.
        out: results directory.
        node_timeout: seconds to wait for the nodes to connect.
        reply_timeout: seconds to wait for a node's reply, from its instruction's push.
        in_flight: the most instructions outstanding at once (0: all at once).
        node_clients: node id → the client id it is bound to (empty: no binding).
        shared_data: the shared copy's folder (``None``: the default; ``"off"``: none).
        batch_updates: ask for every method's round 0 in one message per node.
        cohort_size: the most clients one simulated node holds and answers for in one message
            (:mod:`oneshotfl.flower.cohort`; 0: one client per node, a deployment's only mode).
    """

    config: str | None
    overrides: tuple[str, ...]
    out: Path
    node_timeout: float = 60.0
    reply_timeout: float = 600.0
    node_clients: Mapping[int, int] = field(default_factory=dict)
    shared_data: str | None = None
    in_flight: int = 0
    batch_updates: bool = True
    cohort_size: int = 0

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> ServerSettings:
        """Read the settings from Flower's run config (see the module docs for the keys).

        Raises:
            ConfigError: for a value of the wrong type, a non-positive timeout, a
                negative ``in-flight`` or ``cohort-size``, or a cohort with a binding.
        """
        batch = run_config.get("batch-updates", True)
        if not isinstance(batch, bool):
            raise ConfigError(f"run config batch-updates: expected true or false, got {batch!r}")
        text = {
            k: run_config.get(k, "")
            for k in ("config", "overrides", "out", "node-clients", "shared-data")
        }
        for key, value in text.items():
            if not isinstance(value, str):
                raise ConfigError(f"run config {key}: expected a string, got {value!r}")
        timeouts = {}
        for key, default in (("node-timeout", 60.0), ("reply-timeout", 600.0)):
            value = run_config.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"run config {key}: expected seconds > 0, got {value!r}")
            timeouts[key] = float(value)
        in_flight = run_config.get("in-flight", 0)
        if isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 0:
            raise ConfigError(f"run config in-flight: expected an integer >= 0, got {in_flight!r}")
        cohort = run_config.get("cohort-size", 0)
        if isinstance(cohort, bool) or not isinstance(cohort, int) or cohort < 0:
            raise ConfigError(f"run config cohort-size: expected an integer >= 0, got {cohort!r}")
        binding = parse_binding(text["node-clients"])
        if cohort and binding:
            raise ConfigError(
                "run config: cohort-size is for Flower's simulation engine and node-clients "
                "binds a deployment's nodes one client each; got both"
            )
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        return cls(
            config=text["config"] or None,
            overrides=tuple(shlex.split(text["overrides"])),
            out=Path(text["out"] or f"runs/flower-{stamp}"),
            node_timeout=timeouts["node-timeout"],
            reply_timeout=timeouts["reply-timeout"],
            node_clients=binding,
            shared_data=text["shared-data"] or None,
            in_flight=in_flight,
            batch_updates=batch,
            cohort_size=cohort,
        )


def parse_binding(text: str) -> dict[int, int]:
    """``"NODE=CLIENT NODE=CLIENT"`` → node id → client id (each node and client once).

    Raises:
        ConfigError: for a malformed pair, or a node or client named twice.
    """
    binding: dict[int, int] = {}
    for pair in text.split():
        node, _, client = pair.partition("=")
        if not (node.isdigit() and client.isdigit()):
            raise ConfigError(f"run config node-clients: expected NODE=CLIENT ids, got {pair!r}")
        if int(node) in binding or int(client) in binding.values():
            raise ConfigError(f"run config node-clients: {pair!r} names a node or client twice")
        binding[int(node)] = int(client)
    return binding
