"""The local simulation runner: one process plays every client and the server.

It owns everything a method does not: checking ``requires`` before any training, the seed
streams, the loop over clients, the wire (every payload is serialised, counted, decoded and
validated exactly as over a network), calling ``aggregate``, evaluation, the artefact cache
and the result document. Methods run in the order given and share trained client artefacts.

The pieces are shared with the Flower adapter (:mod:`oneshotfl.flower`), which is a second
runner over the same functions: :func:`client_step` is the client side of a round (context →
``client_update`` → wire bytes), :func:`collect_round` the server side (count, validate,
quorum), :func:`run_method` runs a method over any transport (an :data:`Exchange`), and
:func:`result_document` writes the same document either way.
"""

from __future__ import annotations

import dataclasses
import logging
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

import oneshotfl
from oneshotfl.data.datasets import load_dataset
from oneshotfl.data.types import Dataset, LabelledData
from oneshotfl.devices import resolve_device
from oneshotfl.encoders import Encoder, EncoderError, build_encoder
from oneshotfl.federation.artefacts import ArtefactStore
from oneshotfl.federation.contract import ClientContext, Method, ServerContext, Topology
from oneshotfl.federation.outcome import Outcome
from oneshotfl.federation.payload import Payload, WireError, encode
from oneshotfl.federation.spec import PayloadError, WireDims
from oneshotfl.federation.wire import receive
from oneshotfl.methods import METHODS, MethodSpec, build_method, parse_method_spec
from oneshotfl.methods.recipes import trained_local_model
from oneshotfl.models import MODELS
from oneshotfl.runner.config import ConfigError, ExperimentConfig, client_architectures
from oneshotfl.runner.evaluate import evaluate_outcome
from oneshotfl.runner.federation import ClientShard, Federation, build_federation
from oneshotfl.training.loop import accuracy, predict_logits
from oneshotfl.training.progress import NullTracker, Tracker

log = logging.getLogger(__name__)


class RequirementError(ConfigError):
    """A method needs something this federation does not provide."""


class QuorumError(RuntimeError):
    """Too few valid payloads arrived to aggregate."""


@dataclass
class Setup:
    """What the runner fixes once for all methods of a run.

    Attributes:
        trained: clients whose update trained a local model (their local accuracies go
            into the result document).
        local_stats: local accuracies that clients reported themselves (Flower nodes).
        remote_clients: the clients run elsewhere (Flower): local accuracies come only from
            their reports, never from training a client's model here.
    """

    cfg: ExperimentConfig
    federation: Federation
    archs: tuple[str, ...]
    device: torch.device
    store: ArtefactStore
    tracker: Tracker
    trained: set[int] = field(default_factory=set)
    encoder: Encoder | None = None
    local_stats: dict[int, dict[str, float]] = field(default_factory=dict)
    remote_clients: bool = False


def resolve_methods(specs: Sequence[str]) -> list[tuple[str, Method[Any]]]:
    """Parse and build every method spec, failing before any data is loaded."""
    built: list[tuple[str, Method[Any]]] = []
    for text in specs:
        spec: MethodSpec = parse_method_spec(text)
        if spec.name not in METHODS:
            raise ConfigError(
                f"unknown method {spec.name!r}; expected one of: {', '.join(METHODS.names())}"
            )
        try:
            built.append((spec.key, build_method(spec)))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    keys = [k for k, _ in built]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"methods: the same method spec is listed twice in {keys}")
    return built


def check_requirements(methods: Sequence[tuple[str, Method[Any]]], setup: Setup) -> None:
    """Raise :class:`RequirementError` listing every unmet requirement of every method."""
    cfg, problems = setup.cfg, []
    for key, method in methods:
        req = method.requires
        if req.public_data and setup.federation.public is None:
            problems.append(f"{key} needs a public unlabelled pool: set public_size > 0")
        if req.same_architecture and len(set(setup.archs)) > 1:
            problems.append(
                f"{key} needs identical client architectures, got {sorted(set(setup.archs))}"
            )
        if req.server_model and cfg.server_model is None:
            problems.append(f"{key} needs a server architecture: set server_model")
        if req.shared_encoder and setup.encoder is None:
            problems.append(f"{key} needs a shared frozen encoder: set encoder (e.g. random)")
        if req.topology is not Topology.STAR:
            problems.append(f"{key} needs a {req.topology} topology; this runner is star-only")
        if cfg.clients < req.min_clients:
            problems.append(f"{key} needs at least {req.min_clients} clients, got {cfg.clients}")
    if problems:
        raise RequirementError("cannot run: " + "; ".join(problems))


