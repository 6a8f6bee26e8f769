"""The round engine: one method over a federation, on (receiver, senders) edges.

Every method runs as rounds of: the clients' updates through the transport, then each
receiver's build from the payloads its senders delivered. The topology decides the edges:

* **star** — one receiver, the server (this process): every client sends to it; the engine
  decodes and validates each payload (rejections named, bytes still counted), checks the
  quorum, calls ``aggregate`` and evaluates the outcome. A multi-round reference method
  repeats broadcast → clients → aggregate and records accuracy and bytes per round.
* **peer** — every client is a receiver: client *s* sends its one message on the edges
  (s → r) of the neighbour graph that :meth:`~oneshotfl.protocol.contract.PeerMethod.schedule`
  keeps; the transport relays each receiver its senders' bytes unchanged, and the receiver
  validates, builds its own model and evaluates it on its own test distribution
  (:func:`~oneshotfl.runner.transport.peer_step`). Bytes are counted per edge.

The engine knows no transport: the in-process one and Flower's both satisfy
:class:`~oneshotfl.runner.transport.Transport`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from oneshotfl.payload import encode
from oneshotfl.protocol.contract import Method, PeerMethod, Topology
from oneshotfl.protocol.fold import uses_fold
from oneshotfl.protocol.outcome import Outcome
from oneshotfl.protocol.saved import save_outcome
from oneshotfl.runner.admission import (
    admit_replies,
    check_quorum,
    collect_round,
    screen_shards,
)
from oneshotfl.runner.errors import QuorumError, RequirementError
from oneshotfl.runner.evaluate import evaluate_outcome, inference_cost, summarise_clients
from oneshotfl.runner.federation import ServerView
from oneshotfl.runner.ledger import Ledger
from oneshotfl.runner.plan import draw_schedules
from oneshotfl.runner.results import MethodResult
from oneshotfl.runner.transport import Missing, Transport
from oneshotfl.training.progress import NullTracker

log = logging.getLogger(__name__)


def encode_broadcast(
    key: str, method: Method[Any], view: ServerView, round_index: int, previous: Outcome | None
) -> bytes | None:
    """The server's message before round ``round_index`` as wire bytes (``None``: none)."""
    message = method.server_message(round_index, previous, view.server_context(method.requires))
    if message is None:
        return None
    if method.broadcast_spec(view.dims, round_index) is None:
        raise TypeError(f"{key}: server_message returned a message but no broadcast_spec")
    return encode(message)


def run_method(
    key: str, method: Method[Any], view: ServerView, transport: Transport, ledger: Ledger
) -> MethodResult:
    """Run one method over the federation through ``transport`` (see the module docs): the
    server side sees only ``view`` (no client shard) and books every client's round-0 shard
    report in ``ledger``, which it owns for the run."""
    if method.requires.topology is Topology.PEER:
        if not isinstance(method, PeerMethod):
            raise TypeError(f"{key}: a peer-topology method must subclass PeerMethod")
        return _run_peer(key, method, view, transport, ledger)
    return _run_star(key, method, view, transport, ledger)


LOCAL = ("local_test_accuracy", "local_val_accuracy")


def _facts(facts: Mapping[int, Mapping[str, float]], clients: int) -> dict[str, Any]:
    """The clients' round-0 facts as result fields: the local model's accuracies as
    per-client lists, every other fact under ``client_facts`` (``None`` where a client has
    no value)."""
    names = sorted({name for f in facts.values() for name in f})
    lists = {name: [facts.get(c, {}).get(name) for c in range(clients)] for name in names}
    out: dict[str, Any] = {name: lists.pop(name) for name in LOCAL if name in lists}
    if lists:
        out["client_facts"] = lists
    return out


def _round_row(
    r: int, metrics: Mapping[str, Any], upload: np.ndarray, download: int
) -> dict[str, Any]:
    """The ``rounds_history`` entry after round ``r`` (from 0): accuracy and bytes so far."""
    return {
        "round": r + 1,
        "accuracy": metrics["accuracy"],
        "upload_bytes_mean": float(upload.mean()),
        "download_bytes": download,
    }


