"""The two steps that run on a client, and the transports that carry them.

A client does at most two things for a method:

* :func:`client_step` — its update: ``client_update`` on its own context, timed by the
  runner, serialised to the exact bytes that cross the wire, plus the accuracies of the model
  it trained (facts for the result file, never an input to any receiver);
* :func:`peer_step` — for a peer (server-free) method, its receipt: it decodes and
  validates each neighbour's bytes (a bad payload is rejected and named, the others go on),
  builds its own model with ``aggregate_for`` and evaluates it on its own test distribution.

A :class:`Transport` runs these steps on the clients and brings back what they answer. The
engine (:mod:`oneshotfl.runner.engine`) never knows which transport it uses: the in-process
:class:`LocalTransport` calls the steps directly; Flower's (:mod:`oneshotfl.flower.server`)
sends one message per node through the Grid, and the node calls the same functions.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch
from torch import nn

from oneshotfl.data.types import LabelledData
from oneshotfl.fingerprints import tensor_fingerprint
from oneshotfl.payload import Payload, WireError, encode
from oneshotfl.protocol.contract import ClientContext, Method, PeerMethod
from oneshotfl.protocol.spec import PayloadError, WireDims
from oneshotfl.protocol.wire import receive
from oneshotfl.runner.evaluate import ClientMetrics, label_histogram, receiver_metrics
from oneshotfl.runner.ledger import ShardReport
from oneshotfl.security.threats import Attack
from oneshotfl.seeding import numpy_rng
from oneshotfl.training.loop import accuracy, many_logits

if TYPE_CHECKING:
    from oneshotfl.runner.federation import Federation
    from oneshotfl.runner.plan import Schedules

log = logging.getLogger(__name__)


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run with ``threads`` torch threads (``None``: leave them), restoring the caller's
    afterwards. Float results depend on the thread count, so every transport — in process,
    the worker pool, a Flower node — runs client steps at the config's ``client_threads``, and
    the run the server side at ``server_threads``: a result is the same whatever runs it."""
    before = torch.get_num_threads()
    if threads is not None and threads != before:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@dataclass(frozen=True)
class ClientReply:
    """One client's answer to one round, as it leaves the client.

    Attributes:
        client_id: the sending client.
        data: the payload bytes exactly as they cross the wire (``encode(payload)``).
        wall_s: seconds the client spent in ``client_update`` (timed by the runner).
        facts: result-file facts of round 0, never an input to any receiver: the
            ``local_test_accuracy`` / ``local_val_accuracy`` of the model the method's client
            trained (absent when it trains none) and the method's own ``client_facts``.
        shard: round 0: the client's report on its own data (:class:`ShardReport`).
        artefacts: the artefacts its update used (``kind:key`` → the seconds each took to
            make, cached or made now), for the time columns: a model two methods share is
            charged to neither (:func:`oneshotfl.runner.results.attribute_client_time`).
        made_s: seconds of ``wall_s`` spent making artefacts now (not cached before).
        diagnostics_s: seconds spent checking the local model (round 0's accuracies, which
            no method asks for; not part of ``wall_s``).
    """

    client_id: int
    data: bytes
    wall_s: float
    facts: dict[str, float] = field(default_factory=dict)
    shard: ShardReport | None = None
    artefacts: dict[str, float | None] = field(default_factory=dict)
    made_s: float = 0.0
    diagnostics_s: float = 0.0


@dataclass(frozen=True)
class PeerReport:
    """One receiver's answer in a peer method: how its own model did, and what it refused.

    Attributes:
        receiver: the receiving client.
        metrics: its model on the test split, globally and on its own distribution.
        rejected: sender id → why its payload was refused.
        wall_s: seconds spent in ``aggregate_for``.
        diagnostics: what the method reported about this receiver's model.
    """

    receiver: int
    metrics: ClientMetrics
    rejected: dict[int, str]
    wall_s: float
    diagnostics: dict[str, Any] = field(default_factory=dict)


def local_stats_key(model: nn.Module, ctx: ClientContext, test: LabelledData) -> dict[str, Any]:
    """The memo key of a client's local-model diagnostics (within one run: one test split)."""
    return {
        "model": tensor_fingerprint(*model.state_dict().values()),
        "test": [len(test), test.fingerprint()],  # each hashed once, not once per client
        "val": None if ctx.val is None else ctx.val.fingerprint(),
    }