def client_context(setup: Setup, cid: int) -> ClientContext:
    """Client ``cid``'s context: its own shard and the federation's public facts."""
    return shard_context(setup, setup.federation.clients[cid])


def shard_context(setup: Setup, shard: ClientShard) -> ClientContext:
    """The context of the client that holds ``shard`` (a Flower node holds only its own)."""
    return ClientContext(
        client_id=shard.client_id,
        data=shard.train,
        val=shard.val,
        task=setup.federation.task,
        arch=setup.archs[shard.client_id],
        train_config=setup.cfg.client_train_config(),
        public=setup.federation.public,
        device=setup.device,
        seed=setup.cfg.seed,
        store=setup.store,
        tracker=setup.tracker,
        encoder=setup.encoder,
    )


def server_context(setup: Setup) -> ServerContext:
    return ServerContext(
        task=setup.federation.task,
        public=setup.federation.public,
        server_arch=setup.cfg.server_model,
        client_archs=setup.archs,
        train_config=setup.cfg.server_train_config(),
        client_train_config=setup.cfg.client_train_config(),
        num_clients=setup.cfg.clients,
        device=setup.device,
        seed=setup.cfg.seed,
        store=setup.store,
        tracker=setup.tracker,
        encoder=setup.encoder,
    )


def wire_dims(setup: Setup) -> WireDims:
    """The public facts payload shapes resolve against; ``D`` is the shared encoder's
    embedding size when the federation has one."""
    fed = setup.federation
    dims = fed.task.dims(0 if fed.public is None else len(fed.public))
    if setup.encoder is not None:
        dims = dataclasses.replace(dims, extra={"D": setup.encoder.dim})
    return dims


@dataclass(frozen=True)
class ClientReply:
    """One client's answer to one round, as it leaves the client.

    Attributes:
        client_id: the sending client.
        data: the payload bytes exactly as they cross the wire (``encode(payload)``).
        wall_s: seconds the client spent in ``client_update``.
        train_s: local training seconds a recipe recorded (``None``: this update trained
            no local model, e.g. ``centralized``).
        local_stats: the trained local model's ``local_test_accuracy`` /
            ``local_val_accuracy``, when the client computed them (Flower nodes do; the
            simulation computes them once at the end). Result-file facts, never an input
            to ``aggregate``.
    """

    client_id: int
    data: bytes
    wall_s: float
    train_s: float | None = None
    local_stats: dict[str, float] = field(default_factory=dict)


def client_step(
    method: Method[Any], ctx: ClientContext, round_index: int = 0, broadcast: Payload | None = None
) -> ClientReply:
    """The client side of one round: ``client_update`` on the client's own context, then
    serialisation. The same function runs in the simulation loop and in a Flower ClientApp."""
    ctx.round, ctx.broadcast = round_index, broadcast
    start = time.perf_counter()
    payload = method.client_update(ctx)
    wall = time.perf_counter() - start
    train = ctx.notes.get("train_seconds")
    data = encode(payload)  # what crosses the network; counted even if rejected
    return ClientReply(ctx.client_id, data, wall, None if train is None else float(train))


def encode_broadcast(
    key: str, method: Method[Any], setup: Setup, round_index: int, previous: Outcome | None
) -> bytes | None:
    """The server's message before round ``round_index`` as wire bytes (``None``: none)."""
    message = method.server_message(round_index, previous, server_context(setup))
    if message is None:
        return None
    if method.broadcast_spec(wire_dims(setup)) is None:
        raise TypeError(f"{key}: server_message returned a message but no broadcast_spec")
    return encode(message)


def receive_broadcast(method: Method[Any], data: bytes | None, dims: WireDims) -> Payload | None:
    """Decode and validate a server broadcast on the receiving side (``None`` passes)."""
    if data is None:
        return None
    spec = method.broadcast_spec(dims)
    if spec is None:
        raise WireError(f"{method.name}: received a broadcast, but the method defines none")
    return receive(data, spec, dims, None)


