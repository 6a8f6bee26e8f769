"""The server side through Flower: one message per node per round, over a Grid.

:func:`run_server` is the ServerApp's body. It resolves the experiment exactly like a local
run (same config, same checks, same federation rebuilt from the server's copy of the data
for the public pool, the test split and the result bookkeeping), then runs every method
with :func:`oneshotfl.runner.simulation.run_method`, whose transport is a
:class:`GridExchange`: the server sends one instruction to every node, waits up to
``reply-timeout`` seconds, and hands the replies to the runner, which counts, validates and
orders them by client id exactly as in simulation. Nodes that did not reply (gone, too slow,
or failed) are named in the result; below the quorum the run fails with a
:class:`~oneshotfl.runner.simulation.QuorumError` that names them.

Run config keys (``[tool.flwr.app.config]``, overridable with ``flwr run --run-config``):

* ``config``: a YAML experiment config on the server ("" = defaults);
* ``overrides``: space-separated ``key=value`` config overrides;
* ``out``: the results directory on the server ("" = ``runs/flower-<timestamp>``);
* ``node-timeout``: seconds to wait for ``clients`` nodes to connect;
* ``reply-timeout``: seconds to wait for the replies of one round.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from flwr.app import Message

from oneshotfl.federation.contract import Method
from oneshotfl.flower.messages import (
    SERVER,
    Instruction,
    MessageError,
    instruction_content,
    read_reply,
)
from oneshotfl.plots import partition_heatmap
from oneshotfl.runner.config import ConfigError, ExperimentConfig, load_config
from oneshotfl.runner.results import write_result
from oneshotfl.runner.simulation import (
    ClientReply,
    check_requirements,
    prepare,
    resolve_methods,
    result_document,
    run_method,
)

log = logging.getLogger(__name__)

MESSAGE_TYPE = "train.oneshotfl"


class GridLike(Protocol):
    """The part of :class:`flwr.serverapp.Grid` the server uses (a test double fits)."""

    def get_node_ids(self) -> Iterable[int]: ...

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]: ...


@dataclass(frozen=True)
class ServerSettings:
    """The ServerApp's run config, validated.

    Attributes:
        config: YAML experiment config path on the server, or ``None``.
        overrides: ``key=value`` config overrides.
        out: results directory.
        node_timeout: seconds to wait for the nodes to connect.
        reply_timeout: seconds to wait for one round's replies.
    """

    config: str | None
    overrides: tuple[str, ...]
    out: Path
    node_timeout: float = 60.0
    reply_timeout: float = 600.0

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> ServerSettings:
        """Read the settings from Flower's run config (see the module docs for the keys).

        Raises:
            ConfigError: for a value of the wrong type or a non-positive timeout.
        """
        text = {k: run_config.get(k, "") for k in ("config", "overrides", "out")}
        for key, value in text.items():
            if not isinstance(value, str):
                raise ConfigError(f"run config {key}: expected a string, got {value!r}")
        timeouts = {}
        for key, default in (("node-timeout", 60.0), ("reply-timeout", 600.0)):
            value = run_config.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"run config {key}: expected seconds > 0, got {value!r}")
            timeouts[key] = float(value)
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        return cls(
            config=text["config"] or None,
            overrides=tuple(shlex.split(text["overrides"])),
            out=Path(text["out"] or f"runs/flower-{stamp}"),
            node_timeout=timeouts["node-timeout"],
            reply_timeout=timeouts["reply-timeout"],
        )


def wait_for_nodes(grid: GridLike, wanted: int, timeout: float, poll: float = 0.5) -> list[int]:
    """The connected node ids, once ``wanted`` are connected or ``timeout`` has passed."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= wanted or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    if len(nodes) < wanted:
        log.warning("%d of %d nodes connected after %.0f s", len(nodes), wanted, timeout)
    return nodes


