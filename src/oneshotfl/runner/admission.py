"""Who a star round's server hears from: the replies it admits by client id (a second
reply, or one from outside the federation, dropped and named; a silent client named) and the
clients whose shard report it can book (bounded in round 0; later rounds only for clients it
booked then)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from oneshotfl.runner.federation import ServerView
from oneshotfl.runner.ledger import Ledger, shard_problem
from oneshotfl.runner.transport import ClientReply, Missing

log = logging.getLogger(__name__)


def admit_replies(
    key: str, replies: Sequence[ClientReply], clients: int, missing: Mapping[str, str]
) -> tuple[dict[int, ClientReply], Missing]:
    """Replies by client id: a second reply from one id, or one from an id outside the
    federation, is dropped and named; a client that sent nothing is named."""
    admitted: dict[int, ClientReply] = {}
    named = dict(missing)
    for reply in sorted(replies, key=lambda r: r.client_id):
        cid = reply.client_id
        if not 0 <= cid < clients or cid in admitted:
            why = "outside the federation" if not 0 <= cid < clients else "a second reply"
            log.warning("%s: dropped %s from client %d", key, why, cid)
            named.setdefault(f"client {cid}", f"{why} (client ids are 0..{clients - 1})")
            continue
        admitted[cid] = reply
    for cid in sorted(set(range(clients)) - set(admitted)):
        log.warning("%s: no reply from client %d", key, cid)
        if f"client {cid}" not in named and not any(f"(client {cid})" in n for n in named):
            named[f"client {cid}"] = "no reply"
    return admitted, named


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
        reply = admitted[cid]
        if round_index > 0:
            problem = None if cid in reported else "gave no valid shard report in round 0"
        else:
            problem = shard_problem(reply.shard, view.task.num_classes, view.train_pool)
        if problem is None:
            if round_index == 0 and reply.shard is not None:
                ledger.admit(cid, reply.shard)
                reported.add(cid)
            continue
        refused[cid] = f"client {cid}: {problem}"
        log.warning("%s: round %d: refused %s", key, round_index, refused[cid])
        del admitted[cid]
    return refused
