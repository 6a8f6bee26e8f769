"""What the ServerApp needs of Flower's Grid, apart from the experiment: push and pull with a
short poll, wait for the nodes, and read what the nodes' answers say (one-line errors, where
each reply was computed). Used by :mod:`oneshotfl.flower.server`."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Protocol

from flwr.app import Message

from oneshotfl.runner.errors import clip

log = logging.getLogger(__name__)

REPLY_POLL_S = 0.2
"""Seconds between two pulls of a round's replies (Flower's ``Grid.send_and_receive`` waits
3 s between pulls, so a round would end up to 3 s after its last reply)."""


class GridLike(Protocol):
    """The part of :class:`flwr.serverapp.Grid` the server uses (a test double fits)."""

    def get_node_ids(self) -> Iterable[int]: ...

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]: ...

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]: ...


def send_and_receive(
    grid: GridLike, messages: Iterable[Message], timeout: float, poll: float = REPLY_POLL_S
) -> list[Message]:
    """Push ``messages`` and pull their replies every ``poll`` seconds until each has one
    or ``timeout`` seconds have passed; the replies that came."""
    waiting = set(grid.push_messages(messages))
    deadline = time.monotonic() + timeout
    replies: list[Message] = []
    while waiting:
        pulled = list(grid.pull_messages(waiting))
        replies += pulled
        waiting -= {m.metadata.reply_to_message_id for m in pulled}
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    return replies


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