@dataclass
class GridExchange:
    """The Flower transport of :func:`~oneshotfl.runner.simulation.run_method`: one
    instruction per node, replies until the timeout.

    Attributes:
        grid: the ServerApp's Grid.
        cfg: the experiment config sent to every node.
        nodes: the node ids to address.
        timeout: seconds to wait for one round's replies.
        specs: method key → the method spec nodes build the method from.
        node_clients: node id → client id, learnt from replies (for the result file).
    """

    grid: GridLike
    cfg: ExperimentConfig
    nodes: list[int]
    timeout: float
    specs: dict[str, str] = field(default_factory=dict)
    node_clients: dict[int, int] = field(default_factory=dict)

    def __call__(
        self, key: str, method: Method[Any], round_index: int, broadcast: bytes | None
    ) -> tuple[list[ClientReply], dict[str, str]]:
        instruction = Instruction(
            method=self.specs.get(key, key),
            key=key,
            round=round_index,
            config=self.cfg.to_dict(),
            payloads={} if broadcast is None else {SERVER: broadcast},
        )
        messages = [
            Message(
                instruction_content(instruction),
                dst_node_id=node,
                message_type=MESSAGE_TYPE,
                group_id=f"{key}/{round_index}",
            )
            for node in self.nodes
        ]
        answers = list(self.grid.send_and_receive(messages, timeout=self.timeout))
        # The Grid stamps each message with its id when pushing it. A reply names the message
        # it answers; an error the SuperLink writes itself (an unavailable node) comes from
        # the SuperLink's id, not the node's, so replies are attributed by message id.
        sent = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}
        return self._read(answers, sent)

    def _read(
        self, answers: list[Message], sent: Mapping[str, int]
    ) -> tuple[list[ClientReply], dict[str, str]]:
        replies, missing, heard = [], {}, set()
        for answer in answers:
            meta = answer.metadata
            node = sent.get(meta.reply_to_message_id, meta.src_node_id)
            heard.add(node)
            if answer.has_error():
                missing[self._name(node)] = f"failed: {answer.error.reason}"
                continue
            try:
                reply = read_reply(answer.content)
            except MessageError as exc:
                missing[self._name(node)] = f"malformed reply: {exc}"
                continue
            self.node_clients.setdefault(node, reply.client_id)
            replies.append(reply)
        for node in self.nodes:
            if node not in heard:
                missing[self._name(node)] = f"no reply within {self.timeout:g} s"
        for name, why in missing.items():
            log.warning("%s: %s", name, why)
        return replies, missing

    def _name(self, node: int) -> str:
        cid = self.node_clients.get(node)
        return f"node {node}" if cid is None else f"node {node} (client {cid})"


def run_server(grid: GridLike, run_config: Mapping[str, Any], mode: str) -> dict[str, Any]:
    """Run every configured method through ``grid``; write and return the result document.

    Args:
        grid: the ServerApp's Grid (or a test double).
        run_config: Flower's run config (keys in the module docs).
        mode: how Flower runs (``simulation`` or ``deployment``), for the result file.

    Raises:
        ConfigError: for a config that cannot run (before any message is sent).
        QuorumError: when a round gets fewer valid payloads than the quorum.
    """
    started, t0 = datetime.now(UTC), time.perf_counter()
    settings = ServerSettings.from_run_config(run_config)
    cfg = load_config(settings.config, settings.overrides)
    if (settings.out / "result.json").exists():
        raise ConfigError(f"{settings.out}/result.json exists; choose another out")
    methods = resolve_methods(cfg.methods)
    setup = prepare(cfg)
    setup.remote_clients = True  # client facts come from the nodes' replies only
    check_requirements(methods, setup)
    nodes = wait_for_nodes(grid, cfg.clients, settings.node_timeout)
    exchange = GridExchange(grid, cfg, nodes, settings.reply_timeout)
    exchange.specs = dict(zip([k for k, _ in methods], cfg.methods, strict=True))
    results = []
    for key, method in methods:
        log.info("running %s over %d Flower nodes", key, len(nodes))
        results.append(run_method(key, method, setup, exchange))
    doc = result_document(setup, results, started, t0)
    doc["flower"] = {
        "mode": mode,
        "nodes": len(nodes),
        "node_clients": {str(n): c for n, c in sorted(exchange.node_clients.items())},
        "no_reply": {r["key"]: r["no_reply"] for r in results if r.get("no_reply")},
        "reply_timeout_s": settings.reply_timeout,
    }
    write_result(settings.out, doc)
    counts = np.array([c["label_histogram"] for c in doc["clients"]])
    title = f"{cfg.dataset} · {cfg.partition} · {cfg.clients} clients (Flower)"
    partition_heatmap(counts, settings.out / "partition.png", title)
    log.info("results: %s", settings.out / "result.json")
    return doc