@dataclass
class RoundTraffic:
    """What one round of one method put on the wire, and what arrived.

    Lists are indexed by client id; a client that never replied counts 0 bytes and 0 s.
    ``missing`` names who did not reply (e.g. ``"node 42"`` or ``"client 3"``) and why.
    """

    received: dict[int, Payload]
    rejected: dict[int, str]
    upload_bytes: list[int]
    download_bytes: int
    client_wall: list[float]
    train_recorded: list[float]
    missing: dict[str, str] = field(default_factory=dict)


Exchange = Callable[[str, Method[Any], int, bytes | None], tuple[list[ClientReply], dict[str, str]]]
"""Transport of one round: ``(key, method, round, broadcast bytes) → (replies, missing)``.

``missing`` maps a party that did not reply to the reason. The simulation's exchange
(:func:`local_exchange`) calls :func:`client_step` for every client in process; the Flower
ServerApp's sends one message per node through the Grid."""


def local_exchange(setup: Setup) -> Exchange:
    """The in-process transport: every client of the federation, in client-id order."""

    def exchange(
        key: str, method: Method[Any], round_index: int, broadcast: bytes | None
    ) -> tuple[list[ClientReply], dict[str, str]]:
        received = receive_broadcast(method, broadcast, wire_dims(setup))
        replies = [
            client_step(method, client_context(setup, shard.client_id), round_index, received)
            for shard in setup.federation.clients
        ]
        return replies, {}

    return exchange


def collect_round(
    key: str,
    method: Method[Any],
    setup: Setup,
    round_index: int,
    replies: Sequence[ClientReply],
    download: int = 0,
    missing: Mapping[str, str] | None = None,
) -> RoundTraffic:
    """The server side of one round: count, decode and validate every reply in client-id
    order, record rejections, and check the quorum.

    Rejected payloads are logged and still counted in bytes. A second reply from the same
    client id, or one from an id outside the federation, is rejected.

    Raises:
        QuorumError: fewer valid payloads than ``max(min_clients, requires.min_clients)``.
    """
    n = setup.cfg.clients
    dims = wire_dims(setup)
    spec = method.payload_spec(dims)
    traffic = RoundTraffic({}, {}, [0] * n, download, [0.0] * n, [], dict(missing or {}))
    seen: set[int] = set()
    for reply in sorted(replies, key=lambda r: r.client_id):
        cid = reply.client_id
        if not 0 <= cid < n or cid in seen:
            why = "outside the federation" if not 0 <= cid < n else "a second reply"
            log.warning("%s: round %d: dropped %s from client %d", key, round_index, why, cid)
            traffic.missing.setdefault(f"client {cid}", f"{why} (client ids are 0..{n - 1})")
            continue
        seen.add(cid)
        traffic.client_wall[cid] = reply.wall_s
        traffic.train_recorded.append(0.0 if reply.train_s is None else reply.train_s)
        if reply.train_s is not None and round_index == 0:
            setup.trained.add(cid)
            setup.local_stats.setdefault(cid, {}).update(reply.local_stats)
        traffic.upload_bytes[cid] = len(reply.data) if method.communicates else 0
        try:
            traffic.received[cid] = receive(reply.data, spec, dims, cid)
        except (WireError, PayloadError) as exc:
            log.warning("%s: round %d: rejected payload: %s", key, round_index, exc)
            traffic.rejected[cid] = str(exc)
    for cid in sorted(set(range(n)) - seen):
        log.warning("%s: round %d: no reply from client %d", key, round_index, cid)
        if not any(f"(client {cid})" in name for name in traffic.missing):
            traffic.missing[f"client {cid}"] = "no reply"
    check_quorum(key, method, setup, traffic)
    return traffic


def check_quorum(key: str, method: Method[Any], setup: Setup, traffic: RoundTraffic) -> None:
    """Raise :class:`QuorumError` when too few valid payloads arrived, naming who failed."""
    quorum = max(setup.cfg.min_clients, method.requires.min_clients)
    if len(traffic.received) >= quorum:
        return
    silent = f"; no reply: {traffic.missing}" if traffic.missing else ""
    raise QuorumError(
        f"{key}: {len(traffic.received)} valid payload(s) arrived, expected at least "
        f"{quorum} (min_clients); rejected: {traffic.rejected}{silent}"
    )


