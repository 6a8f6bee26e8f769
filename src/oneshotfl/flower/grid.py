"""What the ServerApp needs of Flower's Grid, apart from the experiment: push and pull with a
short poll, wait for the nodes, and read what the nodes' answers say (one-line errors, where
each reply was computed). Used by :mod:`oneshotfl.flower.server`."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable, Mapping
from typing import Protocol

from flwr.app import ConfigRecord, Message, RecordDict

from oneshotfl.runner.errors import clip

log = logging.getLogger(__name__)

REPLY_POLL_S = 0.2
"""Seconds between two pulls of a round's replies after one that brought a reply (Flower's
``Grid.send_and_receive`` waits 3 s between pulls, so a round would end up to 3 s after its
last reply)."""

REPLY_POLL_MAX_S = 1.0
"""The longest wait between two pulls: while pulls bring nothing, the wait doubles from
:data:`REPLY_POLL_S` up to this, so a ServerApp waiting on slow nodes costs the SuperLink a
pull a second, not five (seen: seven runs at once on one SuperLink, polling every 0.2 s, took
a sixth of a core of the SuperLink's and their own)."""


class GridLike(Protocol):
    """The part of :class:`flwr.serverapp.Grid` the server uses (a test double fits)."""

    def get_node_ids(self) -> Iterable[int]: ...

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]: ...

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]: ...


def send_and_receive(
    grid: GridLike,
    messages: Iterable[Message],
    timeout: float,
    poll: float = REPLY_POLL_S,
    in_flight: int = 0,
    max_poll: float = REPLY_POLL_MAX_S,
) -> list[Message]:
    """Push ``messages`` and pull their replies; the replies that came.

    The wait between pulls starts at ``poll`` seconds and doubles, up to ``max_poll``, while
    pulls bring nothing; a reply brings it back to ``poll``. Each message waits ``timeout``
    seconds from its push. ``in_flight`` bounds how many are outstanding at once (0: all
    pushed at once); the next is pushed as soon as one is answered or has timed out, so a
    round lasts at most ``ceil(n / in_flight)`` timeouts.
    """
    queue = list(messages)
    limit = in_flight if in_flight > 0 else max(len(queue), 1)
    deadlines: dict[str, float] = {}
    replies: list[Message] = []
    idle = 0  # pulls in a row that brought nothing
    while queue or deadlines:
        free = limit - len(deadlines)
        if queue and free > 0:
            batch, queue = queue[:free], queue[free:]
            pushed_at = time.monotonic()
            deadlines.update((mid, pushed_at + timeout) for mid in grid.push_messages(batch))
        pulled = list(grid.pull_messages(list(deadlines)))
        replies += pulled
        for answer in pulled:
            deadlines.pop(answer.metadata.reply_to_message_id, None)
        now = time.monotonic()
        for mid in [m for m, due in deadlines.items() if due <= now]:
            del deadlines[mid]  # given up on: its node is named among the silent ones
        if not queue and not deadlines:
            break
        idle = 0 if pulled else min(idle + 1, 16)
        if not pulled or not queue:
            time.sleep(min(poll * 2 ** max(idle - 1, 0), max(max_poll, poll)))
    return replies


def wait_for_nodes(
    grid: GridLike,
    wanted: int,
    timeout: float,
    poll: float = 0.5,
    required: Collection[int] = (),
) -> list[int]:
    """The connected node ids, once ``wanted`` are connected and every node in ``required``
    (a deployment's bound nodes) is among them, or ``timeout`` has passed."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        missing = set(required) - set(nodes)
        if (len(nodes) >= wanted and not missing) or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    if len(nodes) < wanted:
        log.warning("%d of %d nodes connected after %.0f s", len(nodes), wanted, timeout)
    if missing:
        log.warning("bound node(s) %s not connected after %.0f s", sorted(missing), timeout)
    return nodes


def error_line(reason: str | None, limit: int = 400) -> str:
    """A node's error as one line: the message of the exception its ClientApp raised (Flower
    wraps it in the worker's traceback, ``... Message: <the message>'>``), else the reason's
    last line; at most ``limit`` characters."""
    reason = reason or "(no reason given)"
    text = reason.rsplit("Message: ", 1)[-1] if "Message: " in reason else reason
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = (lines[0] if "Message: " in reason else lines[-1]) if lines else reason.strip()
    line = line.removesuffix("'>").strip()
    return clip(line, limit)


def placement(where: Mapping[int, str]) -> dict[str, list[int]]:
    """Where each client's replies were computed: place (``host`` or ``host/ray node``) →
    its client ids, in order."""
    out: dict[str, list[int]] = {}
    for cid in sorted(where):
        out.setdefault(where[cid], []).append(cid)
    return out


WHERE = "oneshotfl.where"
"""The optional record of a reply that says where it was computed (host, and the Ray node
when Flower's simulation engine played the client): the result's placement of clients."""


def where_record(host: str, worker: str = "") -> ConfigRecord:
    """Where a node computed its reply: its host name and, under Flower's simulation engine,
    the Ray node id of the worker that played it ("" otherwise)."""
    return ConfigRecord({"host": host, "worker": worker})


def read_where(content: RecordDict) -> str | None:
    """``host`` or ``host/worker`` from a reply's :data:`WHERE` record (at most 200
    characters); ``None`` when the record is absent or malformed (it is informative only)."""
    record = content.config_records.get(WHERE)
    if record is None:
        return None
    host, worker = record.get("host"), record.get("worker", "")
    if not isinstance(host, str) or not isinstance(worker, str):
        return None
    return (f"{host}/{worker}" if worker else host)[:200]
