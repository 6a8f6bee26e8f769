"""Several methods' first round in one message: one ClientApp process per node for a run's
uploads, not one per method.

A one-shot client trains once and sends once; a run that compares methods asks every client
for each method's round 0, and none of those needs anything from the server (no broadcast).
In Flower every message a SuperNode takes starts a ClientApp process (a Python process that
imports Flower and torch before it does any work), so a run of five methods used to start five
per node. With the run config's ``batch-updates`` (on by default) the ServerApp asks, in the
first method's round-0 instruction, for the round 0 of every later method of the run that
needs no broadcast (the instruction's ``batch``: their keys and specs, in the run's order);
the node runs them one after another in that one process — exactly the steps of separate
messages, sharing the client artefacts in memory as the simulation does — and answers with
one entry per method: its reply, or the one-line reason it failed on this node. The server
hands each method its entries when the engine reaches it, so the engine, the bookkeeping and
the result file are those of separate messages; a node that fails or stays silent is named
for every method of the batch, as it would have been for each message.

Reply layout (node → server, one entry per method ``i`` of the instruction, the first being
the instruction's own method): ``oneshotfl.reply.i`` and ``oneshotfl.payloads.i`` (the records
of a single reply, :func:`~oneshotfl.flower.messages.reply_content`), or
``oneshotfl.failed.i`` (a ConfigRecord holding ``reason``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from flwr.app import ConfigRecord, RecordDict

from oneshotfl.flower.grid import WHERE
from oneshotfl.flower.messages import (
    PAYLOADS,
    REPLY,
    MessageError,
    read_reply,
    reply_content,
)
from oneshotfl.runner.errors import clip
from oneshotfl.runner.transport import ClientReply

log = logging.getLogger(__name__)

FAILED = "oneshotfl.failed"
"""The record of a method that failed on the node (its ``reason``)."""

COHORT = "oneshotfl.cohort"
"""The record of a cohort's answer that lists its clients (:mod:`oneshotfl.flower.cohort`)."""

Entry = ClientReply | str
"""One method's part of a batched answer: its reply, or why it has none (one line)."""

T = TypeVar("T")


def entry_name(record: str, index: int) -> str:
    """The name of entry ``index``'s ``record`` in a batched answer."""
    return f"{record}.{index}"


def attempt_each(steps: Sequence[tuple[str, Callable[[], T]]]) -> list[T | str]:
    """Run each named step in order: its result, or the one-line reason it failed on this
    node (one failing costs the others nothing); when every step failed, the first error
    is raised (the node's whole answer fails, as a single step's would)."""
    entries: list[T | str] = []
    first: Exception | None = None
    for name, step in steps:
        try:
            entries.append(step())
        except Exception as exc:
            log.warning("%s failed on this node", name, exc_info=True)
            entries.append(f"{type(exc).__name__}: {exc}")
            first = first or exc
    if first is not None and all(isinstance(e, str) for e in entries):
        raise first
    return entries


def read_failure(content: RecordDict, index: int) -> str | None:
    """``"failed: <reason>"`` when entry ``index`` of an answer failed on the node, else
    ``None``."""
    failed = content.config_records.get(entry_name(FAILED, index))
    if failed is None:
        return None
    reason = failed.get("reason")
    return f"failed: {clip(reason if isinstance(reason, str) else '?', 400)}"


def batch_reply_content(entries: Sequence[Entry]) -> RecordDict:
    """The RecordDict of a node's answer to a batched instruction: each method's reply
    records under its index, or the reason it failed."""
    content = RecordDict()
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            content[entry_name(FAILED, i)] = ConfigRecord({"reason": clip(entry, 400)})
            continue
        single = reply_content(entry)
        content[entry_name(REPLY, i)] = single.config_records[REPLY]
        content[entry_name(PAYLOADS, i)] = single.array_records[PAYLOADS]
    return content


def read_batch_reply(content: RecordDict, methods: int) -> list[Entry]:
    """Each of the ``methods`` entries of a batched answer, in the instruction's order: the
    :class:`ClientReply` (payload bytes as they came), ``"failed: <reason>"`` for a method
    that failed on the node, or ``"malformed reply: <why>"`` for an entry that is not what
    the protocol expects (the other entries are read all the same).

    Raises:
        MessageError: for an answer holding records of no entry (more methods than asked).
    """
    known = {entry_name(r, i) for i in range(methods) for r in (REPLY, PAYLOADS, FAILED)}
    extra = sorted(set(content.keys()) - known - {WHERE, COHORT})
    if extra:
        raise MessageError(
            f"a batched reply for {methods} method(s): expected records of entries 0..{methods - 1}"
            f", got {clip(', '.join(extra), 200)}"
        )
    entries: list[Entry] = []
    for i in range(methods):
        failed = read_failure(content, i)
        if failed is not None:
            entries.append(failed)
            continue
        single = RecordDict()
        if entry_name(REPLY, i) in content.config_records:
            single[REPLY] = content.config_records[entry_name(REPLY, i)]
        if entry_name(PAYLOADS, i) in content.array_records:
            single[PAYLOADS] = content.array_records[entry_name(PAYLOADS, i)]
        try:
            entries.append(read_reply(single))
        except MessageError as exc:
            entries.append(f"malformed reply: {exc}")
    return entries