def run_round(
    key: str,
    method: Method[Any],
    setup: Setup,
    round_index: int,
    previous: Outcome | None,
    exchange: Exchange | None = None,
) -> RoundTraffic:
    """One round: the server's broadcast (if any) through the wire, then every client's
    update through the transport (in process unless ``exchange`` is given)."""
    broadcast = encode_broadcast(key, method, setup, round_index, previous)
    transport = exchange or local_exchange(setup)
    replies, missing = transport(key, method, round_index, broadcast)
    download = 0 if broadcast is None else len(broadcast)
    return collect_round(key, method, setup, round_index, replies, download, missing)


def run_method(
    key: str, method: Method[Any], setup: Setup, exchange: Exchange | None = None
) -> dict[str, Any]:
    """Run one method over the federation: clients, wire, aggregate, evaluate.

    A one-shot method runs one round. A multi-round method runs ``num_rounds()`` rounds; its
    bytes and wall times are summed over rounds, its final outcome is the last round's, and
    ``rounds_history`` records the test accuracy and cumulative bytes after every round.
    ``exchange`` is the transport (default: every client in this process); the Flower
    ServerApp passes its own, so both runners share this function.
    """
    fed = setup.federation
    rounds = method.num_rounds()
    upload = np.zeros(len(fed.clients), dtype=np.int64)
    client_wall = np.zeros(len(fed.clients))
    download, server_wall, train_recorded = 0, 0.0, 0.0
    outcome: Outcome | None = None
    history: list[dict[str, Any]] = []
    rejected: dict[str, str] = {}
    missing: dict[str, str] = {}
    for r in range(rounds):
        traffic = run_round(key, method, setup, r, outcome, exchange)
        upload += np.asarray(traffic.upload_bytes, dtype=np.int64)
        client_wall += np.asarray(traffic.client_wall)
        download += traffic.download_bytes
        train_recorded += float(np.mean(traffic.train_recorded))
        rejected.update({str(k): v for k, v in traffic.rejected.items()})
        missing.update(traffic.missing)
        start = time.perf_counter()
        outcome = method.aggregate(traffic.received, server_context(setup))
        server_wall += time.perf_counter() - start
        if rounds > 1:
            metrics = evaluate_outcome(outcome, fed.test, fed.label_histograms(), setup.device)
            history.append(
                {
                    "round": r + 1,
                    "accuracy": metrics["accuracy"],
                    "upload_bytes_mean": float(upload.mean()),
                    "download_bytes": download,
                }
            )
    assert outcome is not None  # rounds >= 1
    metrics = evaluate_outcome(outcome, fed.test, fed.label_histograms(), setup.device)
    sizes = upload.tolist()
    result = {
        "key": key,
        **method.describe(),
        "outcome": type(outcome).__name__,
        **metrics,
        "rounds": rounds,
        "upload_bytes_per_client": sizes,
        "upload_bytes_mean": float(np.mean(sizes)),
        "download_bytes_per_client": download,
        "communicates": method.communicates,
        "client_wall_s": client_wall.tolist(),
        "client_wall_s_mean": float(client_wall.mean()),
        "client_train_s_mean": train_recorded,
        "server_wall_s": server_wall,
        "clients_used": sorted(traffic.received),
        "diagnostics": getattr(outcome, "info", {}),
        "rejected": rejected,
    }
    if missing:
        result["no_reply"] = missing
    if history:
        result["rounds_history"] = history
    return result


def local_accuracies(
    ctx: ClientContext, test: LabelledData, device: torch.device
) -> dict[str, float]:
    """The client's trained local model's accuracy on the test set and on its validation
    split (a memo or cache hit when a method already trained it)."""
    model = trained_local_model(ctx)
    stats = {"local_test_accuracy": accuracy(predict_logits(model, test.x, device), test.y)}
    if ctx.val is not None:
        stats["local_val_accuracy"] = accuracy(predict_logits(model, ctx.val.x, device), ctx.val.y)
    return stats