def _run_star(
    key: str, method: Method[Any], view: ServerView, transport: Transport, ledger: Ledger
) -> MethodResult:
    """A star method's rounds: broadcast, the clients' updates, the server's aggregate."""
    n, test = view.cfg.clients, view.test
    rounds = method.num_rounds()
    stacked = view.cfg.client_batch > 1  # members evaluated together
    upload = np.zeros(n, dtype=np.int64)
    client_wall = np.zeros(n)
    checked, evaluating = 0.0, 0.0  # seconds: the clients' diagnostics, the evaluation
    download, server_wall = 0, 0.0
    outcome: Outcome | None = None
    history: list[dict[str, Any]] = []
    rejected: dict[str, str] = {}
    missing: Missing = {}
    facts: dict[int, dict[str, float]] = {}
    reported: set[int] = set()
    artefacts: list[dict[str, float | None]] = [{} for _ in range(n)]
    made = np.zeros(n)
    shown = view.tracker if rounds > 1 else NullTracker()  # a bar for multi-round methods
    with shown.task(f"{key}: {rounds} rounds", rounds) as advance:
        for r in range(rounds):
            broadcast = encode_broadcast(key, method, view, r, outcome)
            server = view.server_context(method.requires).for_round(r, outcome)
            folds = uses_fold(method) and not view.cfg.hold_payloads
            fold = method.fold(server) if folds else None
            replies, silent = transport.upload(key, method, r, broadcast)
            size = 0 if broadcast is None else len(broadcast)
            traffic = collect_round(
                key, method, view, ledger, r, replies, size, silent, reported, fold
            )
            checked += traffic.diagnostics_s
            upload += np.asarray(traffic.upload_bytes, dtype=np.int64)
            client_wall += np.asarray(traffic.client_wall)
            for cid, (used, made_now) in traffic.work.items():
                artefacts[cid].update(used)
                made[cid] += made_now
            download += traffic.download_bytes
            for cid, why in traffic.rejected.items():  # the first round's reason stays
                rejected.setdefault(str(cid), why)
            missing.update(traffic.missing)
            facts = facts or traffic.facts
            start = time.perf_counter()
            # with a fold, every valid payload is in it already
            outcome = method.aggregate(traffic.received, server) if fold is None else fold.finish()
            server_wall += time.perf_counter() - start + traffic.fold_s
            clients_used = traffic.used
            traffic.received.clear()  # the payloads, aggregated now: released
            if r < rounds - 1 and method.evaluates_round(r):  # the last one: once, below
                start = time.perf_counter()
                histograms = ledger.label_histograms()  # as the clients reported in round 0
                metrics = evaluate_outcome(outcome, test, histograms, view.device, stacked)
                evaluating += time.perf_counter() - start
                history.append(_round_row(r, metrics, upload, download))
            advance(1)
    assert outcome is not None  # rounds >= 1
    start = time.perf_counter()
    histograms = ledger.label_histograms()
    metrics = evaluate_outcome(outcome, test, histograms, view.device, stacked)
    if rounds > 1:
        history.append(_round_row(rounds - 1, metrics, upload, download))
    saved = None
    if view.save_to is not None:
        saved = save_outcome(view.save_to, key, outcome, view.task.num_classes)
    evaluating += time.perf_counter() - start
    inference = inference_cost(outcome, test.x, view.device)
    info = getattr(outcome, "info", {})
    return MethodResult(
        key=key,
        **method.describe(),
        outcome=type(outcome).__name__,
        **metrics,
        rounds=rounds,
        upload_bytes_per_client=upload.tolist(),
        download_bytes_per_client=download,
        communicates=method.communicates,
        client_wall_s=client_wall.tolist(),
        server_wall_s=server_wall,
        client_artefacts=artefacts,
        client_made_s=made.tolist(),
        model_file=saved,
        clients_used=clients_used,
        diagnostics=info,
        notes=_notes(key, method, info),
        inference=inference or None,
        timings={"client_diagnostics_s": checked, "evaluation_s": evaluating},
        rejected=rejected,
        no_reply=missing,
        rounds_history=history,
        **_facts(facts, n),
    )


