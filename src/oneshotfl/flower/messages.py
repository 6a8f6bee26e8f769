"""What crosses Flower: our wire bytes inside Flower records, and the facts around them.

Every payload travels as the exact bytes of :func:`oneshotfl.payload.encode`
(safetensors, never pickle), stored as one ``uint8`` :class:`flwr.app.Array` in an
:class:`flwr.app.ArrayRecord`, so Flower chunks large payloads like any array and the byte
count we report is the count of what was sent. Decoding and validation on receipt are the
simulation's own (:func:`oneshotfl.protocol.wire.receive`), called by the runner.

Message flow (one message per node per step, one reply; with ``batch`` one message per node
for the round 0 of several methods, :mod:`oneshotfl.flower.batch`):

* **instruction** (server → node): ``oneshotfl.instruction`` (a ConfigRecord: protocol
  version, step, the method's resolved spec and key, round, the node's part of the plan's
  config as JSON (:meth:`oneshotfl.runner.plan.Plan.node_config`), a receiver's schedule)
  and, when the server sends something, ``oneshotfl.payloads`` holding wire bytes keyed by
  their sender; ``batch`` lists further methods (key, spec) whose round 0 the node runs in
  the same message. Step ``update`` asks for the node's ``client_update`` (with
  ``"server"``: a multi-round broadcast). Step ``receive`` is the relay of a peer
  (server-free) method: the ServerApp forwards each neighbour's bytes unchanged under
  ``"client-<id>"`` — it never decodes or aggregates them — and the receiving node
  validates each with the same ``receive``.
* **reply to update** (node → server): ``oneshotfl.payloads`` with the node's bytes under
  ``"client-<id>"`` and ``oneshotfl.reply`` (a ConfigRecord: client id, the seconds spent in
  ``client_update``, the local model's accuracies as JSON, and in round 0 its shard report:
  training and validation sizes and label counts, the server's only source for them). The
  facts go into the result file only; a receiver sees only validated payloads.
* **reply to receive** (node → server): ``oneshotfl.report`` (a ConfigRecord: the receiver,
  its own model's accuracy globally and on its own distribution, the senders it refused and
  why, its seconds and diagnostics as JSON). No model leaves the node.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flwr.app import ConfigRecord, RecordDict

from oneshotfl.flower.records import (
    MessageError,
    bytes_record,
    config_record,
    is_integer,
    is_number,
    json_value,
    record_bytes,
    typed_fields,
)
from oneshotfl.runner.config import ConfigError
from oneshotfl.runner.evaluate import ClientMetrics
from oneshotfl.runner.ledger import ShardReport
from oneshotfl.runner.transport import ClientReply, PeerReport

PROTOCOL = 5
INSTRUCTION = "oneshotfl.instruction"
REPLY = "oneshotfl.reply"
REPORT = "oneshotfl.report"
STEPS = ("update", "receive")
PAYLOADS = "oneshotfl.payloads"
SERVER = "server"
#: The longest shard report accepted (JSON characters): room for 100 000 classes' counts.
MAX_SHARD_JSON = 2_000_000


def sender(client_id: int) -> str:
    """The payload name of a client's bytes."""
    return f"client-{client_id}"


def sender_id(name: str) -> int:
    """The client id in a payload name ``client-<id>``.

    Raises:
        ConfigError: for any other name.
    """
    prefix, _, digits = name.partition("-")
    if prefix != "client" or not digits.isdigit():
        raise ConfigError(f"payload name: expected 'client-<id>', got {name!r}")
    return int(digits)


@dataclass(frozen=True)
class Instruction:
    """What a node is asked to do: one round of one method.

    Attributes:
        step: ``update`` (the node's ``client_update``) or ``receive`` (a peer receipt).
        method: the method spec (``name:key=value``), built by the node's registry.
        key: the method's key in the result file.
        round: the round, from 0.
        config: the config keys a node needs (:meth:`oneshotfl.runner.plan.Plan.node_config`).
        payloads: wire bytes the server sends or relays, keyed by sender (``"server"``,
            ``"client-<id>"``).
        schedule: a ``receive`` step's encounter schedule, as the server's plan drew it (the
            senders of each collection window); empty for an update.
        batch: more methods whose round 0 the node runs in the same message, as (key, spec)
            pairs in the run's order (:mod:`oneshotfl.flower.batch`); only with a round-0
            update that carries no payload.
        clients: a cohort instruction's clients (:mod:`oneshotfl.flower.cohort`): ``None``
            for the node's one client, ``()`` for every client the node holds, else those.
        schedules: a cohort ``receive`` step's encounter schedule of each of its clients,
            in their order.
    """

    step: str
    method: str
    key: str
    round: int
    config: Mapping[str, Any]
    payloads: Mapping[str, bytes]
    schedule: tuple[tuple[int, ...], ...] = ()
    batch: tuple[tuple[str, str], ...] = ()
    clients: tuple[int, ...] | None = None
    schedules: tuple[tuple[tuple[int, ...], ...], ...] = ()


