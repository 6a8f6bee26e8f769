"""Cohorts on Flower's simulation engine: one message carries several virtual clients.

Flower starts a ClientApp for every message a SuperNode takes, so one client per message pays
that start (and its message's round trip) once per client. With the run config's
``cohort-size`` S > 0 the simulation runs ``ceil(clients / S)`` virtual SuperNodes; the node of
``partition-id`` p among ``num-partitions`` K holds the clients ``c ≡ p (mod K)`` (at most S
of them), and one instruction asks it for several clients: ``clients = []`` for every client
it holds (the first message of a run, before the server knows who holds whom), or a list of
them (what the server learnt, in every later message). The node runs them one after another
in its one process, over its process's shared copy of the data, each through exactly the
steps of its own message (:func:`~oneshotfl.flower.node.run_update`,
:func:`~oneshotfl.flower.node.run_receive`), and answers with every (method, client) entry:
the client's reply, validated by the server's engine on its own, or the one-line reason it
failed on the node. So a bad client is still rejected and named, and the others stay.

A deployment keeps one client per SuperNode (the default, ``cohort-size = 0``): a real client
is a machine of its own. A node with its own ``dataset`` holds one client and refuses a
cohort; a cohort naming a client the node does not hold is refused, naming it.

Reply layout (node → server): ``oneshotfl.cohort`` (a ConfigRecord: ``clients``, the JSON
list of the clients answered for, in order), then :mod:`oneshotfl.flower.batch`'s entries
indexed ``m * len(clients) + j`` for method ``m`` of the instruction and client ``j``; a
``receive`` step answers with ``oneshotfl.report.j`` (a receiver's report,
:func:`~oneshotfl.flower.messages.report_content`) or ``oneshotfl.failed.j`` per client. A
relay carries each receiver's senders under ``r<receiver>/client-<sender>``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial

from flwr.app import ConfigRecord, RecordDict

from oneshotfl.flower.batch import (
    COHORT,
    FAILED,
    Entry,
    attempt_each,
    batch_reply_content,
    entry_name,
    read_batch_reply,
    read_failure,
)
from oneshotfl.flower.messages import (
    REPORT,
    Instruction,
    MessageError,
    distinct_ids,
    read_report,
    report_content,
    sender,
    sender_id,
)
from oneshotfl.flower.node import (
    NodeCache,
    NodeIdentity,
    NodeState,
    node_state,
    run_receive,
    run_update,
)
from oneshotfl.flower.records import config_record, json_value
from oneshotfl.runner.config import ConfigError
from oneshotfl.runner.errors import clip
from oneshotfl.runner.transport import ClientReply, PeerReport

log = logging.getLogger(__name__)

Report = PeerReport | str
"""One receiver's part of a cohort's receive answer: its report, or why it has none."""


def relayed(receiver: int, sender_id: int) -> str:
    """The payload name of ``sender_id``'s bytes relayed to ``receiver`` in a cohort."""
    return f"r{receiver}/{sender(sender_id)}"


def held_clients(identity: NodeIdentity, clients: object) -> tuple[int, ...]:
    """The clients a cohort node holds: ``c ≡ partition-id (mod num-partitions)``.

    Raises:
        ConfigError: for a node with its own dataset (one client), or one without
            ``num-partitions`` (a cohort needs Flower's simulation engine's node config).
    """
    if identity.dataset is not None:
        raise ConfigError(
            f"node config: a node with its own dataset holds one client and takes no cohort, "
            f"got a cohort instruction (dataset {identity.dataset!r})"
        )
    if identity.num_partitions is None or identity.num_partitions < 1:
        raise ConfigError(
            "node config: a cohort needs num-partitions (set by Flower's simulation engine), "
            f"got {identity.num_partitions!r}"
        )
    n = clients if isinstance(clients, int) and not isinstance(clients, bool) else 0
    return tuple(range(identity.partition_id, n, identity.num_partitions))


def cohort_of(instruction: Instruction, identity: NodeIdentity) -> tuple[int, ...]:
    """The clients a cohort instruction asks this node for (every one it holds for ``[]``).

    Raises:
        ConfigError: when it names clients the node does not hold (named), or the node
            cannot take a cohort (:func:`held_clients`).
    """
    held = held_clients(identity, instruction.config.get("clients"))
    asked = held if not instruction.clients else instruction.clients
    stray = sorted(set(asked) - set(held))
    if stray:
        p, k = identity.partition_id, identity.num_partitions
        raise ConfigError(
            f"cohort: node {p} of {k} holds the clients c ≡ {p} (mod {k}); refused: it was asked "
            f"for clients {clip(', '.join(map(str, stray)), 200)}, which it does not hold"
        )
    return asked


