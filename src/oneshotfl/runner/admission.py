"""Who a star round's server hears from: the replies it admits by client id (a second
reply, or one from outside the federation, dropped and named; a silent client named) and the
clients whose shard report it can book (bounded in round 0; later rounds only for clients it
booked then)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping

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
    each reply is released once the caller is done with it; any other iterable (a transport
    that runs its clients as the server reads: :class:`~oneshotfl.runner.transport.
    LocalTransport`) must yield ascending ids.

    Raises:
        RuntimeError: an iterable that is not a list yielded a lower id after a higher one.
    """
    if isinstance(replies, list):
        replies.sort(key=lambda r: r.client_id, reverse=True)  # stable: a first reply stays first
        source: Iterator[ClientReply] = _popped(replies)
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
    """A list sorted in descending id, read from its end (each reply leaves it when read)."""
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