def instruction_content(instruction: Instruction) -> RecordDict:
    """The RecordDict of an instruction message."""
    content = RecordDict()
    content[INSTRUCTION] = ConfigRecord(
        {
            "protocol": PROTOCOL,
            "step": instruction.step,
            "method": instruction.method,
            "key": instruction.key,
            "round": instruction.round,
            "config": json.dumps(dict(instruction.config), sort_keys=True),
            "schedule": json.dumps([list(w) for w in instruction.schedule]),
            "batch": json.dumps([list(pair) for pair in instruction.batch]),
            "clients": "" if instruction.clients is None else json.dumps(instruction.clients),
            "schedules": json.dumps([[list(w) for w in s] for s in instruction.schedules]),
        }
    )
    if instruction.payloads:
        content[PAYLOADS] = bytes_record(instruction.payloads)
    return content


def read_instruction(content: RecordDict) -> Instruction:
    """Parse an instruction message's content.

    Raises:
        MessageError: for a message of another protocol or with missing fields.
    """
    record = config_record(content, INSTRUCTION)
    if record.get("protocol") != PROTOCOL:
        raise MessageError(
            f"expected oneshotfl protocol {PROTOCOL}, got {record.get('protocol')!r}: "
            "server and node run different oneshotfl versions"
        )
    types = {"step": str, "method": str, "key": str, "round": int, "config": str}
    fields = typed_fields(record, INSTRUCTION, types)
    if fields["step"] not in STEPS:
        raise MessageError(f"{INSTRUCTION}.step: expected one of {STEPS}, got {fields['step']!r}")
    config = json_value(fields["config"], f"{INSTRUCTION}.config")
    if not isinstance(config, dict):
        raise MessageError(f"{INSTRUCTION}.config: expected a JSON object, got {config!r}")
    payloads = record_bytes(content.array_records[PAYLOADS]) if PAYLOADS in content else {}
    schedule = _schedule(record.get("schedule", "[]"), config.get("clients"))
    batch = _batch(record.get("batch", "[]"))
    if batch and (fields["step"] != "update" or fields["round"] != 0 or payloads):
        raise MessageError(f"{INSTRUCTION}.batch: only a round-0 update without payloads has one")
    clients = _cohort(record.get("clients", ""), config.get("clients"))
    schedules = _schedules(record.get("schedules", "[]"), config.get("clients"))
    if schedules and (clients is None or len(schedules) != len(clients)):
        raise MessageError(f"{INSTRUCTION}.schedules: expected one schedule per cohort client")
    return Instruction(
        fields["step"], fields["method"], fields["key"], fields["round"], config, payloads,
        schedule, batch, clients, schedules,
    )  # fmt: skip


def _cohort(text: Any, clients: Any) -> tuple[int, ...] | None:
    """A cohort instruction's clients: ``""`` (none: the node's one client), else a JSON list
    of distinct client ids below ``clients`` (bounded before anything is built from it).

    Raises:
        MessageError: for anything else.
    """
    if text == "":
        return None
    n = clients if isinstance(clients, int) and not isinstance(clients, bool) else 0
    value = json_value(text, f"{INSTRUCTION}.clients") if isinstance(text, str) else None
    ids = distinct_ids(value, n)
    if ids is None:
        got = text[:80] if isinstance(text, str) else type(text).__name__
        raise MessageError(
            f"{INSTRUCTION}.clients: expected a list of distinct client ids below {n}, got {got!r}"
        )
    return ids