def run_cohort(instruction: Instruction, identity: NodeIdentity, cache: NodeCache) -> RecordDict:
    """Answer a cohort instruction: each of its clients in turn, each method of the
    instruction (its own and its batch's) for an update, its receipt for a receive step.

    Raises:
        ConfigError: for a cohort the node cannot take (:func:`cohort_of`).
        Exception: the first client's error when every entry failed.
    """
    asked = cohort_of(instruction, identity)
    config = instruction.config

    def state(cid: int) -> NodeState:
        return node_state(config, replace(identity, partition_id=cid, num_partitions=None), cache)

    if instruction.step == "receive":
        relay_names(instruction.payloads, asked)
        spec = instruction.method
        schedules = instruction.schedules or ((),) * len(asked)

        def receipt(cid: int, windows: tuple[tuple[int, ...], ...]) -> PeerReport:
            deliveries = _deliveries(instruction.payloads, cid)
            return run_receive(state(cid), cache.method(spec), spec, deliveries, windows)

        receipts = [
            (f"client {cid}", partial(receipt, cid, windows))
            for cid, windows in zip(asked, schedules, strict=True)
        ]
        return cohort_reports_content(asked, attempt_each(receipts))

    def update(cid: int, spec: str) -> ClientReply:
        step = instruction.round, instruction.payloads
        return run_update(state(cid), cache.method(spec), spec, *step)

    keys = ((instruction.key, instruction.method), *instruction.batch)
    updates = [
        (f"{key} client {cid}", partial(update, cid, spec)) for cid in asked for key, spec in keys
    ]
    flat = attempt_each(updates)  # client-major: a client's methods share its artefacts
    by_method = [flat[m :: len(keys)] for m in range(len(keys))]
    log.info("cohort of %d client(s): %d method(s)", len(asked), len(keys))
    return cohort_reply_content(asked, by_method)


def relay_names(payloads: Mapping[str, bytes], asked: Sequence[int]) -> None:
    """Check that every payload of a cohort's relay is named ``r<receiver>/client-<sender>``
    for one of the ``asked`` receivers.

    Raises:
        ConfigError: naming the first payload that is not.
    """
    for name in payloads:
        head, _, rest = name.partition("/")
        if not (head[:1] == "r" and head[1:].isdigit() and int(head[1:]) in asked):
            raise ConfigError(
                f"cohort relay: expected payloads named r<receiver>/client-<id> for receivers "
                f"{clip(str(list(asked)), 80)}, got {clip(name, 80)!r}"
            )
        sender_id(rest)  # raises for a name that is not client-<id>


def _deliveries(payloads: Mapping[str, bytes], receiver: int) -> dict[str, bytes]:
    """The payloads relayed to ``receiver``, under their ``client-<id>`` names."""
    prefix = f"r{receiver}/"
    return {name[len(prefix) :]: data for name, data in payloads.items() if name.startswith(prefix)}


def _clients_record(clients: Sequence[int]) -> ConfigRecord:
    return ConfigRecord({"clients": json.dumps(list(clients))})


def cohort_reply_content(
    clients: Sequence[int], by_method: Sequence[Sequence[Entry]]
) -> RecordDict:
    """A cohort's answer to an update: its clients, then entry ``m * len(clients) + j``."""
    content = batch_reply_content([entry for row in by_method for entry in row])
    content[COHORT] = _clients_record(clients)
    return content


def cohort_reports_content(clients: Sequence[int], reports: Sequence[Report]) -> RecordDict:
    """A cohort's answer to a receive step: its clients, then each receiver's report."""
    content = RecordDict()
    content[COHORT] = _clients_record(clients)
    for j, report in enumerate(reports):
        if isinstance(report, str):
            content[entry_name(FAILED, j)] = ConfigRecord({"reason": clip(report, 400)})
        else:
            content[entry_name(REPORT, j)] = report_content(report).config_records[REPORT]
    return content


def read_cohort(content: RecordDict, asked: Sequence[int] | None, clients: int) -> tuple[int, ...]:
    """The clients a cohort answer is for: distinct ids below ``clients``; exactly ``asked``
    when the instruction named them (``None``: it asked for every client the node holds).

    Raises:
        MessageError: for anything else.
    """
    record = config_record(content, COHORT)
    text = record.get("clients")
    value = json_value(text, f"{COHORT}.clients") if isinstance(text, str) else None
    got = distinct_ids(value, clients)
    if got is None:
        raise MessageError(
            f"{COHORT}.clients: expected distinct client ids below {clients}, got "
            f"{clip(str(text), 80)!r}"
        )
    if asked is not None and list(got) != list(asked):
        raise MessageError(
            f"{COHORT}.clients: asked for clients {clip(str(list(asked)), 80)}, answered for "
            f"{clip(str(list(got)), 80)}"
        )
    return got


def read_cohort_reply(
    content: RecordDict, methods: int, asked: Sequence[int] | None, clients: int
) -> tuple[tuple[int, ...], list[list[Entry]]]:
    """A cohort's answer to an update: its clients and, per method, each client's entry
    (:func:`~oneshotfl.flower.batch.read_batch_reply`'s, one per (method, client)).

    Raises:
        MessageError: for an answer that is not the layout the module docs describe.
    """
    cohort = read_cohort(content, asked, clients)
    flat = read_batch_reply(content, methods * len(cohort))
    width = len(cohort)
    return cohort, [flat[m * width : (m + 1) * width] for m in range(methods)]


def read_cohort_reports(
    content: RecordDict, asked: Sequence[int], clients: int
) -> list[tuple[int, Report]]:
    """Each receiver of a cohort and its report, or ``"failed: <reason>"`` /
    ``"malformed report: <why>"``.

    Raises:
        MessageError: for an answer for other clients than ``asked``.
    """
    cohort = read_cohort(content, asked, clients)
    out: list[tuple[int, Report]] = []
    for j, cid in enumerate(cohort):
        failed = read_failure(content, j)
        if failed is not None:
            out.append((cid, failed))
            continue
        single = RecordDict()
        if entry_name(REPORT, j) in content.config_records:
            single[REPORT] = content.config_records[entry_name(REPORT, j)]
        try:
            out.append((cid, read_report(single)))
        except MessageError as exc:
            out.append((cid, f"malformed report: {exc}"))
    return out
