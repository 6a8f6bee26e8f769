"""The local simulation runner: one process plays every client and the server.

It owns everything a method does not: checking ``requires`` before any training, the seed
streams, the loop over clients, the wire (every payload is serialised, counted, decoded and
validated exactly as over a network), calling ``aggregate``, evaluation, the artefact cache
and the result document. Methods run in the order given and share trained client artefacts.
"""

from __future__ import annotations

import dataclasses
import logging
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

import oneshotfl
from oneshotfl.data.datasets import load_dataset
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
from oneshotfl.runner.federation import Federation, build_federation
from oneshotfl.training.loop import accuracy, predict_logits
from oneshotfl.training.progress import NullTracker, Tracker

log = logging.getLogger(__name__)


class RequirementError(ConfigError):
    """A method needs something this federation does not provide."""


class QuorumError(RuntimeError):
    """Too few valid payloads arrived to aggregate."""


@dataclass
class Setup:
    """What the runner fixes once for all methods of a run."""

    cfg: ExperimentConfig
    federation: Federation
    archs: tuple[str, ...]
    device: torch.device
    store: ArtefactStore
    tracker: Tracker
    trained: set[int] = field(default_factory=set)
    encoder: Encoder | None = None


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
    shard = setup.federation.clients[cid]
    return ClientContext(
        client_id=cid,
        data=shard.train,
        val=shard.val,
        task=setup.federation.task,
        arch=setup.archs[cid],
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


@dataclass
class RoundTraffic:
    """What one round of one method put on the wire, and what arrived."""

    received: dict[int, Payload]
    rejected: dict[int, str]
    upload_bytes: list[int]
    download_bytes: int
    client_wall: list[float]
    train_recorded: list[float]


def run_round(
    key: str, method: Method[Any], setup: Setup, round_index: int, previous: Outcome | None
) -> RoundTraffic:
    """One round: the server's broadcast (if any) through the wire, then every client's
    update through the wire. Rejected payloads are logged and still counted in bytes."""
    fed = setup.federation
    dims = wire_dims(setup)
    spec = method.payload_spec(dims)
    broadcast, download = None, 0
    message = method.server_message(round_index, previous, server_context(setup))
    if message is not None:
        broadcast_spec = method.broadcast_spec(dims)
        if broadcast_spec is None:
            raise TypeError(f"{key}: server_message returned a message but no broadcast_spec")
        data = encode(message)
        download = len(data)
        broadcast = receive(data, broadcast_spec, dims, None)
    traffic = RoundTraffic({}, {}, [], download, [], [])
    for shard in fed.clients:
        ctx = client_context(setup, shard.client_id)
        ctx.round, ctx.broadcast = round_index, broadcast
        start = time.perf_counter()
        payload = method.client_update(ctx)
        traffic.client_wall.append(time.perf_counter() - start)
        traffic.train_recorded.append(float(ctx.notes.get("train_seconds", 0.0)))
        if "train_seconds" in ctx.notes and round_index == 0:
            setup.trained.add(shard.client_id)
        data = encode(payload)  # what would cross the network; counted even if rejected
        traffic.upload_bytes.append(len(data) if method.communicates else 0)
        try:
            traffic.received[shard.client_id] = receive(data, spec, dims, shard.client_id)
        except (WireError, PayloadError) as exc:
            log.warning("%s: round %d: rejected payload: %s", key, round_index, exc)
            traffic.rejected[shard.client_id] = str(exc)
    quorum = max(setup.cfg.min_clients, method.requires.min_clients)
    if len(traffic.received) < quorum:
        raise QuorumError(
            f"{key}: {len(traffic.received)} valid payload(s) arrived, expected at least "
            f"{quorum} (min_clients); rejected: {traffic.rejected}"
        )
    return traffic


def run_method(key: str, method: Method[Any], setup: Setup) -> dict[str, Any]:
    """Run one method over the federation: clients, wire, aggregate, evaluate.

    A one-shot method runs one round. A multi-round method runs ``num_rounds()`` rounds; its
    bytes and wall times are summed over rounds, its final outcome is the last round's, and
    ``rounds_history`` records the test accuracy and cumulative bytes after every round.
    """
    fed = setup.federation
    rounds = method.num_rounds()
    upload = np.zeros(len(fed.clients), dtype=np.int64)
    client_wall = np.zeros(len(fed.clients))
    download, server_wall, train_recorded = 0, 0.0, 0.0
    outcome: Outcome | None = None
    history: list[dict[str, Any]] = []
    rejected: dict[str, str] = {}
    for r in range(rounds):
        traffic = run_round(key, method, setup, r, outcome)
        upload += np.asarray(traffic.upload_bytes, dtype=np.int64)
        client_wall += np.asarray(traffic.client_wall)
        download += traffic.download_bytes
        train_recorded += float(np.mean(traffic.train_recorded))
        rejected.update({str(k): v for k, v in traffic.rejected.items()})
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
    if history:
        result["rounds_history"] = history
    return result


def client_stats(setup: Setup) -> list[dict[str, Any]]:
    """Per-client size, label histogram and, where a method trained it, the local model's
    accuracy on the test set and on the client's validation split."""
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
        model = trained_local_model(client_context(setup, shard.client_id))  # a memo hit
        row["local_test_accuracy"] = accuracy(
            predict_logits(model, fed.test.x, setup.device), fed.test.y
        )
        if shard.val is not None:
            row["local_val_accuracy"] = accuracy(
                predict_logits(model, shard.val.x, setup.device), shard.val.y
            )
    return stats


def prepare(cfg: ExperimentConfig, tracker: Tracker | None = None) -> Setup:
    """Load data and build the federation (checks config names first)."""
    archs = client_architectures(cfg.model, cfg.clients)
    for arch in {*archs, *([cfg.server_model] if cfg.server_model else [])}:
        if arch not in MODELS:
            raise ConfigError(
                f"unknown model {arch!r}; expected one of: {', '.join(MODELS.names())}"
            )
    dataset = load_dataset(cfg.dataset, cfg.data_root, cfg.download)
    federation = build_federation(dataset, cfg)
    store = ArtefactStore(Path(cfg.cache_dir) if cfg.cache_dir else None)
    encoder = None
    if cfg.encoder:
        try:
            encoder = build_encoder(cfg.encoder, federation.task, cfg.seed)
        except EncoderError as exc:
            raise ConfigError(str(exc)) from None
    return Setup(
        cfg,
        federation,
        archs,
        resolve_device(cfg.device),
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
    fed = setup.federation
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