def distinct_ids(value: object, n: int) -> tuple[int, ...] | None:
    """``value`` as client ids when it is a list of at most ``n`` distinct integers in
    ``[0, n)``, else ``None`` (a cohort's clients, asked for or answered for)."""
    ok = isinstance(value, list) and len(value) <= n and all(
        isinstance(c, int) and not isinstance(c, bool) and 0 <= c < n for c in value
    ) and len(set(value)) == len(value)  # fmt: skip
    return tuple(int(c) for c in value) if ok and isinstance(value, list) else None


def _schedules(text: Any, clients: Any) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """A cohort receive step's schedules: a JSON list of at most ``clients`` schedules, each
    as :func:`_schedule` bounds it.

    Raises:
        MessageError: for anything else.
    """
    n = clients if isinstance(clients, int) and not isinstance(clients, bool) else 0
    value = json_value(text, f"{INSTRUCTION}.schedules") if isinstance(text, str) else None
    if not isinstance(value, list) or len(value) > n:
        got = text[:80] if isinstance(text, str) else type(text).__name__
        raise MessageError(f"{INSTRUCTION}.schedules: expected at most {n} schedules, got {got!r}")
    return tuple(_schedule(json.dumps(s), clients) for s in value)


MAX_BATCH = 256
"""The most methods one instruction may add to its own (:mod:`oneshotfl.flower.batch`)."""


def _batch(text: Any) -> tuple[tuple[str, str], ...]:
    """An instruction's batch: a JSON list of at most :data:`MAX_BATCH` [key, spec] pairs of
    strings of at most 1,000 characters (bounded before any method is built from it).

    Raises:
        MessageError: for anything else.
    """
    value = json_value(text, f"{INSTRUCTION}.batch") if isinstance(text, str) else None
    ok = isinstance(value, list) and len(value) <= MAX_BATCH and all(
        isinstance(p, list) and len(p) == 2
        and all(isinstance(s, str) and 0 < len(s) <= 1000 for s in p)
        for p in value
    )  # fmt: skip
    if not ok or not isinstance(value, list):
        got = text[:80] if isinstance(text, str) else type(text).__name__
        raise MessageError(
            f"{INSTRUCTION}.batch: expected at most {MAX_BATCH} [key, spec] pairs, got {got!r}"
        )
    return tuple((str(k), str(s)) for k, s in value)


MAX_WINDOWS = 10_000
"""The most collection windows a receive instruction's schedule may hold."""


def _schedule(text: Any, clients: Any) -> tuple[tuple[int, ...], ...]:
    """An instruction's encounter schedule: a JSON list of windows of client ids, each id
    below ``clients``, at most :data:`MAX_WINDOWS` windows of at most ``clients`` ids
    (bounded before anything is built from it).

    Raises:
        MessageError: for anything else.
    """
    where = f"{INSTRUCTION}.schedule"
    if not isinstance(text, str):
        raise MessageError(f"{where}: expected a JSON string, got {type(text).__name__}")
    value = json_value(text, where)
    n = clients if isinstance(clients, int) and not isinstance(clients, bool) else 0
    ok = isinstance(value, list) and len(value) <= MAX_WINDOWS and all(
        isinstance(w, list) and len(w) <= n
        and all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < n for c in w)
        for w in value
    )  # fmt: skip
    if not ok:
        raise MessageError(
            f"{where}: expected at most {MAX_WINDOWS} windows of client ids below {n}, got "
            f"{text[:80]!r}"
        )
    return tuple(tuple(w) for w in value)


def reply_content(reply: ClientReply) -> RecordDict:
    """The RecordDict of a node's reply: its wire bytes and the facts for the result file."""
    content = RecordDict()
    content[PAYLOADS] = bytes_record({sender(reply.client_id): reply.data})
    facts: dict[str, Any] = {
        "client_id": reply.client_id,
        "wall_s": reply.wall_s,
        "facts": json.dumps(reply.facts, sort_keys=True),
        "shard": "" if reply.shard is None else json.dumps(reply.shard.to_dict()),
    }
    content[REPLY] = ConfigRecord(facts)
    return content


