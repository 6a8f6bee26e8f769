"""The engine's transport over Flower's Grid (:mod:`oneshotfl.flower.server` runs it):
instructions out, replies and reports back, every node that did not answer named.

* ``upload`` sends one ``update`` instruction to every node, waits up to ``reply-timeout``
  seconds, and hands the replies to the engine, which counts, validates and orders them by
  client id exactly as in simulation (the first method's round 0 also asks for every later
  method's that needs no broadcast, kept until the engine reaches it:
  :mod:`oneshotfl.flower.batch`; in a cohort run each node answers for each of its clients:
  :mod:`oneshotfl.flower.cohort`);
* ``relay`` (peer methods) sends each receiving node one ``receive`` instruction holding
  its senders' bytes exactly as they arrived — the ServerApp forwards and never decodes or
  aggregates — and returns the nodes' reports on their own models.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from flwr.app import Message, RecordDict

from oneshotfl.flower.batch import Entry, read_batch_reply
from oneshotfl.flower.cohort import read_cohort_reply, read_cohort_reports, relayed
from oneshotfl.flower.grid import GridLike, error_line, read_where, send_and_receive
from oneshotfl.flower.messages import (
    SERVER,
    Instruction,
    MessageError,
    instruction_content,
    read_reply,
    read_report,
    sender,
)
from oneshotfl.protocol.contract import Method, PeerMethod
from oneshotfl.runner.errors import clip
from oneshotfl.runner.plan import Schedules
from oneshotfl.runner.transport import ClientReply, Missing, PeerReport

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
        cohort_size: the most clients a node holds and answers for in one message
            (:mod:`oneshotfl.flower.cohort`; Flower's simulation engine only; 0: one client
            per node). A cohort message waits ``timeout × cohort_size`` seconds.
        clients: the federation's client count (bounds a cohort's answer).
        cohorts: node id → the clients it answered for (a cohort run), learnt from its
            first answer.
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
    cohort_size: int = 0
    clients: int = 0
    cohorts: dict[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def cohort(self) -> bool:
        """Whether each node answers for a cohort of clients."""
        return self.cohort_size > 0

    @property
    def wait(self) -> float:
        """Seconds a message waits for its answer: ``timeout``, times the cohort's size."""
        return self.timeout * max(self.cohort_size, 1)

    def upload(
        self, key: str, method: Method[Any], round_index: int, broadcast: bytes | None
    ) -> tuple[list[ClientReply], Missing]:
        together = key in self.fetched or key in self.batch
        if round_index == 0 and broadcast is None and together:
            if key not in self.fetched:
                self._fetch_together(key)
            return self.fetched.pop(key)
        payloads = {} if broadcast is None else {SERVER: broadcast}
        return self._gather([key], round_index, payloads)[key]

    def _fetch_together(self, key: str) -> None:
        """Ask every node for round 0 of ``key`` and of every later key in :attr:`batch`, in
        one message; keep each key's replies and silent nodes in :attr:`fetched`."""
        keys = [key, *(k for k in self.batch if k != key)]
        self.batch.clear()
        self.fetched.update(self._gather(keys, 0, {}))
        log.info("round 0 of %d method(s) in one message per node: %s", len(keys), keys)

    def _gather(
        self, keys: list[str], round_index: int, payloads: Mapping[str, bytes]
    ) -> dict[str, tuple[list[ClientReply], Missing]]:
        """One update instruction per node for ``keys`` (the first the instruction's own, the
        others its batch); each key's replies and the nodes and clients without one."""
        together = tuple((k, self.specs.get(k, k)) for k in keys[1:])
        sent = self._send(
            keys[0], "update", round_index, {n: payloads for n in self.nodes}, batch=together
        )
        got: dict[str, tuple[list[ClientReply], Missing]] = {k: ([], {}) for k in keys}
        silent: Missing = {}
        for node, answer in self._answers(sent, silent):
            try:
                rows = self._entries(node, answer.content, len(keys), bool(together))
            except MessageError as exc:
                silent.update((name, f"malformed reply: {exc}") for name in self._names(node))
                continue
            where = read_where(answer.content)
            for k, row in zip(keys, rows, strict=True):
                replies, missing = got[k]
                for name, entry in row:
                    if isinstance(entry, str):  # named once its node's replies were read
                        missing[name or self._name(node)] = error_line(entry)
                    else:
                        self._take(node, entry, where, replies, missing)
        return {k: (got[k][0], self._log({**silent, **got[k][1]})) for k in keys}

    def _entries(
        self, node: int, content: RecordDict, methods: int, batched: bool
    ) -> list[list[tuple[str | None, Entry]]]:
        """Per method, each client's entry of ``node``'s answer, with the name a failure
        goes under in a cohort run (a cohort's clients learnt from its first answer; ``None``:
        the node's name).

        Raises:
            MessageError: for an answer that is not the protocol's.
        """
        if not self.cohort:
            if not batched:
                return [[(None, read_reply(content))]]
            return [[(None, e)] for e in read_batch_reply(content, methods)]
        cohort, rows = read_cohort_reply(content, methods, self.cohorts.get(node), self.clients)
        if node not in self.cohorts:
            self._learn(node, cohort)
        named: list[list[tuple[str | None, Entry]]] = []
        for row in rows:
            named.append([])
            for cid, entry in zip(cohort, row, strict=True):
                if not isinstance(entry, str) and entry.client_id != cid:
                    entry = f"malformed reply: client {cid}'s entry is client {entry.client_id}'s"
                named[-1].append((f"node {node} (client {cid})", entry))
        return named

    def _learn(self, node: int, cohort: tuple[int, ...]) -> None:
        """Keep ``node``'s cohort from its first answer: at most ``cohort_size`` clients, none
        another node answered for.

        Raises:
            MessageError: for a larger cohort or a client claimed twice.
        """
        if len(cohort) > self.cohort_size:
            nodes = -(-self.clients // self.cohort_size)
            raise MessageError(
                f"answered for {len(cohort)} clients, more than cohort-size {self.cohort_size}: "
                f"start ceil(clients / cohort-size) = {nodes} SuperNodes"
            )
        for other, theirs in self.cohorts.items():
            twice = sorted(set(cohort) & set(theirs))
            if twice:
                raise MessageError(
                    f"answered for clients {clip(str(twice), 80)}, which node {other} answers for"
                )
        self.cohorts[node] = cohort

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
        if not self.cohort:
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
        if self.cohort:
            return self._relay_cohorts(key, routes, schedules)
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

    def _relay_cohorts(
        self, key: str, routes: Mapping[int, Mapping[int, bytes]], schedules: Schedules
    ) -> tuple[list[PeerReport], Missing]:
        """A cohort run's relay: one receive instruction per node for its receivers, each's
        senders under ``r<receiver>/client-<sender>``; one report per receiver back."""
        node_of = {c: n for n, cohort in self.cohorts.items() for c in cohort}
        missing: Missing = {}
        addressed: dict[int, dict[str, bytes]] = {}
        receivers: dict[int, list[int]] = {}
        for receiver, senders in routes.items():
            if receiver not in node_of:
                missing[f"client {receiver}"] = "no node answered for it, nothing relayed"
                continue
            node = node_of[receiver]
            addressed.setdefault(node, {}).update(
                (relayed(receiver, s), data) for s, data in senders.items()
            )
            receivers.setdefault(node, []).append(receiver)
        asked = {n: tuple(r) for n, r in receivers.items()}
        windows = {n: tuple(tuple(schedules[r]) for r in rs) for n, rs in asked.items()}
        sent = self._send(key, "receive", 0, addressed, cohorts=(asked, windows))
        reports = []
        for node, answer in self._answers(sent, missing, asked):
            try:
                got = read_cohort_reports(answer.content, asked.get(node, ()), self.clients)
            except MessageError as exc:
                missing.update((n, f"malformed report: {exc}") for n in self._names(node, asked))
                continue
            for cid, report in got:
                name = f"node {node} (client {cid})"
                if isinstance(report, str):
                    missing[name] = error_line(report)
                elif report.receiver != cid:
                    missing[name] = f"reported for client {report.receiver}"
                else:
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
        cohorts: tuple[Mapping[int, tuple[int, ...]], Mapping[int, Any]] | None = None,
    ) -> tuple[list[Message], list[Message]]:
        """One instruction per addressed node (its payloads; a receiver also gets its
        encounter schedule; a round-0 update the ``batch`` of further methods; in a cohort
        run, the node's clients — its receivers and their schedules for a relay, ``cohorts``
        — or every client it holds, ``[]``, before its first answer), and the answers that
        came before the timeout."""
        asked, windows = cohorts if cohorts is not None else (self.cohorts, {})
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
                        clients=asked.get(node, ()) if self.cohort else None,
                        schedules=windows.get(node, ()),
                    )
                ),
                dst_node_id=node,
                message_type=MESSAGE_TYPE,
                group_id=f"{key}/{step}/{round_index}",
            )
            for node, blobs in payloads.items()
        ]
        answers = send_and_receive(self.grid, messages, self.wait, in_flight=self.in_flight)
        return messages, answers

    def _answers(
        self,
        sent: tuple[list[Message], list[Message]],
        missing: Missing,
        asked: Mapping[int, tuple[int, ...]] | None = None,
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
                why = f"failed: {error_line(answer.error.reason)}"
                missing.update((name, why) for name in self._names(node, asked))
            else:
                yield node, answer
        for node in to.values():
            if node not in heard:
                why = f"no reply within {self.wait:g} s"
                missing.update((name, why) for name in self._names(node, asked))

    def _log(self, missing: Missing) -> Missing:
        for name, why in missing.items():
            log.warning("%s: %s", name, why)
        return missing

    def _names(self, node: int, asked: Mapping[int, tuple[int, ...]] | None = None) -> list[str]:
        """Who goes unanswered when ``node`` does: the node (and its client), or in a cohort
        run each client it was asked for (``asked``, else its cohort; before its first answer
        the node alone: the clients it holds are named by id with the run's silent ones)."""
        if not self.cohort:
            return [self._name(node)]
        cohort = (asked or self.cohorts).get(node)
        if cohort is None:
            return [f"node {node} (cohort)"]
        return [f"node {node} (client {cid})" for cid in cohort]

    def _name(self, node: int) -> str:
        cid = self.node_clients.get(node)
        return f"node {node}" if cid is None else f"node {node} (client {cid})"
