"""The server side through Flower: one message per node per round (the round 0 of several
methods in one, ``batch-updates``), over a Grid.

:func:`run_server` is the ServerApp's body. It resolves the experiment exactly like a local
run (same config, same checks, same federation rebuilt from the server's copy of the data
for the public pool, the test split and the result bookkeeping) and runs it with the same
engine; Flower supplies only the transport, a :class:`GridTransport`:

* ``upload`` sends one ``update`` instruction to every node, waits up to ``reply-timeout``
  seconds, and hands the replies to the engine, which counts, validates and orders them by
  client id exactly as in simulation (the first method's round 0 also asks for every later
  method's that needs no broadcast, kept until the engine reaches it:
  :mod:`oneshotfl.flower.batch`);
* ``relay`` (peer methods) sends each receiving node one ``receive`` instruction holding
  its senders' bytes exactly as they arrived — the ServerApp forwards and never decodes or
  aggregates — and returns the nodes' reports on their own models.

Nodes that did not answer (gone, too slow, or failed) are named in the result; below the
quorum the run fails with a :class:`~oneshotfl.runner.errors.QuorumError` that names them.

Run config keys (``[tool.flwr.app.config]``, overridable with ``flwr run --run-config``):

* ``config``: a YAML experiment config on the server ("" = defaults);
* ``overrides``: space-separated ``key=value`` config overrides;
* ``out``: the results directory on the server ("" = ``runs/flower-<timestamp>``);
* ``node-timeout``: seconds to wait for ``clients`` nodes to connect (and, with a
  ``node-clients`` binding, every bound node);
* ``reply-timeout``: seconds to wait for a node's reply, from the push of its instruction;
* ``in-flight``: the most instructions outstanding at once (0 = every node's at once); the
  next is pushed as one is answered or times out. On one host with many SuperNodes (each
  instruction starts a ClientApp process) it bounds how many run at once;
* ``node-clients``: the deployment's binding of node ids to client ids, space-separated
  ``NODE=CLIENT`` ("" = none). With CLI-managed SuperNode authentication a node id is bound
  to the key it registered (``flwr supernode register`` prints it), so with a binding a
  registered node cannot claim another node's client id: a reply for any other client is
  refused and named, and a node outside the binding is never addressed;
* ``batch-updates``: ``true`` (the default) asks each node for the round 0 of every method
  that needs no broadcast in one message (:mod:`oneshotfl.flower.batch`: one ClientApp
  process per node, not one per method); ``false``: one message per method and round, each
  method's payloads held by the server only while it runs;
* ``shared-data``: the folder of the machine's memory-mapped copy of the dataset
  (:mod:`oneshotfl.data.shared`; "" = ``$ONESHOTFL_SHARED_DATA`` or the temp folder,
  ``off`` = load into the process's own memory).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from flwr.app import Message

from oneshotfl.data.shared import load_shared, shared_folder
from oneshotfl.flower.batch import read_batch_reply
from oneshotfl.flower.grid import (
    GridLike,
    error_line,
    placement,
    read_where,
    send_and_receive,
    wait_for_nodes,
)
from oneshotfl.flower.messages import (
    SERVER,
    Instruction,
    MessageError,
    instruction_content,
    read_reply,
    read_report,
    sender,
)
from oneshotfl.flower.settings import ServerSettings, parse_binding
from oneshotfl.protocol.contract import Method, PeerMethod
from oneshotfl.runner.config import ConfigError, load_config
from oneshotfl.runner.experiment import run_experiment
from oneshotfl.runner.federation import Federation
from oneshotfl.runner.plan import Plan, Schedules, preflight
from oneshotfl.runner.results import write_partial, write_result
from oneshotfl.runner.transport import ClientReply, Missing, PeerReport

__all__ = ["GridTransport", "ServerSettings", "parse_binding", "run_server", "send_and_receive"]

log = logging.getLogger(__name__)

MESSAGE_TYPE = "train.oneshotfl"


@dataclass
class GridTransport:
    """The Flower transport of the engine (see the module docs): one instruction per node
    per step, answers until the timeout.

    Attributes:
        grid: the ServerApp's Grid.
        node_config: the config keys a node needs (the plan's :meth:`~oneshotfl.runner.plan.
            Plan.node_config`), sent with every instruction.
        nodes: the node ids to address.
        timeout: seconds to wait for a node's answer, from its instruction's push.
        specs: method key → the resolved spec nodes build the method from.
        node_clients: node id → client id, learnt from update replies (for the result file
            and to address a peer method's receivers).
        binding: the deployment's node id → client id (empty: none); a reply for another
            client than its node's is refused.
        placement: client id → where its last update was computed (its node's host, and
            the Ray node that played it under the simulation engine).
        in_flight: the most instructions outstanding at once (0: all at once).
        batch: the keys whose round 0 is asked for together (:mod:`oneshotfl.flower.batch`),
            in the run's order; a key leaves it when its round 0 is asked for.
        fetched: key → its round 0's replies and silent nodes, asked for with an earlier
            method's, until the engine takes them.
    """

    grid: GridLike
    node_config: dict[str, Any]
    nodes: list[int]
    timeout: float
    specs: dict[str, str] = field(default_factory=dict)
    node_clients: dict[int, int] = field(default_factory=dict)
    binding: Mapping[int, int] = field(default_factory=dict)
    placement: dict[int, str] = field(default_factory=dict)
    in_flight: int = 0
    batch: list[str] = field(default_factory=list)
    fetched: dict[str, tuple[list[ClientReply], Missing]] = field(default_factory=dict)

    def upload(
        self, key: str, method: Method[Any], round_index: int, broadcast: bytes | None
    ) -> tuple[list[ClientReply], Missing]:
        together = key in self.fetched or key in self.batch
        if round_index == 0 and broadcast is None and together:
            if key not in self.fetched:
                self._fetch_together(key)
            return self.fetched.pop(key)
        payloads = {} if broadcast is None else {SERVER: broadcast}
        sent = self._send(key, "update", round_index, {n: payloads for n in self.nodes})
        replies: list[ClientReply] = []
        missing: Missing = {}
        for node, answer in self._answers(sent, missing):
            try:
                reply = read_reply(answer.content)
            except MessageError as exc:
                missing[self._name(node)] = f"malformed reply: {exc}"
                continue
            self._take(node, reply, read_where(answer.content), replies, missing)
        return replies, self._log(missing)

    def _fetch_together(self, key: str) -> None:
        """Ask every node for round 0 of ``key`` and of every later key in :attr:`batch`, in
        one message; keep each key's replies and silent nodes in :attr:`fetched`."""
        keys = [key, *(k for k in self.batch if k != key)]
        self.batch.clear()
        together = tuple((k, self.specs.get(k, k)) for k in keys[1:])
        sent = self._send(key, "update", 0, {n: {} for n in self.nodes}, batch=together)
        got: dict[str, tuple[list[ClientReply], Missing]] = {k: ([], {}) for k in keys}
        silent: Missing = {}
        for node, answer in self._answers(sent, silent):
            try:
                entries = read_batch_reply(answer.content, len(keys))
            except MessageError as exc:
                silent[self._name(node)] = f"malformed reply: {exc}"
                continue
            where = read_where(answer.content)
            for k, entry in zip(keys, entries, strict=True):
                replies, missing = got[k]
                if isinstance(entry, str):
                    missing[self._name(node)] = error_line(entry)
                else:
                    self._take(node, entry, where, replies, missing)
        log.info("round 0 of %d method(s) in one message per node: %s", len(keys), keys)
        for k, (replies, missing) in got.items():
            self.fetched[k] = replies, self._log({**silent, **missing})

    def _take(
        self,
        node: int,
        reply: ClientReply,
        where: str | None,
        replies: list[ClientReply],
        missing: Missing,
    ) -> None:
        """Keep ``node``'s ``reply`` (learning its client and where it was computed), unless
        the deployment binds the node to another client: then it is refused and named."""
        bound = self.binding.get(node, reply.client_id)
        if bound != reply.client_id:
            missing[f"node {node} (client {bound})"] = (
                f"claims client {reply.client_id}, but the deployment binds it to client "
                f"{bound}: refused"
            )
            return
        self.node_clients.setdefault(node, reply.client_id)
        if where is not None:
            self.placement[reply.client_id] = where
        replies.append(reply)

    def relay(
        self,
        key: str,
        method: PeerMethod[Any],
        routes: Mapping[int, Mapping[int, bytes]],
        schedules: Schedules,
    ) -> tuple[list[PeerReport], Missing]:
        node_of = {c: n for n, c in self.node_clients.items()}
        missing: Missing = {}
        addressed: dict[int, dict[str, bytes]] = {}
        windows: dict[int, tuple[tuple[int, ...], ...]] = {}
        for receiver, senders in routes.items():
            if receiver not in node_of:
                missing[f"client {receiver}"] = "no node answered for it, nothing relayed"
                continue
            addressed[node_of[receiver]] = {sender(s): data for s, data in senders.items()}
            windows[node_of[receiver]] = tuple(schedules[receiver])
        sent = self._send(key, "receive", 0, addressed, windows)
        reports = []
        for node, answer in self._answers(sent, missing):
            try:
                report = read_report(answer.content)
            except MessageError as exc:
                missing[self._name(node)] = f"malformed report: {exc}"
                continue
            if self.node_clients.get(node) != report.receiver:
                missing[self._name(node)] = f"reported for client {report.receiver}"
                continue
            reports.append(report)
        return reports, self._log(missing)

    def _send(
        self,
        key: str,
        step: str,
        round_index: int,
        payloads: Mapping[int, Mapping[str, bytes]],
        schedules: Mapping[int, tuple[tuple[int, ...], ...]] | None = None,
        batch: tuple[tuple[str, str], ...] = (),
    ) -> tuple[list[Message], list[Message]]:
        """One instruction per addressed node (its payloads; a receiver also gets its
        encounter schedule; a round-0 update the ``batch`` of further methods), and the
        answers that came before the timeout."""
        messages = [
            Message(
                instruction_content(
                    Instruction(
                        step=step,
                        method=self.specs.get(key, key),
                        key=key,
                        round=round_index,
                        config=self.node_config,
                        payloads=dict(blobs),
                        schedule=(schedules or {}).get(node, ()),
                        batch=batch,
                    )
                ),
                dst_node_id=node,
                message_type=MESSAGE_TYPE,
                group_id=f"{key}/{step}/{round_index}",
            )
            for node, blobs in payloads.items()
        ]
        answers = send_and_receive(self.grid, messages, self.timeout, in_flight=self.in_flight)
        return messages, answers

    def _answers(
        self, sent: tuple[list[Message], list[Message]], missing: Missing
    ) -> Iterator[tuple[int, Message]]:
        """Each answer with its node, taken out of the answers list as it is read (a round's
        replies are not held twice while they are decoded); errors and silent nodes go into
        ``missing`` (the silent ones once every answer was read).

        The Grid stamps each message with its id when pushing it. An answer names the
        message it answers; an error the SuperLink writes itself (an unavailable node) comes
        from the SuperLink's id, not the node's, so answers are attributed by message id."""
        messages, answers = sent
        to = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}
        heard = set()
        answers.reverse()
        while answers:
            answer = answers.pop()
            meta = answer.metadata
            node = to.get(meta.reply_to_message_id, meta.src_node_id)
            heard.add(node)
            if answer.has_error():
                missing[self._name(node)] = f"failed: {error_line(answer.error.reason)}"
            else:
                yield node, answer
        for node in to.values():
            if node not in heard:
                missing[self._name(node)] = f"no reply within {self.timeout:g} s"

    def _log(self, missing: Missing) -> Missing:
        for name, why in missing.items():
            log.warning("%s: %s", name, why)
        return missing

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
    settings = ServerSettings.from_run_config(run_config)
    cfg = load_config(settings.config, settings.overrides)
    if (settings.out / "result.json").exists():
        raise ConfigError(f"{settings.out}/result.json exists; choose another out")
    connected: list[GridTransport] = []

    def connect(federation: Federation, plan: Plan) -> GridTransport:
        """After the checks, before any message: wait for the nodes, open the transport."""
        binding = settings.node_clients
        nodes = wait_for_nodes(grid, cfg.clients, settings.node_timeout, required=binding)
        strangers = [n for n in nodes if binding and n not in binding]
        for node in strangers:
            log.warning("node %d is not in the deployment's node-clients: not addressed", node)
        nodes = [n for n in nodes if n not in strangers]
        together = [
            key for key, method in plan.methods
            if settings.batch_updates and method.broadcast_spec(federation.dims, 0) is None
        ]  # fmt: skip
        transport = GridTransport(
            grid, plan.node_config(), nodes, settings.reply_timeout, dict(plan.specs),
            binding=binding, in_flight=settings.in_flight,
            batch=together if len(together) > 1 else [],
        )  # fmt: skip
        log.info("running %d method(s) over %d Flower nodes", len(plan.methods), len(nodes))
        connected.append(transport)
        return transport

    plan = preflight(cfg)
    folder = shared_folder(settings.shared_data)
    dataset = load_shared(cfg.dataset, cfg.data_root, cfg.download, folder)

    def partial(doc: dict[str, Any]) -> None:  # a run cut short keeps what finished
        write_partial(settings.out, doc | {"flower": {"mode": mode, "partial": True}})

    doc = run_experiment(plan, connect=connect, dataset=dataset, lazy=True, partial=partial)
    (transport,) = connected
    doc["flower"] = {
        "mode": mode,
        "nodes": len(transport.nodes),
        "node_clients": {str(n): c for n, c in sorted(transport.node_clients.items())},
        "no_reply": {m["key"]: m["no_reply"] for m in doc["methods"] if m.get("no_reply")},
        "reply_timeout_s": settings.reply_timeout,
        "in_flight": settings.in_flight,
        "batch_updates": settings.batch_updates,
        "binding": {str(n): c for n, c in sorted(settings.node_clients.items())},
        "placement": placement(transport.placement),
    }
    write_result(settings.out, doc, title_suffix=" (Flower)")
    log.info("results: %s", settings.out / "result.json")
    return doc