def read_reply(content: RecordDict) -> ClientReply:
    """Parse a node's reply into the :class:`ClientReply` the runner collects.

    The payload bytes are returned as they came; the runner decodes and validates them.

    Raises:
        MessageError: for a reply without the expected records or fields.
    """
    record = config_record(content, REPLY)
    fields = typed_fields(record, REPLY, {"client_id": int, "wall_s": float, "facts": str})
    cid = fields["client_id"]
    if PAYLOADS not in content.array_records:
        raise MessageError(f"reply of client {cid}: expected a {PAYLOADS!r} ArrayRecord, got none")
    blobs = record_bytes(content.array_records[PAYLOADS])
    if set(blobs) != {sender(cid)}:
        raise MessageError(
            f"reply of client {cid}: expected exactly the payload {sender(cid)!r}, "
            f"got {sorted(blobs)}"
        )
    stats = json_value(fields["facts"], f"{REPLY}.facts")
    if not isinstance(stats, dict) or not all(is_number(v) for v in stats.values()):
        raise MessageError(f"{REPLY}.facts: expected a JSON object of numbers, got {stats!r}")
    return ClientReply(
        cid,
        blobs[sender(cid)],
        float(fields["wall_s"]),
        {str(k): float(v) for k, v in stats.items()},
        read_shard(record.get("shard", "")),
    )


def read_shard(text: object) -> ShardReport | None:
    """A reply's shard report (``""``: none), checked for form only; its bounds (classes,
    ``N_max``) are the engine's (:func:`~oneshotfl.runner.ledger.shard_problem`).

    Raises:
        MessageError: for a report that is not a JSON object of two sizes and a list of
            integer counts, or is longer than :data:`MAX_SHARD_JSON`.
    """
    if not isinstance(text, str) or len(text) > MAX_SHARD_JSON:
        got = type(text).__name__ if not isinstance(text, str) else f"{len(text)} characters"
        raise MessageError(
            f"{REPLY}.shard: expected a JSON string of at most {MAX_SHARD_JSON} characters, "
            f"got {got}"
        )
    if not text:
        return None
    doc = json_value(text, f"{REPLY}.shard")
    keys = ("train_size", "val_size", "label_histogram")
    counts = doc.get("label_histogram") if isinstance(doc, dict) else None
    if (
        not isinstance(doc, dict)
        or set(doc) != set(keys)
        or not isinstance(counts, list)
        or not all(is_integer(v) for v in (doc["train_size"], doc["val_size"], *counts))
    ):
        raise MessageError(
            f"{REPLY}.shard: expected {{train_size, val_size, label_histogram}} of integers, "
            f"got {text[:80]!r}"
        )
    return ShardReport(doc["train_size"], doc["val_size"], tuple(counts))


def report_content(report: PeerReport) -> RecordDict:
    """The RecordDict of a receiver's report: how its own model did; no model, no payload."""
    content = RecordDict()
    content[REPORT] = ConfigRecord(
        {
            "receiver": report.receiver,
            "accuracy": report.metrics.accuracy,
            "personal_accuracy": report.metrics.personal_accuracy,
            "rejected": json.dumps({str(k): v for k, v in report.rejected.items()}),
            "wall_s": report.wall_s,
            "diagnostics": json.dumps(report.diagnostics, sort_keys=True, default=str),
        }
    )
    return content


def read_report(content: RecordDict) -> PeerReport:
    """Parse a receiver's report.

    Raises:
        MessageError: for a report without the expected record or fields.
    """
    record = config_record(content, REPORT)
    types = {
        "receiver": int,
        "accuracy": float,
        "personal_accuracy": float,
        "rejected": str,
        "wall_s": float,
        "diagnostics": str,
    }
    fields = typed_fields(record, REPORT, types)
    rejected = json_value(fields["rejected"], f"{REPORT}.rejected")
    if not isinstance(rejected, dict) or not all(
        str(k).isdigit() and isinstance(v, str) for k, v in rejected.items()
    ):
        raise MessageError(f"{REPORT}.rejected: expected sender id → reason, got {rejected!r}")
    diagnostics = json_value(fields["diagnostics"], f"{REPORT}.diagnostics")
    if not isinstance(diagnostics, dict):
        raise MessageError(f"{REPORT}.diagnostics: expected a JSON object, got {diagnostics!r}")
    metrics = ClientMetrics(float(fields["accuracy"]), float(fields["personal_accuracy"]))
    return PeerReport(
        fields["receiver"],
        metrics,
        {int(k): v for k, v in rejected.items()},
        float(fields["wall_s"]),
        diagnostics,
    )