def client_stats(setup: Setup) -> list[dict[str, Any]]:
    """Per-client size, label histogram and, where a method trained it, the local model's
    accuracy on the test set and on the client's validation split.

    Accuracies a client reported itself (``setup.local_stats``, filled from Flower replies)
    are used as they came; otherwise they are computed here, in process."""
    fed, stats = setup.federation, []
    histograms = fed.label_histograms()
    for shard in fed.clients:
        row: dict[str, Any] = {
            "client": shard.client_id,
            "arch": setup.archs[shard.client_id],
            "train_size": len(shard.train),
            "val_size": 0 if shard.val is None else len(shard.val),
            "label_histogram": histograms[shard.client_id].tolist(),
        }
        stats.append(row)
        if shard.client_id not in setup.trained:
            continue
        reported = setup.local_stats.get(shard.client_id)
        if reported or setup.remote_clients:
            row.update(reported or {})
            continue
        ctx = client_context(setup, shard.client_id)
        row.update(local_accuracies(ctx, fed.test, setup.device))
    return stats


def prepare(
    cfg: ExperimentConfig, tracker: Tracker | None = None, dataset: Dataset | None = None
) -> Setup:
    """Load data and build the federation (checks config names first).

    Args:
        cfg: the experiment config.
        tracker: progress display (none by default).
        dataset: the already loaded ``cfg.dataset`` (a Flower node serving several virtual
            clients reuses it); loaded from ``cfg.data_root`` when ``None``.
    """
    archs = client_architectures(cfg.model, cfg.clients)
    for arch in {*archs, *([cfg.server_model] if cfg.server_model else [])}:
        if arch not in MODELS:
            raise ConfigError(
                f"unknown model {arch!r}; expected one of: {', '.join(MODELS.names())}"
            )
    if dataset is None:
        dataset = load_dataset(cfg.dataset, cfg.data_root, cfg.download)
    federation = build_federation(dataset, cfg)
    store = ArtefactStore(Path(cfg.cache_dir) if cfg.cache_dir else None)
    device = resolve_device(cfg.device)
    encoder = None
    if cfg.encoder:
        public = None if federation.public is None else federation.public.x
        try:
            encoder = build_encoder(
                cfg.encoder, federation.task, cfg.seed, public=public, store=store, device=device
            )
        except EncoderError as exc:
            raise ConfigError(str(exc)) from None
    return Setup(
        cfg,
        federation,
        archs,
        device,
        store,
        tracker or NullTracker(),
        encoder=encoder,
    )


def run_experiment(cfg: ExperimentConfig, tracker: Tracker | None = None) -> dict[str, Any]:
    """Run every configured method on one federation; return the result document."""
    started, t0 = datetime.now(UTC), time.perf_counter()
    methods = resolve_methods(cfg.methods)
    setup = prepare(cfg, tracker)
    check_requirements(methods, setup)
    results = []
    for key, method in methods:
        log.info("running %s", key)
        results.append(run_method(key, method, setup))
    return result_document(setup, results, started, t0)


def result_document(
    setup: Setup, results: list[dict[str, Any]], started: datetime, t0: float
) -> dict[str, Any]:
    """The result document of a run: config, environment, data, clients, methods, cache.

    Args:
        setup: the run's setup.
        results: one :func:`run_method` result per method, in run order.
        started: when the run started (UTC).
        t0: ``time.perf_counter()`` at the start, for the wall time.
    """
    cfg, fed = setup.cfg, setup.federation
    return {
        "oneshotfl_version": oneshotfl.__version__,
        "started": started.isoformat(timespec="seconds"),
        "wall_time_s": time.perf_counter() - t0,
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "device": str(setup.device),
            "threads": torch.get_num_threads(),
        },
        "config": cfg.to_dict(),
        "encoder": None
        if setup.encoder is None
        else {
            "spec": setup.encoder.spec,
            "fingerprint": setup.encoder.fingerprint,
            "dim": setup.encoder.dim,
            **setup.encoder.info,
        },
        "data": {
            "dataset": fed.task.dataset,
            "num_classes": fed.task.num_classes,
            "input_shape": [fed.task.in_channels, fed.task.image_size, fed.task.image_size],
            "client_examples": int(sum(len(c.train) for c in fed.clients)),
            "public_size": 0 if fed.public is None else len(fed.public),
            "test_size": len(fed.test),
        },
        "clients": client_stats(setup),
        "methods": results,
        "cache": {"hits": setup.store.hits, "misses": setup.store.misses},
    }
