"""Who a star round's server hears from, and what it takes from them: the replies it admits
by client id (a second reply, or one from outside the federation, dropped and named; a silent
client named), the clients whose shard report it can book (bounded in round 0; later rounds
only for clients it booked then), and :func:`collect_round` — each admitted reply decoded,
validated and kept or folded (:mod:`oneshotfl.protocol.fold`) as it comes, then the quorum."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from oneshotfl.payload import Payload, WireError
from oneshotfl.protocol.contract import Method
from oneshotfl.protocol.fold import Fold
from oneshotfl.protocol.spec import PayloadError
from oneshotfl.protocol.wire import receive
from oneshotfl.runner.errors import QuorumError
from oneshotfl.runner.federation import ServerView
from oneshotfl.runner.ledger import Ledger, shard_problem
from oneshotfl.runner.transport import ClientReply, Missing

log = logging.getLogger(__name__)


def admitted_in_order(
    key: str, replies: Iterable[ClientReply], clients: int, dropped: Missing
) -> Iterator[ClientReply]:
    """The replies the server admits, in ascending client id, one at a time: a second reply
    from one id, or one from an id outside the federation, is dropped and named in
    ``dropped``. A list (every reply at hand) is sorted first and emptied as it is read, so
    each reply is released once the caller is done with it, and any other sequence is read
    sorted; an iterator (a transport that runs its clients as the server reads:
    :class:`~oneshotfl.runner.transport.LocalTransport`) must yield ascending ids.

    Raises:
        RuntimeError: an iterator yielded a lower id after a higher one.
    """
    if isinstance(replies, list):
        replies.sort(key=lambda r: r.client_id)  # stable: of one id's replies the first stays first
        replies.reverse()  # read from the end
        source: Iterator[ClientReply] = _popped(replies)
    elif isinstance(replies, Sequence):
        source = iter(sorted(replies, key=lambda r: r.client_id))
    else:
        source = iter(replies)
    seen: set[int] = set()
    last = -1
    for reply in source:
        cid = reply.client_id
        if not 0 <= cid < clients or cid in seen:
            why = "outside the federation" if not 0 <= cid < clients else "a second reply"
            log.warning("%s: dropped %s from client %d", key, why, cid)
            dropped.setdefault(f"client {cid}", f"{why} (client ids are 0..{clients - 1})")
            continue
        if cid < last:
            raise RuntimeError(f"{key}: replies came out of order (client {cid} after {last})")
        seen.add(cid)
        last = cid
        yield reply


def _popped(replies: list[ClientReply]) -> Iterator[ClientReply]:
    """A list in descending id (of one id's replies, the first last), read from its end: each
    reply leaves it when read."""
    while replies:
        yield replies.pop()


def name_missing(
    key: str, clients: int, answered: set[int], missing: Mapping[str, str], dropped: Missing
) -> Missing:
    """Who did not answer, and why: the transport's ``missing``, the replies dropped (unless
    the transport named them), and every other client without an admitted reply."""
    named = dict(missing)
    for who, why in dropped.items():
        named.setdefault(who, why)
    for cid in sorted(set(range(clients)) - answered):
        log.warning("%s: no reply from client %d", key, cid)
        if f"client {cid}" not in named and not any(f"(client {cid})" in n for n in named):
            named[f"client {cid}"] = "no reply"
    return named


def admit_replies(
    key: str, replies: Iterable[ClientReply], clients: int, missing: Mapping[str, str]
) -> tuple[dict[int, ClientReply], Missing]:
    """Replies by client id (:func:`admitted_in_order`, all at once); who did not answer
    (:func:`name_missing`)."""
    dropped: Missing = {}
    admitted = {r.client_id: r for r in admitted_in_order(key, list(replies), clients, dropped)}
    return admitted, name_missing(key, clients, set(admitted), missing, dropped)


def screen_shard(
    view: ServerView,
    ledger: Ledger,
    reply: ClientReply,
    reported: set[int],
    round_index: int,
) -> str | None:
    """Why the server cannot book this reply's client (``None``: it can; see
    :func:`screen_shards`), entering a valid round-0 report in the ledger."""
    cid = reply.client_id
    if round_index > 0:
        problem = None if cid in reported else "gave no valid shard report in round 0"
    else:
        problem = shard_problem(reply.shard, view.task.num_classes, view.train_pool)
    if problem is None:
        if round_index == 0 and reply.shard is not None:
            ledger.admit(cid, reply.shard)
            reported.add(cid)
        return None
    return f"client {cid}: {problem}"


def screen_shards(
    key: str,
    view: ServerView,
    ledger: Ledger,
    admitted: dict[int, ClientReply],
    reported: set[int],
    round_index: int,
) -> dict[int, str]:
    """Refuse the replies of clients the server cannot book, removing them from
    ``admitted``; returns client id → why.

    In round 0 each client's shard report (its sizes and label counts) is bounded by the
    classes and ``N_max`` (:func:`~oneshotfl.runner.ledger.shard_problem`); the first valid
    report of a client enters the run's ledger and the client joins ``reported`` (one
    set per method run). In later rounds a client outside ``reported`` — refused or silent in
    round 0 — is refused again.
    """
    refused: dict[int, str] = {}
    for cid in sorted(admitted):
        problem = screen_shard(view, ledger, admitted[cid], reported, round_index)
        if problem is None:
            continue
        refused[cid] = problem
        log.warning("%s: round %d: refused %s", key, round_index, problem)
        del admitted[cid]
    return refused


@dataclass
class RoundTraffic:
    """What one round of a star method put on the wire, and what arrived.

    Lists are indexed by client id; a client that never replied counts 0 bytes and 0 s.
    ``received`` holds the valid payloads when the method has no fold; with one, each was
    folded as it arrived and ``used`` alone names them.
    """

    received: dict[int, Payload]
    rejected: dict[int, str]
    upload_bytes: list[int]
    download_bytes: int
    client_wall: list[float]
    facts: dict[int, dict[str, float]] = field(default_factory=dict)
    missing: Missing = field(default_factory=dict)
    work: dict[int, tuple[dict[str, float | None], float]] = field(default_factory=dict)
    """Per client: the artefacts its update used and the seconds spent making them now."""
    used: list[int] = field(default_factory=list)
    """The clients whose payload was valid (held in ``received``, or folded)."""
    diagnostics_s: float = 0.0
    """Seconds the clients spent checking their local models (no method asks for them)."""
    fold_s: float = 0.0
    """Seconds the server spent folding payloads (part of its aggregation time)."""


def collect_round(
    key: str,
    method: Method[Any],
    view: ServerView,
    ledger: Ledger,
    round_index: int,
    replies: Iterable[ClientReply],
    download: int = 0,
    missing: Mapping[str, str] | None = None,
    reported: set[int] | None = None,
    fold: Fold | None = None,
) -> RoundTraffic:
    """The server side of one star round: count, screen, decode and validate each reply in
    client-id order as it comes (:func:`admitted_in_order`), record rejections, and check the
    quorum. ``reported``: the clients of this method whose round-0 shard report was admitted
    (see :func:`screen_shard`). With a ``fold`` each valid payload is folded at once and
    dropped (a payload the fold refuses rejects its client; what was folded before stays);
    without one they are kept in ``received`` for ``aggregate``. A reply's wire bytes are
    released once it is decoded, and a list of ``replies`` is emptied as it is read: with a
    transport that yields its clients and a fold, one payload is held at a time. ``missing``:
    who the transport named as silent — read after every reply is in, as a streaming
    transport fills it as it goes.

    Raises:
        QuorumError: fewer valid payloads than ``max(min_clients, requires.min_clients)``.
    """
    n, dims = view.cfg.clients, view.dims
    spec = method.round_payload_spec(dims, round_index)
    traffic = RoundTraffic({}, {}, [0] * n, download, [0.0] * n)
    reported = set() if reported is None else reported
    dropped: Missing = {}
    answered: set[int] = set()
    for reply in admitted_in_order(key, replies, n, dropped):
        cid = reply.client_id
        answered.add(cid)
        traffic.client_wall[cid] = reply.wall_s  # what crossed the wire counts, refused or not
        traffic.work[cid] = (reply.artefacts, reply.made_s)
        traffic.upload_bytes[cid] = len(reply.data) if method.communicates else 0
        traffic.diagnostics_s += reply.diagnostics_s
        problem = screen_shard(view, ledger, reply, reported, round_index)
        if problem is not None:
            log.warning("%s: round %d: refused %s", key, round_index, problem)
            traffic.rejected[cid] = problem
            continue
        if reply.facts:
            traffic.facts[cid] = reply.facts
        try:
            payload = receive(reply.data, spec, dims, cid)
            del reply  # its wire bytes: released
            if fold is None:
                traffic.received[cid] = payload
            else:
                start = time.perf_counter()
                try:
                    fold.add(cid, payload)
                finally:
                    traffic.fold_s += time.perf_counter() - start
        except (WireError, PayloadError) as exc:
            log.warning(
                "%s: round %d: rejected the payload of client %d: %s", key, round_index, cid, exc
            )
            traffic.rejected[cid] = str(exc)
            continue
        traffic.used.append(cid)
    traffic.missing = name_missing(key, n, answered, missing or {}, dropped)
    check_quorum(key, method, view, len(traffic.used), traffic.rejected, traffic.missing)
    return traffic


def check_quorum(
    key: str,
    method: Method[Any],
    view: ServerView,
    valid: int,
    rejected: Mapping[Any, str],
    missing: Mapping[str, str],
) -> None:
    """Raise :class:`QuorumError` when fewer than the quorum arrived, naming who failed."""
    quorum = max(view.cfg.min_clients, method.requires.min_clients)
    if valid >= quorum:
        return
    silent = f"; no reply: {dict(missing)}" if missing else ""
    raise QuorumError(
        f"{key}: {valid} valid answer(s) arrived, expected at least {quorum} (min_clients); "
        f"rejected: {dict(rejected)}{silent}"
    )