def _stats(
    model: nn.Module, ctx: ClientContext, test: LabelledData, logits: torch.Tensor | None = None
) -> Payload:
    """Test accuracy (of ``logits`` when given, the model's on ``test``) and validation
    accuracy of a client's local model."""
    if logits is None:  # as an outcome is evaluated (its memo shared with the local rows)
        logits = many_logits([model], test.x, ctx.device)[0]
    stats = {"local_test_accuracy": accuracy(logits, test.y)}
    if ctx.val is not None:
        stats["local_val_accuracy"] = accuracy(
            many_logits([model], ctx.val.x, ctx.device)[0], ctx.val.y
        )
    return Payload({}, stats)


def local_stats(
    model: nn.Module | None, ctx: ClientContext, test: LabelledData | None
) -> dict[str, float]:
    """Test and validation accuracy of a client's local model (empty without one); memoised
    per model content, so methods that share a model evaluate it once. ``test`` is the
    federation's diagnostic sample of the test split (``diagnostic_examples``)."""
    if model is None or test is None:
        return {}
    payload, _ = ctx.store.memo(
        "local_accuracy", local_stats_key(model, ctx, test), lambda: _stats(model, ctx, test)
    )
    return {k: float(v) for k, v in payload.scalars.items()}


def offer_stats(
    model: nn.Module, ctx: ClientContext, test: LabelledData, logits: torch.Tensor
) -> None:
    """Put the diagnostics of ``model`` — its ``logits`` on ``test`` computed elsewhere (with
    other clients' models at once) — into ``ctx``'s memo, where :func:`local_stats` finds them."""
    stats = _stats(model, ctx, test, logits)
    ctx.store.memo("local_accuracy", local_stats_key(model, ctx, test), lambda: stats)


def client_step(
    method: Method[Any],
    ctx: ClientContext,
    test: LabelledData | None,
    shard: ShardReport | None = None,
    attack: Attack | None = None,
) -> ClientReply:
    """The client side of one round: ``client_update`` (timed), serialisation, and in round 0
    the local model's accuracies and the client's ``shard`` report. A simulated malicious
    client (``attack``; its data already poisoned in ``ctx``) tampers with its message before
    it leaves. The same function runs in the simulation and in a Flower ClientApp."""
    start, mark = time.perf_counter(), len(ctx.store.counts.used)
    payload = method.client_update(ctx)
    if attack is not None:  # a simulated malicious client tampers with its own message
        rng = numpy_rng(ctx.seed, "attack", ctx.client_id, ctx.round)
        spec = method.round_payload_spec(ctx.dims, ctx.round)
        payload = attack.tamper(payload, spec, ctx.dims, rng)
    wall = time.perf_counter() - start
    used = ctx.store.counts.used[mark:]
    artefacts = {u.label: (u.seconds if math.isfinite(u.seconds) else None) for u in used}
    made = sum(u.seconds for u in used if u.made_now and math.isfinite(u.seconds))
    data = encode(payload)  # what crosses the network; counted even if rejected
    if ctx.round > 0:
        return ClientReply(ctx.client_id, data, wall, artefacts=artefacts, made_s=made)
    start = time.perf_counter()
    facts = {**local_stats(method.local_model(ctx), ctx, test), **method.client_facts(ctx)}
    checked = time.perf_counter() - start
    return ClientReply(ctx.client_id, data, wall, facts, shard, artefacts, made, checked)


def peer_step(
    method: PeerMethod[Any],
    ctx: ClientContext,
    deliveries: Mapping[int, bytes],
    test: LabelledData,
) -> PeerReport:
    """A receiver's side of a peer method: validate every neighbour's bytes (refusing the
    bad ones by sender), build this client's own model, evaluate it for this client."""
    spec = method.payload_spec(ctx.dims)
    payloads: dict[int, Payload] = {}
    rejected: dict[int, str] = {}
    for sender in sorted(deliveries):
        try:
            payloads[sender] = receive(deliveries[sender], spec, ctx.dims, sender)
        except (WireError, PayloadError) as exc:
            log.warning(
                "client %d: rejected the payload of client %d: %s", ctx.client_id, sender, exc
            )
            rejected[sender] = str(exc)
    start = time.perf_counter()
    outcome = method.aggregate_for(ctx, payloads)
    wall = time.perf_counter() - start
    histogram = label_histogram(ctx.data.y, ctx.task.num_classes)
    metrics = receiver_metrics(outcome, test, histogram, ctx.device)
    return PeerReport(ctx.client_id, metrics, rejected, wall, dict(getattr(outcome, "info", {})))


def receive_broadcast(
    method: Method[Any], data: bytes | None, dims: WireDims, round_index: int
) -> Payload | None:
    """Decode and validate the server's broadcast before round ``round_index`` on the
    receiving side (``None`` passes)."""
    if data is None:
        return None
    spec = method.broadcast_spec(dims, round_index)
    if spec is None:
        raise WireError(f"{method.name}: received a broadcast, but the method defines none")
    return receive(data, spec, dims, None)