def _run_peer(
    key: str, method: PeerMethod[Any], view: ServerView, transport: Transport, ledger: Ledger
) -> MethodResult:
    """A peer method: every client's update, then each receiver's build from its senders.

    A client takes part as a receiver when its own update arrived; it receives the payloads
    of the senders :meth:`~oneshotfl.protocol.contract.PeerMethod.schedule` keeps among its
    graph neighbours, as far as they arrived. Every edge that carried a payload counts its
    bytes. The quorum counts the clients whose payload arrived and no receiver refused.
    """
    n, graph = view.cfg.clients, view.graph
    if graph is None:
        raise RequirementError(f"{key}: a peer method needs the plan's neighbour graph")
    replies, silent = transport.upload(key, method, 0, None)
    admitted, missing = admit_replies(key, replies, n, silent)
    screened = screen_shards(key, view, ledger, admitted, set(), 0)
    refused = {str(c): why for c, why in screened.items()}
    schedules = view.schedules.get(key)  # drawn once by the plan
    if schedules is None:  # a method run outside a plan
        schedules = draw_schedules(key, method, graph, view.cfg.data_seed)
    routes: dict[int, dict[int, bytes]] = {}
    for r in sorted(admitted):
        senders = sorted({s for window in schedules[r] for s in window})
        routes[r] = {s: admitted[s].data for s in senders if s in admitted}
    edges: list[list[int]] = []
    upload, received = [0] * n, [0] * n
    for r, route in routes.items():
        for s, data in route.items():
            size = len(data) if method.communicates else 0
            edges.append([s, r, size])
            upload[s] += size
            received[r] += size
    reports, unanswered = transport.relay(key, method, routes, schedules)
    missing.update(unanswered)
    reports = sorted(reports, key=lambda p: p.receiver)
    rejected = {f"{s}->{p.receiver}": why for p in reports for s, why in p.rejected.items()}
    check_quorum(
        key,
        method,
        view,
        len(set(admitted) - {s for p in reports for s in p.rejected}),
        {**refused, **rejected},
        missing,
    )
    if not reports:
        raise QuorumError(f"{key}: no receiver reported a model; no reply: {dict(missing)}")
    wall, receiver_wall, made = [0.0] * n, [0.0] * n, [0.0] * n
    artefacts: list[dict[str, float | None]] = [{} for _ in range(n)]
    for c, reply in admitted.items():
        wall[c], artefacts[c], made[c] = reply.wall_s, reply.artefacts, reply.made_s
    for p in reports:
        receiver_wall[p.receiver] = p.wall_s
    diagnostics = {str(p.receiver): p.diagnostics for p in reports if p.diagnostics}
    return MethodResult(
        key=key,
        **method.describe(),
        outcome="Personalised",
        **summarise_clients([p.metrics for p in reports]),
        rounds=1,
        upload_bytes_per_client=upload,
        download_bytes_per_client=0,
        communicates=method.communicates,
        client_wall_s=wall,
        server_wall_s=0.0,
        client_artefacts=artefacts,
        client_made_s=made,
        clients_used=[p.receiver for p in reports],
        diagnostics=diagnostics,
        notes=_notes(key, method, diagnostics),
        rejected={**refused, **rejected},
        no_reply=missing,
        topology={"graph": graph.spec, "edges": edges},
        received_bytes_per_client=received,
        receiver_wall_s=receiver_wall,
        # a receiver's evaluation of its own model is part of its receiver_wall_s
        timings={
            "client_diagnostics_s": sum(r.diagnostics_s for r in admitted.values()),
            "evaluation_s": 0.0,
        },
        **_facts({c: reply.facts for c, reply in admitted.items()}, n),
    )


def _notes(key: str, method: Method[Any], diagnostics: Mapping[str, Any]) -> list[str]:
    """The method's notes on its run (:meth:`Method.notes`), each logged in one line."""
    notes = list(method.notes(diagnostics))
    for note in notes:
        log.warning("%s: %s", key, note)
    return notes