Missing = dict[str, str]
"""A party that did not answer (``"client 3"``, ``"node 42 (client 3)"``) → why."""


class Transport(Protocol):
    """Runs client steps somewhere and returns their answers (see the module docs)."""

    def upload(
        self, key: str, method: Method[Any], round_index: int, broadcast: bytes | None
    ) -> tuple[Iterable[ClientReply], Missing]:
        """Every client's :func:`client_step` for one round, after ``broadcast``: a list of
        replies, or an iterator that runs each client as the server reads it, in ascending
        client id (the clients it names as silent are in the mapping once it is exhausted)."""
        ...

    def relay(
        self,
        key: str,
        method: PeerMethod[Any],
        routes: Mapping[int, Mapping[int, bytes]],
        schedules: Schedules,
    ) -> tuple[list[PeerReport], Missing]:
        """Forward each receiver its senders' bytes (receiver → sender → bytes) unchanged,
        with its encounter schedule (receiver → windows), and return every receiver's
        :func:`peer_step` report."""
        ...


Answer = TypeVar("Answer")


def attempt(cid: int, what: str, step: Callable[[], Answer], missing: Missing) -> Answer | None:
    """Run one client's step; a client that fails is named in ``missing`` (with the error, and
    the traceback in the log) and the others go on — as a failing Flower node is."""
    try:
        return step()
    except Exception as exc:
        log.warning("client %d failed in its %s", cid, what, exc_info=True)
        missing[f"client {cid}"] = f"failed in its {what}: {type(exc).__name__}: {exc}"
        return None


def update_on(
    fed: Federation,
    method: Method[Any],
    client_id: int,
    round_index: int,
    broadcast: Payload | None,
) -> ClientReply:
    """Client ``client_id``'s :func:`client_step` on federation ``fed`` — what every
    transport (in process, a worker, a Flower node) runs for one client: its context built
    from the value for the round and the validated ``broadcast``, round 0's shard report, its
    simulated attack, at the config's ``client_threads``."""
    ctx = fed.client_context(client_id).for_round(round_index, broadcast)
    report = fed.shard_report(client_id) if round_index == 0 else None  # round 0 only
    attack = fed.attack_of(client_id)
    with torch_threads(fed.cfg.client_threads):
        return client_step(method, ctx, fed.diagnostics, report, attack)


def receipt_on(
    fed: Federation,
    method: PeerMethod[Any],
    receiver: int,
    deliveries: Mapping[int, bytes],
    schedule: tuple[tuple[int, ...], ...],
) -> PeerReport:
    """Receiver ``receiver``'s :func:`peer_step` on federation ``fed`` — what every
    transport runs for one receiver: its receiver context (with its encounter ``schedule``)
    at the config's ``client_threads``."""
    ctx = fed.receiver_context(receiver, schedule)
    with torch_threads(fed.cfg.client_threads):
        return peer_step(method, ctx, deliveries, fed.data.test)


@dataclass(frozen=True)
class LocalTransport:
    """The in-process transport: every client of the federation, in client-id order, each
    run when the server reads its reply (so, with a fold, one payload exists at a time). A
    client whose step raises is named and left out, exactly as a Flower node that fails."""

    federation: Federation

    def upload(
        self, key: str, method: Method[Any], round_index: int, broadcast: bytes | None
    ) -> tuple[Iterator[ClientReply], Missing]:
        fed = self.federation
        received = receive_broadcast(method, broadcast, fed.dims, round_index)
        missing: Missing = {}
        return self._replies(method, round_index, received, missing), missing

    def _replies(
        self, method: Method[Any], round_index: int, received: Payload | None, missing: Missing
    ) -> Iterator[ClientReply]:
        fed = self.federation
        for shard in sorted(fed.data.clients, key=lambda s: s.client_id):
            cid = shard.client_id
            step = functools.partial(update_on, fed, method, cid, round_index, received)
            reply = attempt(cid, "update", step, missing)
            if reply is not None:
                yield reply

    def relay(
        self,
        key: str,
        method: PeerMethod[Any],
        routes: Mapping[int, Mapping[int, bytes]],
        schedules: Schedules,
    ) -> tuple[list[PeerReport], Missing]:
        fed = self.federation
        reports: list[PeerReport] = []
        missing: Missing = {}
        for r in sorted(routes):
            step = functools.partial(receipt_on, fed, method, r, routes[r], tuple(schedules[r]))
            report = attempt(r, "receipt", step, missing)
            if report is not None:
                reports.append(report)
        return reports, missing
